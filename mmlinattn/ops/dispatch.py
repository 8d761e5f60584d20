"""Pick the implementation of an op: the compiled extension (CUDA or CPU kernels) or the reference.

Every op in :mod:`mmlinattn.ops` has a pure-PyTorch reference (``reference.py``) and compiled
kernels registered with the PyTorch dispatcher as ``torch.ops.mmlinattn.<name>`` by the extension
``mmlinattn._ext``. :func:`choose` says which one runs for given inputs, and why:

- ``MMLINATTN_OPS=reference`` forces the reference; ``MMLINATTN_OPS=compiled`` makes a missing
  kernel an error instead of a fallback; the default, ``auto``, falls back to the reference.
- When the extension is not built, one warning says so (once per process) and the reference runs.
- A kernel is used only for the devices and dtypes it declares; otherwise the reason is returned.
"""
import importlib
import os
import warnings
from typing import Dict, Optional, Sequence, Tuple

import torch

_MODES = ('auto', 'reference', 'compiled')
_state = {'loaded': None, 'error': None, 'warned': set()}


def _load_extension() -> bool:
    if _state['loaded'] is None:
        try:
            importlib.import_module('mmlinattn._ext')
            _state['loaded'] = True
        except ImportError as err:  # not built, or built against another torch
            _state['loaded'], _state['error'] = False, str(err)
    return _state['loaded']


def ops_mode() -> str:
    mode = os.getenv('MMLINATTN_OPS', 'auto').strip().lower() or 'auto'
    if mode not in _MODES:
        raise ValueError(f'MMLINATTN_OPS must be one of {_MODES}, got {mode!r}')
    return mode


def has_kernel(op_name: str, device_type: str) -> bool:
    """Whether ``torch.ops.mmlinattn.<op_name>`` has a kernel for ``device_type`` ('cpu'/'cuda')."""
    if not _load_extension():
        return False
    key = {'cpu': 'CPU', 'cuda': 'CUDA'}.get(device_type)
    qualname = f'mmlinattn::{op_name}'
    return (key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key))


def extension_status() -> str:
    """One line for logs: which compiled backends are present, or why none is."""
    if not _load_extension():
        return f'not built ({_state["error"]}); the pure-PyTorch reference ops run'
    backends = ['CPU'] + (['CUDA'] if _cuda_compiled() else [])
    return 'compiled (' + ', '.join(backends) + ')'


def _cuda_compiled() -> bool:
    ext = importlib.import_module('mmlinattn._ext')
    lib = getattr(ext, '__file__', '') or ''
    # The CUDA build links libcudart; a CPU-only build does not contain any CUDA kernel symbols.
    return any(
        torch._C._dispatch_has_kernel_for_dispatch_key(f'mmlinattn::{name}', 'CUDA')
        for name in _registered_ops()) if lib else False


def _registered_ops() -> Sequence[str]:
    return [
        name.split('::', 1)[1] for name in torch._C._dispatch_get_all_op_names()
        if name.startswith('mmlinattn::')
    ]


def _warn_once(key: str, message: str) -> None:
    if key not in _state['warned']:
        _state['warned'].add(key)
        warnings.warn(message, stacklevel=3)


def choose(op_name: str, tensor: torch.Tensor,
           supported: Dict[str, Tuple[torch.dtype, ...]]) -> Tuple[str, str]:
    """Return ``('compiled' | 'reference', reason)`` for an op on ``tensor``'s device and dtype.

    ``supported`` maps a device type to the dtypes the compiled kernel accepts, e.g.
    ``{'cpu': (torch.float32, torch.float64), 'cuda': (torch.float32, torch.float16, torch.bfloat16)}``.
    """
    mode = ops_mode()
    if mode == 'reference':
        return 'reference', 'MMLINATTN_OPS=reference'
    reason: Optional[str] = None
    device_type = tensor.device.type
    if not _load_extension():
        reason = f'the extension mmlinattn._ext is not built ({_state["error"]})'
        if mode == 'auto':
            _warn_once('no-ext', f'mmlinattn: {reason}; using the pure-PyTorch reference ops '
                       '(slower, more memory). Build it with `pip install -e . --no-build-isolation`.')
    elif device_type not in supported:
        reason = f'{op_name} has no compiled kernel for device {device_type!r}'
    elif not has_kernel(op_name, device_type):
        reason = (f'the extension was built without {device_type.upper()} kernels '
                  f'(rebuild with FORCE_CUDA=1 for CUDA)')
        if mode == 'auto':
            _warn_once(f'no-{device_type}', f'mmlinattn: {reason}; using the reference ops.')
    elif tensor.dtype not in supported[device_type]:
        names = ', '.join(str(d).replace('torch.', '') for d in supported[device_type])
        reason = (f'{op_name} on {device_type} supports {names}, '
                  f'got {str(tensor.dtype).replace("torch.", "")}')
    if reason is None:
        return 'compiled', f'{device_type} kernel'
    if mode == 'compiled':
        raise RuntimeError(f'MMLINATTN_OPS=compiled but {reason}')
    return 'reference', reason
