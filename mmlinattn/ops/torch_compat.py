"""The few torch APIs the ops use that older torch releases (setup.py allows torch >= 2.1) lack.

- ``torch.library.register_fake`` / ``register_autograd`` (torch >= 2.4) give the compiled
  operators their fake kernels and autograd; without them the extension is not loaded and the
  ops run their references (``dispatch.py`` says so once, with a ``FallbackWarning``).
- ``torch.is_autocast_enabled(device_type)`` and ``torch.get_autocast_dtype(device_type)`` take a
  device from torch 2.4 on; before, the CPU has its own queries.
- ``torch.compiler.is_exporting`` (torch >= 2.3): before it, nothing reports a torch.export trace.
- ``torch.library.triton_op`` / ``wrap_triton`` (torch >= 2.6) define the Triton operators;
  without them the Triton kernels are not used and ``dispatch.py`` says why.
"""
import torch
from torch.torch_version import TorchVersion

_TORCH_2_4 = TorchVersion(torch.__version__) >= (2, 4)


def missing_library_api() -> str:
    """Why the compiled operators cannot be registered with this torch, or '' when they can."""
    if _TORCH_2_4:
        return ''
    return (f'torch {torch.__version__} lacks torch.library.register_fake / register_autograd '
            '(torch >= 2.4), which the compiled operators need')


def missing_triton_api() -> str:
    """Why the Triton operators cannot be defined with this torch, or '' when they can."""
    if hasattr(torch.library, 'triton_op') and hasattr(torch.library, 'wrap_triton'):
        return ''
    return (f'torch {torch.__version__} lacks torch.library.triton_op / wrap_triton '
            '(torch >= 2.6), which the Triton operators need')


def autocast_enabled(device_type: str) -> bool:
    """``torch.is_autocast_enabled(device_type)`` on every supported torch."""
    if _TORCH_2_4:
        return torch.is_autocast_enabled(device_type)
    if device_type == 'cpu':
        return torch.is_autocast_cpu_enabled()
    return torch.is_autocast_enabled()


def autocast_dtype(device_type: str) -> torch.dtype:
    """``torch.get_autocast_dtype(device_type)``, the dtype autocast casts to, on every supported
    torch."""
    if _TORCH_2_4:
        return torch.get_autocast_dtype(device_type)
    if device_type == 'cpu':
        return torch.get_autocast_cpu_dtype()
    return torch.get_autocast_gpu_dtype()


def is_exporting() -> bool:
    """Whether torch.export is tracing (always False on torch < 2.3, which cannot tell)."""
    query = getattr(torch.compiler, 'is_exporting', None)
    return query is not None and query()
