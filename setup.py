"""Build and install mmlinattn with its compiled ops, ``mmlinattn._ext``.

Build against the torch you run, without build isolation (``pip install [-e] . --no-build-isolation``
or ``pip wheel . --no-build-isolation``): the extension links that torch, and a build-isolated pip
would compile against a different one.

- The C++ (CPU) sources under ``ops/csrc`` are always compiled; the CUDA sources (``*.cu``) are added
  when ``torch.cuda.is_available()`` or ``FORCE_CUDA=1`` (``TORCH_CUDA_ARCH_LIST`` is honoured).
- Host compiler and nvcc use the C++ standard that the installed torch's headers require
  (:func:`cxx_standard`).
- ``configs/`` (with its metafiles), the user's tools (``MIM_TOOLS``) and ``model-index.yml`` ship as
  ``mmlinattn/.mim/{configs,tools,model-index.yml}`` (the OpenMMLab layout that ``mim`` reads; ``mim
  search mmlinattn`` reads the model index): copied into wheels and non-editable installs, symlinked for
  an editable install. The developers' and CI's scripts and the benchmark cases (``tools/dev/``) do not.
- The onnxruntime custom-op library ``mmlinattn/libmmlinattn_onnxruntime_ops.so`` (sources in
  ``ops/onnxruntime`` plus the Laplacian kernel's plain-C++ CPU kernels) is built when
  ``ONNXRUNTIME_INCLUDE_DIR`` names a folder with onnxruntime's C/C++ API headers
  (``onnxruntime_cxx_api.h``; the pip wheel of onnxruntime has none, ``tools/dev/setup_env.sh``
  fetches them). It links neither torch nor onnxruntime: onnxruntime hands it its API on loading.
- ``MMLINATTN_SKIP_EXT=1`` installs the Python package only (the set-up script uses it after
  restoring a cached build of the extension).
"""
import os
import re
import shutil
from glob import glob

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join('ops', 'csrc')
ORT_OPS = 'mmlinattn.libmmlinattn_onnxruntime_ops'
# The torch extension's plain-C++ kernels that the onnxruntime op library runs too.
ORT_SHARED_SOURCES = ('laplacian_kernel/laplacian_kernel_portable.cpp',
                      'laplacian_kernel/laplacian_kernel_avx512.cpp')
# What ships as mmlinattn/.mim/tools: the commands users run and the modules they import (configs/ ships
# whole as .mim/configs; tools/dev/ stays in the repository). A new user tool is added here.
MIM_TOOLS = ('train.py', 'test.py', 'dist_train.sh', 'dist_test.sh', 'get_flops.py', 'convert_checkpoint.py',
             'export_onnx.py', 'deploy.py', 'deploy_test.py', 'visualize_attention.py', 'benchmark.py',
             '_common.py', '_toy_overlay.py', 'analysis', 'misc')  # a folder ships whole: misc/download_dataset.py
# torch 2.14.0 is the first release whose ATen/ATen.h and torch/all.h `#error` below C++20; up to
# 2.13 they accept C++17 (checked in the headers of the 2.12.1, 2.13.0 and 2.14.0 wheels).
CXX20_SINCE_TORCH = (2, 14)


def read_version():
    namespace = {}
    with open(os.path.join(ROOT, 'mmlinattn', 'version.py')) as f:
        exec(f.read(), namespace)
    return namespace['__version__']


def cxx_standard(torch_version: str) -> str:
    """``'c++20'`` for a torch whose headers require it, else ``'c++17'`` (torch >= 2.0's minimum)."""
    match = re.match(r'(\d+)\.(\d+)', torch_version)
    if match is None:
        raise ValueError(f'cannot read a torch version from {torch_version!r}')
    major_minor = (int(match.group(1)), int(match.group(2)))
    return 'c++20' if major_minor >= CXX20_SINCE_TORCH else 'c++17'


def _remove(path):
    if os.path.islink(path) or os.path.isfile(path):
        os.remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _place(src, dst, link):
    """Put ``src`` (a file or folder) at ``dst``: a relative symlink, or a copy without bytecode."""
    _remove(dst)
    if link:
        os.symlink(os.path.relpath(src, os.path.dirname(dst)), dst)
    elif os.path.isdir(src):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    else:
        shutil.copy2(src, dst)


class BuildPyWithMim(build_py):
    """build_py that also lays out ``mmlinattn/.mim``: a copy of ``configs/``, ``model-index.yml`` and
    the ``MIM_TOOLS`` in the build tree (wheels, ``pip install .``), relative symlinks in the source tree
    for an editable install (PEP 660 runs build_py with ``editable_mode``; the package is imported from
    the source)."""

    def run(self):
        super().run()
        if self.editable_mode:
            self._lay_out(os.path.join(ROOT, 'mmlinattn', '.mim'), link=True)
        else:
            self._lay_out(os.path.join(self.build_lib, 'mmlinattn', '.mim'), link=False)

    @staticmethod
    def _lay_out(mim_dir, link):
        tools_dir = os.path.join(mim_dir, 'tools')
        _remove(tools_dir)  # a real folder of MIM_TOOLS entries, also for an editable install
        os.makedirs(tools_dir)
        _place(os.path.join(ROOT, 'configs'), os.path.join(mim_dir, 'configs'), link)
        # next to .mim/configs, as in the checkout: its Import and Config paths start with configs/
        _place(os.path.join(ROOT, 'model-index.yml'), os.path.join(mim_dir, 'model-index.yml'), link)
        for name in MIM_TOOLS:
            _place(os.path.join(ROOT, 'tools', name), os.path.join(tools_dir, name), link)


