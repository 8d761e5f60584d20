"""Batched Newton–Schulz inverse of ``P = a + eps*I``: argument checks, dispatch and autograd.

Compiled kernel: ``torch.ops.mmlinattn.newton_schulz_inverse(a [B, M, M], iters, eps,
with_residual) -> (V, residual)``, iterating in fp32 (fp64 for fp64 input) and returning V and
the residual in that precision. CPU: fp32, fp64, fp16, bf16 (cast up). CUDA: fp32, fp16, bf16;
one thread block per matrix in shared memory when the matrices fit, batched matrix products
otherwise (any M).
Backward (exact at convergence, V = P^-1): ``grad_a = -V^T G V^T``.
"""
import math
from typing import Tuple, Union

import torch
from torch.autograd.function import once_differentiable

from .dispatch import choose
from .reference import newton_schulz_inverse_reference, newton_schulz_residual_reference
from .validation import check_positive, check_tensor

SUPPORTED = {
    'cpu': (torch.float32, torch.float64, torch.float16, torch.bfloat16),
    'cuda': (torch.float32, torch.float16, torch.bfloat16),
}


class NewtonSchulzFunction(torch.autograd.Function):
    """a [B, M, M] -> (V [B, M, M] in a's dtype, residual [B] in the iteration dtype)."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, iters: int, eps: float, with_residual: bool):
        v, residual = torch.ops.mmlinattn.newton_schulz_inverse(a.contiguous(), iters, eps,
                                                                with_residual)
        ctx.save_for_backward(v)
        ctx.mark_non_differentiable(residual)
        return v.to(a.dtype), residual

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_v: torch.Tensor, grad_residual):
        (v, ) = ctx.saved_tensors
        vt = v.transpose(-1, -2)
        grad_a = -(vt @ grad_v.to(v.dtype) @ vt)
        return grad_a.to(grad_v.dtype), None, None, None


def _check_args(a, iters, eps) -> None:
    check_tensor('a', a, min_rank=2)
    if a.shape[-1] != a.shape[-2]:
        raise ValueError('a must be a batch of square matrices [..., M, M], got shape '
                         f'[{"x".join(str(s) for s in a.shape)}]')
    check_positive('iters', iters, integer=True)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 <= eps < math.inf):
        raise ValueError(f'eps must be a non-negative finite number, got {eps!r}')
    if not bool(torch.isfinite(a).all()):
        raise ValueError('a must be finite, but it contains NaN or Inf (shape '
                         f'[{"x".join(str(s) for s in a.shape)}])')


def newton_schulz_inverse(
    a: torch.Tensor,
    iters: int = 20,
    eps: float = 1e-2,
    return_residual: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Approximate ``(a + eps*I)^-1`` of symmetric positive-definite matrices by Newton–Schulz.

    ``P = a + eps*I``; ``V0 = I / ||P||_inf`` (max absolute row sum, so the iteration converges
    for any SPD P); ``V <- 2V - V P V`` for ``iters`` steps, in fp32 (fp16/bf16 input is cast up and
    V back to a's dtype; fp64 stays fp64).

    Args:
        a: [..., M, M] SPD matrices (e.g. a Laplacian-kernel Gram matrix of landmarks), finite.
        iters: number of steps, >= 1. 20 reaches the fp32 floor for well-posed M <= 256.
        eps: diagonal shift, >= 0.
        return_residual: also return ``||I - P V||_F / sqrt(M)`` per matrix (not differentiable).

    Returns:
        V [..., M, M] in a's dtype, or ``(V, residual [...])`` with the residual in fp32 (fp64).
    """
    _check_args(a, iters, eps)
    batch_shape, m = a.shape[:-2], a.shape[-1]
    compute_dtype = torch.float64 if a.dtype == torch.float64 else torch.float32
    if m == 0:
        v = a * 0
        residual = torch.zeros(batch_shape, dtype=compute_dtype, device=a.device)
        return (v, residual) if return_residual else v
    impl, _ = choose('newton_schulz_inverse', a, SUPPORTED)
    if impl == 'reference':
        v_full = newton_schulz_inverse_reference(a.to(compute_dtype), iters, float(eps))
        v = v_full.to(a.dtype)
        if not return_residual:
            return v
        residual = newton_schulz_residual_reference(a.detach(), v_full.detach(), float(eps))
        return v, residual
    v, residual = NewtonSchulzFunction.apply(a.reshape(-1, m, m), iters, float(eps),
                                             return_residual)
    v = v.reshape(a.shape)
    return (v, residual.reshape(batch_shape)) if return_residual else v
