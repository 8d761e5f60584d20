"""What mmdeploy 1.3 needs to export and run this project's models, as context managers.

- **The TorchScript exporter.** torch >= 2.9 makes ``torch.onnx.export`` default to the dynamo
  exporter; mmdeploy's rewriters (function, module and symbolic rewriters) patch the TorchScript
  exporter's tracing, and fail under dynamo ("Detected mismatch between the structure of inputs and
  dynamic_shapes"). :func:`torchscript_onnx_export` makes ``dynamo=False`` the default while mmdeploy
  exports.
- **A symbolic helper torch removed.** mmdeploy's RoIAlign symbolic for onnxruntime (Mask R-CNN)
  imports ``torch.onnx.symbolic_opset9._cast_Long``, which torch 2.9 removed;
  :func:`torch_symbolic_helpers` provides it (a ``Cast`` to int64) while mmdeploy exports.
- **Our ops in their exportable form.** While exporting, every custom op runs its reference (standard
  ONNX operators), except the Laplacian kernel, which by default becomes one
  ``mmlinattn::LaplacianKernel`` node for the project's onnxruntime op library. A deploy config
  chooses with ``mmlinattn_export = dict(laplacian_kernel='custom_op' | 'standard_ops')``
  (default ``'custom_op'``); ``'standard_ops'`` runs in any onnxruntime without the library.
- **The op library in mmdeploy's onnxruntime sessions.** mmdeploy's ``ORTWrapper`` loads its own op
  library (``libmmdeploy_onnxruntime_ops.so``: RoIAlign, NMS, ...) into each session;
  :func:`onnxruntime_sessions` adds ours, and an intra-op thread count, to the sessions it creates.

Nothing is patched on import; each context restores what it changed.
"""
import contextlib
import functools
import inspect
import types
from typing import Iterator, Optional

import torch

from ..ops.dispatch import forced
from ..ops.laplacian_kernel.onnx import export_as_custom_node
from .onnxruntime import session_options

EXPORT_KEY = 'mmlinattn_export'
LAPLACIAN_FORMS = ('custom_op', 'standard_ops')


def laplacian_kernel_form(deploy_cfg) -> str:
    """The deploy config's ``mmlinattn_export.laplacian_kernel``: ``'custom_op'`` (default) or
    ``'standard_ops'``."""
    form = (deploy_cfg.get(EXPORT_KEY) or {}).get('laplacian_kernel', 'custom_op')
    if form not in LAPLACIAN_FORMS:
        raise ValueError(f'{EXPORT_KEY}.laplacian_kernel must be one of {LAPLACIAN_FORMS}, got {form!r}')
    return form


@contextlib.contextmanager
def torchscript_onnx_export() -> Iterator[None]:
    """``torch.onnx.export`` with ``dynamo=False`` as its default, for the duration."""
    export = torch.onnx.export
    if 'dynamo' not in inspect.signature(export).parameters:  # torch without the dynamo exporter
        yield
        return
    torch.onnx.export = functools.wraps(export)(functools.partial(export, dynamo=False))
    try:
        yield
    finally:
        torch.onnx.export = export


def _cast_long(g, input, non_blocking):
    """``_cast_Long`` as torch <= 2.8 had it: ``input`` cast to int64."""
    return g.op('Cast', input, to_i=torch._C._onnx.TensorProtoDataType.INT64)


@contextlib.contextmanager
def torch_symbolic_helpers() -> Iterator[None]:
    """``torch.onnx.symbolic_opset9._cast_Long`` where this torch lacks it, for the duration."""
    from torch.onnx import symbolic_opset9
    if hasattr(symbolic_opset9, '_cast_Long'):
        yield
        return
    symbolic_opset9._cast_Long = _cast_long
    try:
        yield
    finally:
        del symbolic_opset9._cast_Long


@contextlib.contextmanager
def mmdeploy_export(deploy_cfg) -> Iterator[None]:
    """The context for mmdeploy's ``torch2onnx`` of a model with this project's backbones."""
    form = laplacian_kernel_form(deploy_cfg)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torchscript_onnx_export())
        stack.enter_context(torch_symbolic_helpers())
        stack.enter_context(forced('reference'))
        if form == 'custom_op':
            stack.enter_context(export_as_custom_node())
        yield


class _OnnxruntimeWithOurOps(types.ModuleType):
    """``onnxruntime`` as mmdeploy's wrapper module sees it: ``SessionOptions()`` comes with the
    project's op library (where built) and the thread count."""

    def __init__(self, onnxruntime, threads: Optional[int]):
        super().__init__(onnxruntime.__name__)
        self._onnxruntime, self._threads = onnxruntime, threads

    def __getattr__(self, name):
        return getattr(self._onnxruntime, name)

    def SessionOptions(self):  # noqa: N802 (onnxruntime's name)
        return session_options(self._threads, ops_library=None)


@contextlib.contextmanager
def onnxruntime_sessions(threads: Optional[int] = None) -> Iterator[None]:
    """mmdeploy's onnxruntime sessions load the project's op library and use ``threads`` intra-op
    threads (``None``: onnxruntime's default), for the duration."""
    from mmdeploy.backend.onnxruntime import wrapper
    saved = wrapper.ort
    wrapper.ort = _OnnxruntimeWithOurOps(saved, threads)
    try:
        yield
    finally:
        wrapper.ort = saved