def extension_modules():
    if os.getenv('MMLINATTN_SKIP_EXT', '0') == '1':
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
    except ImportError as err:
        raise SystemExit(
            f'mmlinattn: building the extension needs torch in the build environment ({err}). '
            'Install torch first and build without isolation: '
            'pip install --no-build-isolation . (or -e .)') from err

    std = '-std=' + cxx_standard(torch.__version__)
    cpp_sources = sorted(glob(os.path.join(CSRC, '**', '*.cpp'), recursive=True))
    cuda_sources = sorted(glob(os.path.join(CSRC, '**', '*.cu'), recursive=True))
    with_cuda = torch.cuda.is_available() or os.getenv('FORCE_CUDA', '0') == '1'
    common = dict(
        name='mmlinattn._ext',
        include_dirs=[os.path.join(ROOT, CSRC)],
        extra_link_args=['-fopenmp'])
    cxx_flags = [std, '-O3', '-fopenmp']
    if with_cuda:
        ext = CUDAExtension(
            sources=cpp_sources + cuda_sources,
            define_macros=[('MMLINATTN_WITH_CUDA', None)],
            extra_compile_args={
                'cxx': cxx_flags,
                'nvcc': [std, '-O3', '--use_fast_math', '--expt-relaxed-constexpr'],
            },
            **common)
    else:
        ext = CppExtension(sources=cpp_sources, extra_compile_args={'cxx': cxx_flags}, **common)
    extensions = [ext] + onnxruntime_ops_library(std)

    class BuildExtensions(BuildExtension.with_options(use_ninja=True)):
        """torch's builder; the onnxruntime op library keeps a plain ``lib*.so`` name (it is loaded
        by path, never imported)."""

        def get_ext_filename(self, fullname):  # called with the full name and the last part
            if ORT_OPS.endswith(fullname):
                return os.path.join(*fullname.split('.')) + '.so'
            return super().get_ext_filename(fullname)

    return extensions, {'build_ext': BuildExtensions}


def onnxruntime_ops_library(std):
    """The onnxruntime custom-op library, where ``ONNXRUNTIME_INCLUDE_DIR`` has the API headers."""
    include = os.getenv('ONNXRUNTIME_INCLUDE_DIR')
    if not include:
        return []
    if not os.path.isfile(os.path.join(include, 'onnxruntime_cxx_api.h')):
        raise SystemExit(f'mmlinattn: ONNXRUNTIME_INCLUDE_DIR={include} has no onnxruntime_cxx_api.h')
    sources = sorted(glob(os.path.join('ops', 'onnxruntime', '*.cpp')))
    sources += [os.path.join(CSRC, path) for path in ORT_SHARED_SOURCES]
    return [Extension(ORT_OPS, sources=sources, include_dirs=[include, os.path.join(ROOT, CSRC)],
                      extra_compile_args=[std, '-O3', '-fopenmp-simd', '-fvisibility=hidden'],
                      language='c++')]


ext_modules, ext_cmdclass = extension_modules()

setup(
    name='mmlinattn',
    version=read_version(),
    description='LaplacianFormer and PolaFormer linear-attention backbones and fused ops for OpenMMLab',
    long_description=open(os.path.join(ROOT, 'README.md')).read() if os.path.exists(
        os.path.join(ROOT, 'README.md')) else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmlinattn', 'mmlinattn.*']),
    python_requires='>=3.9,<3.12',
    # What `import mmlinattn` imports; mmcv 2.0/2.1 is the range mmdet 3.3 and mmseg 1.2 accept.
    install_requires=['torch>=2.1', 'mmengine>=0.10.0,<1.0.0', 'mmcv>=2.0.0,<2.2.0'],
    extras_require={
        'det': ['mmdet==3.3.0', 'pycocotools'],
        'seg': ['mmsegmentation==1.2.2', 'ftfy', 'regex'],
        'cls': ['mmpretrain==1.2.0'],
        # mmdeploy itself goes in with --no-deps (its protobuf<=3.20.2 pin cannot live beside onnx):
        # what its onnxruntime path imports, and the runtime (docs/deployment.md)
        'deploy': ['onnx', 'onnxruntime>=1.21', 'aenum', 'multiprocess', 'prettytable', 'terminaltables'],
    },
    ext_modules=ext_modules,
    cmdclass={'build_py': BuildPyWithMim, **ext_cmdclass},
    zip_safe=False,
)
