"""What bf16 autocast on the CPU needs besides ``torch.autocast``.

- bf16 instructions: without ``avx512_bf16`` or ``amx_bf16`` the CPU emulates bf16 and runs it
  many times slower than fp32; :func:`warn_if_cpu_lacks_bf16` says so once, and
  :func:`mixed_precision_is_native` tells a script whether to ask for bf16 at all.
- fp32 for mmcv's ops: mmcv's CPU kernels have no bf16 versions (NMS takes fp32 only, RoIAlign fp32
  and fp16), and under autocast mmdet's detectors hand them bf16 boxes, scores and features.
  :func:`run_mmcv_ops_in_fp32` makes one model run them in fp32, as mmdet 2's ``force_fp32`` did
  at the same places: the forward of each ``mmcv.ops`` module and each head's ``predict_by_feat``
  (the post-processing, where NMS runs).
"""
import functools
import types
import warnings
from typing import FrozenSet, Optional

import torch
from torch import nn

__all__ = ['BF16_CPU_FLAGS', 'cpu_flags', 'cpu_model', 'cpu_has_bf16', 'mixed_precision_is_native',
           'warn_if_cpu_lacks_bf16', 'run_mmcv_ops_in_fp32']

# Either gives the CPU native bf16 dot products (oneDNN uses them for bf16 matmuls and convolutions).
BF16_CPU_FLAGS = ('avx512_bf16', 'amx_bf16')
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _cpuinfo_field(name: str) -> Optional[str]:
    """The value of the first ``name`` line of ``/proc/cpuinfo`` (Linux); None where it cannot be read."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith(name):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> Optional[FrozenSet[str]]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (Linux); None where it cannot be read."""
    flags = _cpuinfo_field('flags')
    return None if flags is None else frozenset(flags.split())


def cpu_model() -> Optional[str]:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux); None where it cannot be read."""
    return _cpuinfo_field('model name')


def cpu_has_bf16() -> Optional[bool]:
    """Whether the CPU has one of :data:`BF16_CPU_FLAGS` (None where the flags cannot be read)."""
    flags = cpu_flags()
    return None if flags is None else bool(flags.intersection(BF16_CPU_FLAGS))


def mixed_precision_is_native() -> bool:
    """Whether ``--amp`` runs on hardware made for it here: a CUDA GPU, or a CPU with one of
    :data:`BF16_CPU_FLAGS` (unreadable flags count as none). Elsewhere bf16 is emulated: a Mask
    R-CNN LaplacianFormer-T training step on balloon took 88 s in bf16 against 2.8 s in fp32 on an
    AVX2-only AMD EPYC."""
    return torch.cuda.is_available() or bool(cpu_has_bf16())


@functools.lru_cache(maxsize=None)  # once per process: every run's wrapper and test loop asks
def warn_if_cpu_lacks_bf16() -> None:
    """Warn that bf16 will be slower than fp32 when the CPU has none of :data:`BF16_CPU_FLAGS`
    (silent where the flags cannot be read)."""
    if cpu_has_bf16() in (None, True):
        return
    warnings.warn(f'this CPU has none of the bf16 instructions {" / ".join(BF16_CPU_FLAGS)} (not in '
                  '/proc/cpuinfo flags): bf16 autocast runs emulated here, many times slower than '
                  'fp32 (30x for a Mask R-CNN training step on an AVX2 CPU); train in fp32 here',
                  stacklevel=2)


def run_mmcv_ops_in_fp32(model: nn.Module) -> None:
    """Give ``model``'s ``mmcv.ops`` modules (forward) and heads (``predict_by_feat``) fp32 inputs,
    with autocast off, whenever a bf16 or fp16 CPU tensor comes in; a module's forward returns its
    floating outputs in that dtype again. Other calls run unchanged.

    Per instance (the classes, and other models, are untouched) and idempotent; the methods stay
    bound to their module, so a deep copy (EMA) or pickle of the model keeps them.
    """
    for module in model.modules():
        cls = type(module)
        if cls.__module__.startswith('mmcv.ops.') and 'forward' not in vars(module):
            module.forward = types.MethodType(_forward_in_fp32, module)
        if callable(getattr(cls, 'predict_by_feat', None)) and 'predict_by_feat' not in vars(module):
            module.predict_by_feat = types.MethodType(_predict_by_feat_in_fp32, module)


def _forward_in_fp32(self, *args, **kwargs):
    return _call_in_fp32(type(self).forward, self, args, kwargs, cast_back=True)


def _predict_by_feat_in_fp32(self, *args, **kwargs):
    return _call_in_fp32(type(self).predict_by_feat, self, args, kwargs, cast_back=False)


def _call_in_fp32(method, module, args, kwargs, cast_back):
    low = _low_precision_dtype((args, tuple(kwargs.values())))
    if low is None:
        return method(module, *args, **kwargs)
    with torch.autocast('cpu', enabled=False):
        out = method(module, *_cast(args, torch.float32),
                     **{key: _cast(value, torch.float32) for key, value in kwargs.items()})
    return _cast(out, low) if cast_back else out


def _low_precision_dtype(data) -> Optional[torch.dtype]:
    """The dtype of the first bf16 or fp16 CPU tensor in ``data`` (a tensor, or lists and tuples)."""
    if isinstance(data, torch.Tensor):
        return data.dtype if data.device.type == 'cpu' and data.dtype in _LOW_PRECISION else None
    if isinstance(data, (list, tuple)):
        return next((dtype for dtype in map(_low_precision_dtype, data) if dtype is not None), None)
    return None


def _cast(data, dtype):
    """``data`` with its floating tensors (alone, or in lists and tuples) in ``dtype``; anything else
    (configs, metadata dicts, mmengine's data elements) as it is."""
    if isinstance(data, torch.Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    if type(data) in (list, tuple):
        return type(data)(_cast(value, dtype) for value in data)
    return data
