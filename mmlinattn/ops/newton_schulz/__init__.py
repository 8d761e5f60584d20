"""``newton_schulz_inverse``: batched Newton–Schulz inverse of ``P = a + eps*I``.

Compiled operators ``torch.ops.mmlinattn.newton_schulz_inverse`` (forward, with the residual) and
``..._backward`` (the exact gradient of the computed iterate), CPU and CUDA, fp32 and fp64; fake
kernels and autograd in ``compiled.py``; the reference in ``reference.py``. The iteration, the start ``V0 = I / ||P||_inf``, the
gradient definition and the kernels: ``docs/ops/newton_schulz.md``.
"""
from typing import Tuple, Union

import torch

from ..dispatch import choose_for_size, forward_operator
from ..validation import (check_non_negative_finite, check_positive_int, check_tensor,
                          compute_dtype, shape_str)
from .reference import newton_schulz_inverse_reference, newton_schulz_residual_reference


def _check_args(a, iters, eps) -> None:
    check_tensor('a', a, min_rank=2)
    if a.shape[-1] != a.shape[-2]:
        raise ValueError(f'a must be a batch of square matrices [..., M, M], got shape '
                         f'[{shape_str(a)}]')
    check_positive_int('iters', iters)
    check_non_negative_finite('eps', eps)


def newton_schulz_inverse(
    a: torch.Tensor,
    iters: int = 20,
    eps: float = 1e-2,
    return_residual: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Approximate ``(a + eps*I)^-1`` of symmetric positive-definite matrices by Newton–Schulz.

    ``P = a + eps*I``; ``V0 = I / ||P||_inf`` (max absolute row sum, so the iteration converges
    for any SPD P); ``V <- 2V - V P V`` for up to ``iters`` steps, in fp32 (fp64 stays fp64). All
    but the last step run in product form (``V <- V (I + R)``, ``R <- R^2``, half the flops for
    symmetric P), and a matrix stops once ``||R||_inf`` is below the unit roundoff, where the
    remaining steps would change V by a relative ``u^2``. The gradient is that of the computed V
    as a function of ``a`` (through every step and through the start), whether or not the
    iteration has converged. Non-finite entries are not checked: they make the whole matrix's V
    NaN. See ``docs/ops/newton_schulz.md``.

    Args:
        a: [..., M, M] SPD matrices (e.g. a Laplacian-kernel Gram matrix of landmarks).
        iters: the most steps, >= 1. 20 reaches the fp32 floor for well-posed M <= 256.
        eps: diagonal shift, >= 0.
        return_residual: also return ``||I - P V||_F / sqrt(M)`` per matrix (not differentiable).

    Returns:
        V [..., M, M] in a's dtype, or ``(V, residual [...])`` with the residual in the compute
        dtype (fp32, or fp64).
    """
    _check_args(a, iters, eps)
    batch_shape = a.shape[:-2]
    dtype = compute_dtype(a.dtype)
    a_compute = a.to(dtype)
    implementation = choose_for_size('newton_schulz_inverse', a.device.type, dtype, a.shape[-1])
    if implementation == 'reference':
        v = newton_schulz_inverse_reference(a_compute, iters, float(eps))
        residual = (newton_schulz_residual_reference(a_compute.detach(), v.detach(), float(eps))
                    if return_residual else None)
    else:
        flat = a_compute.unsqueeze(0) if a.dim() == 2 else a_compute.flatten(0, -3)
        v, residual = forward_operator('newton_schulz_inverse', implementation)(
            flat, iters, float(eps), return_residual)
        v = v.reshape(a.shape)
        residual = residual.reshape(batch_shape) if return_residual else None
    v = v.to(a.dtype)
    return (v, residual) if return_residual else v
