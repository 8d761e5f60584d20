"""Fused Laplacian kernel ``exp(-||q_i - k_j||_1 / lam)``: argument checks, dispatch and autograd.

Compiled kernels: ``torch.ops.mmlinattn.laplacian_kernel_forward`` / ``..._backward`` (CPU: fp32,
fp64; CUDA: fp32, fp16, bf16 with fp32 accumulation). Neither materialises [B, H, N, M, D].
Backward, with ``g_ij = grad_ij * out_ij / lam`` and sign(0) = 0:
``dq_ic = -sum_j g_ij sign(q_ic - k_jc)``, ``dk_jc = +sum_i g_ij sign(q_ic - k_jc)``.
"""
import math

import torch
from torch.autograd.function import once_differentiable

from .dispatch import choose
from .reference import laplacian_kernel_reference
from .validation import check_dims_match, check_tensor

SUPPORTED = {
    'cpu': (torch.float32, torch.float64),
    'cuda': (torch.float32, torch.float16, torch.bfloat16),
}


class LaplacianKernelFunction(torch.autograd.Function):
    """Autograd wrapper of the compiled forward/backward; inputs must share dtype and device."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, lam: float) -> torch.Tensor:
        q, k = q.contiguous(), k.contiguous()
        out = torch.ops.mmlinattn.laplacian_kernel_forward(q, k, lam)
        ctx.save_for_backward(q, k, out)
        ctx.lam = lam
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        q, k, out = ctx.saved_tensors
        need_dq, need_dk = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dq, dk = torch.ops.mmlinattn.laplacian_kernel_backward(grad_out.contiguous(), q, k, out,
                                                                ctx.lam, need_dq, need_dk)
        return (dq if need_dq else None), (dk if need_dk else None), None


def _check_args(q, k, lam) -> None:
    check_tensor('q', q, rank=4)
    check_tensor('k', k, rank=4)
    if q.device != k.device:
        raise ValueError(f'k is on {k.device} but q is on {q.device}; both must be on one device')
    check_dims_match('q', q, 0, 'k', k, 0, 'batch size (dim 0)')
    check_dims_match('q', q, 1, 'k', k, 1, 'number of heads (dim 1)')
    check_dims_match('q', q, 3, 'k', k, 3, 'head dim (dim 3)')
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not (0 < lam < math.inf):
        raise ValueError(f'lam must be a positive finite number, got {lam!r}')


def laplacian_kernel(q: torch.Tensor, k: torch.Tensor, lam: float = 4.0) -> torch.Tensor:
    """Laplacian kernel between queries and keys.

    ``out[b,h,i,j] = exp(-sum_c |q[b,h,i,c] - k[b,h,j,c]| / lam)``.

    Args:
        q: [B, H, N, D] floating point.
        k: [B, H, M, D] on q's device; a different floating dtype is promoted as in ``q + k``.
        lam: bandwidth, > 0.

    Returns:
        [B, H, N, M] in the promoted dtype.
    """
    _check_args(q, k, lam)
    dtype = torch.promote_types(q.dtype, k.dtype)
    q, k = q.to(dtype), k.to(dtype)
    impl, _ = choose('laplacian_kernel_forward', q, SUPPORTED)
    if impl == 'reference':
        return laplacian_kernel_reference(q, k, float(lam))
    return LaplacianKernelFunction.apply(q, k, float(lam))
