// The Python module object of mmlinattn._ext. The ops themselves register with the PyTorch
// dispatcher (TORCH_LIBRARY_FRAGMENT(mmlinattn, ...) in each op's folder) and are called as
// torch.ops.mmlinattn.<name>; importing this module loads the shared library that holds them.
#include <Python.h>

static struct PyModuleDef ext_module = {PyModuleDef_HEAD_INIT, "_ext",
                                        "Compiled ops of mmlinattn (see torch.ops.mmlinattn).", -1,
                                        nullptr};

PyMODINIT_FUNC PyInit__ext(void) { return PyModule_Create(&ext_module); }
