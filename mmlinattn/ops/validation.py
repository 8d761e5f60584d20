"""Argument checks shared by the ops: each raises ``ValueError`` naming the argument and the shapes."""
from typing import Sequence

import torch


def _shape(t: torch.Tensor) -> str:
    return 'x'.join(str(s) for s in t.shape) if t.dim() else 'scalar'


def check_tensor(name: str, t, rank: int = None, min_rank: int = None) -> None:
    """``t`` is a floating-point tensor of the given rank (or at least ``min_rank``)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f'{name} must be a torch.Tensor, got {type(t).__name__}')
    if not t.is_floating_point():
        raise ValueError(f'{name} must be a floating-point tensor, got dtype {t.dtype}')
    if rank is not None and t.dim() != rank:
        raise ValueError(f'{name} must have {rank} dimensions, got shape [{_shape(t)}]')
    if min_rank is not None and t.dim() < min_rank:
        raise ValueError(f'{name} must have at least {min_rank} dimensions, got shape [{_shape(t)}]')


def check_same_device_dtype(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    first_name, first = names[0], tensors[0]
    for name, t in zip(names[1:], tensors[1:]):
        if t.device != first.device:
            raise ValueError(f'{name} is on {t.device} but {first_name} is on {first.device}; '
                             'all inputs must be on one device')
        if t.dtype != first.dtype:
            raise ValueError(f'{name} has dtype {t.dtype} but {first_name} has {first.dtype}')


def check_dims_match(name_a: str, a: torch.Tensor, dim_a: int, name_b: str, b: torch.Tensor,
                     dim_b: int, what: str) -> None:
    """``a.shape[dim_a] == b.shape[dim_b]``, e.g. the head dim of q and k."""
    if a.shape[dim_a] != b.shape[dim_b]:
        raise ValueError(f'{name_a} and {name_b} must have the same {what}, got '
                         f'{a.shape[dim_a]} and {b.shape[dim_b]} '
                         f'(shapes [{_shape(a)}] and [{_shape(b)}])')


def check_positive(name: str, value, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        expected = 'a positive integer' if integer else 'a positive number'
        raise ValueError(f'{name} must be {expected}, got {value!r}')
