"""Which implementation of an op runs: a compiled kernel of ``mmlinattn._ext`` or the reference.

The extension registers its kernels with the PyTorch dispatcher as ``torch.ops.mmlinattn.<name>``
(CPU and, when built with CUDA, CUDA); ``library.py`` adds their fake (meta) kernels and autograd
formulas, so ``torch.compile``, ``torch.export`` and ``torch.library.opcheck`` see them as ordinary
operators. Every op also has a pure-PyTorch reference (``reference.py``).

:func:`choose` decides per call, from the device type and dtype only (no tensor values):

- ``MMLINATTN_OPS=reference`` forces the reference; ``MMLINATTN_OPS=compiled`` makes a missing
  kernel an error; the default, ``auto``, falls back to the reference and says why, once per
  process and reason, with a :class:`FallbackWarning` (the extension is not built, has no kernel
  for the device, or the kernel has no variant for the dtype).
- A kernel runs in a dtype it declares (:data:`KERNEL_DTYPES`); another input dtype runs in its
  compute dtype (fp32) when the kernel has that, and the result is cast back.

Under ``torch.compile`` / ``torch.export`` the decision is taken once while tracing (it is a
constant of the graph): changing ``MMLINATTN_OPS`` afterwards does not affect a compiled graph.
"""
import importlib
import os
import warnings
from typing import Dict, Optional, Tuple

import torch

from .torch_compat import missing_library_api
from .validation import compute_dtype

MODES = ('auto', 'reference', 'compiled')
# op -> device type -> the dtypes its compiled kernel takes.
KERNEL_DTYPES: Dict[str, Dict[str, Tuple[torch.dtype, ...]]] = {
    'laplacian_kernel': {'cpu': (torch.float32, torch.float64),
                         'cuda': (torch.float32, torch.float16, torch.bfloat16)},
    'newton_schulz_inverse': {'cpu': (torch.float32, torch.float64),
                              'cuda': (torch.float32, torch.float64)},
    'polarity_linear_attention': {'cpu': (torch.float32, torch.float64),
                                  'cuda': (torch.float32, torch.float16, torch.bfloat16)},
}
# op -> the registered forward operator whose per-device kernels are looked up.
FORWARD_OPERATORS = {
    'laplacian_kernel': 'laplacian_kernel_forward',
    'newton_schulz_inverse': 'newton_schulz_inverse',
    'polarity_linear_attention': 'polarity_linear_attention_forward',
}


class FallbackWarning(UserWarning):
    """An op runs its pure-PyTorch reference instead of a compiled kernel (said once per reason)."""


def _load_extension() -> Optional[str]:
    """Load ``mmlinattn._ext`` and register the fake kernels and autograd; why not, if it fails."""
    missing_api = missing_library_api()
    if missing_api:
        return f'the extension mmlinattn._ext is not used: {missing_api}'
    try:
        importlib.import_module('mmlinattn._ext')
    except ImportError as err:  # not built, or built against another torch
        return (f'the extension mmlinattn._ext is not built ({err}); build it with '
                '`pip install -e . --no-build-isolation`')
    from . import library
    missing = library.missing_operators()
    if missing:
        return (f'the extension mmlinattn._ext was built from other sources (it lacks the operators '
                f'{", ".join(missing)}); rebuild it with `pip install -e . --no-build-isolation`')
    library.register()
    return None


_EXTENSION_ERROR = _load_extension()
_warned = set()


def extension_loaded() -> bool:
    return _EXTENSION_ERROR is None


def ops_mode() -> str:
    mode = os.getenv('MMLINATTN_OPS', 'auto').strip().lower() or 'auto'
    if mode not in MODES:
        raise ValueError(f'MMLINATTN_OPS must be one of {MODES}, got {mode!r}')
    return mode


def has_kernel(op: str, device_type: str) -> bool:
    """Whether the extension has a kernel of ``op`` (a key of :data:`KERNEL_DTYPES`) for the
    device type ('cpu' / 'cuda')."""
    key = {'cpu': 'CPU', 'cuda': 'CUDA'}.get(device_type)
    return (extension_loaded() and key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(
        f'mmlinattn::{FORWARD_OPERATORS[op]}', key))


def extension_status() -> str:
    """One line for logs: which compiled backends are present, or why none is."""
    if not extension_loaded():
        return f'not loaded: {_EXTENSION_ERROR}; the pure-PyTorch reference ops run'
    backends = ['CPU'] + (['CUDA'] if has_kernel('laplacian_kernel', 'cuda') else [])
    return 'compiled (' + ', '.join(backends) + ')'


def kernel_dtype(op: str, device_type: str, dtype: torch.dtype) -> Optional[torch.dtype]:
    """The dtype ``op``'s kernel runs in for ``dtype`` inputs: ``dtype`` itself when the kernel
    takes it, else its compute dtype if the kernel takes that, else None."""
    supported = KERNEL_DTYPES[op].get(device_type, ())
    if dtype in supported:
        return dtype
    return compute_dtype(dtype) if compute_dtype(dtype) in supported else None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace('torch.', '')


def _fallback_reason(op: str, device_type: str, dtype: torch.dtype) -> Optional[str]:
    if not extension_loaded():
        return _EXTENSION_ERROR
    if device_type not in KERNEL_DTYPES[op]:
        return f'{op} has no compiled kernel for device {device_type!r}'
    if not has_kernel(op, device_type):
        return (f'the extension was built without {device_type.upper()} kernels (rebuild with '
                'FORCE_CUDA=1)')
    if kernel_dtype(op, device_type, dtype) is None:
        names = ', '.join(_dtype_name(d) for d in KERNEL_DTYPES[op][device_type])
        return f'{op} on {device_type} has kernels for {names}, not {_dtype_name(dtype)}'
    return None


@torch.compiler.assume_constant_result
def choose(op: str, device_type: str, dtype: torch.dtype) -> str:
    """``'compiled'`` or ``'reference'`` for ``op`` on inputs of ``dtype`` on ``device_type``.

    Decided from the mode, the extension and the kernels' declarations only, so the result is a
    constant of a compiled graph. A fallback in ``auto`` mode warns once per reason.
    """
    mode = ops_mode()
    if mode == 'reference':
        return 'reference'
    reason = _fallback_reason(op, device_type, dtype)
    if reason is None:
        return 'compiled'
    if mode == 'compiled':
        raise RuntimeError(f'MMLINATTN_OPS=compiled but {reason}')
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f'mmlinattn: {reason}; {op} runs its pure-PyTorch reference (slower, more '
                      'memory). Said once per process.', FallbackWarning, stacklevel=4)
    return 'reference'
