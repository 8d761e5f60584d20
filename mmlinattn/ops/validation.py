"""What every op checks and the dtype rules they share.

Argument checks raise ``ValueError`` naming the argument and the shapes. They look at shapes,
dtypes, devices and Python numbers only, never at tensor values (that would sync the device).

Dtype rules, the same for every op:

- mixed inputs are promoted as in ``q + k`` (:func:`promote`); parameters such as ``power`` take
  the promoted dtype;
- the arithmetic runs in :func:`compute_dtype`: fp64 stays fp64, everything else runs in fp32;
- results come back in the promoted input dtype (fp16 in, fp16 out), except where an op says
  otherwise (the Newton–Schulz residual is in the compute dtype; the polarity attention returns
  fp32 for fp16 inputs under autocast, whose powers would overflow in fp16).
"""
import math
import numbers
from typing import Sequence

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the ops compute in: fp64 for fp64, fp32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def promote(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype mixed floating-point inputs are promoted to (``torch.promote_types``)."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def shape_str(t: torch.Tensor) -> str:
    return 'x'.join(str(s) for s in t.shape) if t.dim() else 'scalar'


def check_tensor(name: str, t, rank: int = None, min_rank: int = None) -> None:
    """``t`` is a floating-point tensor of the given rank (or at least ``min_rank``)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f'{name} must be a torch.Tensor, got {type(t).__name__}')
    if not t.is_floating_point():
        raise ValueError(f'{name} must be a floating-point tensor, got dtype {t.dtype}')
    if rank is not None and t.dim() != rank:
        raise ValueError(f'{name} must have {rank} dimensions, got shape [{shape_str(t)}]')
    if min_rank is not None and t.dim() < min_rank:
        raise ValueError(f'{name} must have at least {min_rank} dimensions, got shape '
                         f'[{shape_str(t)}]')


def check_same_device(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    """Every tensor is on the first one's device."""
    first_name, first = names[0], tensors[0]
    for name, t in zip(names[1:], tensors[1:]):
        if t.device != first.device:
            raise ValueError(f'{name} is on {t.device} but {first_name} is on {first.device}; '
                             'all inputs must be on one device')


def check_dims_match(name_a: str, a: torch.Tensor, dim_a: int, name_b: str, b: torch.Tensor,
                     dim_b: int, what: str) -> None:
    """``a.shape[dim_a] == b.shape[dim_b]``, e.g. the head dim of q and k."""
    if a.shape[dim_a] != b.shape[dim_b]:
        raise ValueError(f'{name_a} and {name_b} must have the same {what}, got '
                         f'{a.shape[dim_a]} and {b.shape[dim_b]} '
                         f'(shapes [{shape_str(a)}] and [{shape_str(b)}])')


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')


def check_positive_finite(name: str, value) -> None:
    if not _is_real(value) or not 0 < value < math.inf:
        raise ValueError(f'{name} must be a positive finite number, got {value!r}')


def check_non_negative_finite(name: str, value) -> None:
    if not _is_real(value) or not 0 <= value < math.inf:
        raise ValueError(f'{name} must be a non-negative finite number, got {value!r}')
