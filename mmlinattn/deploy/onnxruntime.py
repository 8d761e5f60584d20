"""The project's onnxruntime custom-op library (``ops/onnxruntime``): where it is, and session
options that load it.

The library registers the domain ``mmlinattn`` with ``LaplacianKernel`` (see
:mod:`mmlinattn.ops.laplacian_kernel.onnx`). It is built with the extension when onnxruntime's API
headers are found (``setup.py``); models exported with standard operators only need no library.
"""
import os
from typing import Optional

LIBRARY_NAME = 'libmmlinattn_onnxruntime_ops.so'


def ops_library_path() -> Optional[str]:
    """The library's path, or ``None`` where this install was built without it."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), LIBRARY_NAME)
    return path if os.path.isfile(path) else None


def require_ops_library() -> str:
    """:func:`ops_library_path`, or a ``RuntimeError`` saying how to build the library."""
    path = ops_library_path()
    if path is None:
        raise RuntimeError(
            f'mmlinattn was built without its onnxruntime op library ({LIBRARY_NAME}), which a model '
            'exported with mmlinattn::LaplacianKernel nodes needs. Rebuild with '
            'ONNXRUNTIME_INCLUDE_DIR=<folder with onnxruntime_cxx_api.h> (docs/deployment.md), or '
            'export with a deploy config that sets laplacian_kernel=\'standard_ops\'.')
    return path


def session_options(threads: Optional[int] = None, ops_library: Optional[bool] = True):
    """``onnxruntime.SessionOptions`` with ``threads`` intra-op threads (``None``: onnxruntime's
    default) and the op library: registered (``True``; a ``RuntimeError`` where it is not built),
    registered where it is built (``None``: sessions of graphs that may not need it) or not
    (``False``)."""
    import onnxruntime
    options = onnxruntime.SessionOptions()
    if ops_library or (ops_library is None and ops_library_path() is not None):
        options.register_custom_ops_library(require_ops_library())
    if threads is not None:
        options.intra_op_num_threads = threads
    return options
