"""``laplacian_kernel``: the Laplacian kernel ``exp(-||q_i - k_j||_1 / lam)`` without [B, H, N, M, D].

Implementations: ``reference.py`` (``cdist`` + ``exp``); the C++ operators
``torch.ops.mmlinattn.laplacian_kernel_forward`` / ``..._backward`` (CPU: fp32, fp64, bf16; CUDA: fp32,
fp16, bf16 with fp32 accumulation; fake kernels and autograd in ``compiled.py``); the Triton
operators ``..._triton_forward`` / ``..._triton_backward`` (``triton.py``); for ONNX export, one
``mmlinattn::LaplacianKernel`` node run by the project's onnxruntime op library (``onnx.py``).
Formulas, layouts and the choices behind them: ``docs/ops/laplacian_kernel.md``.
"""
import torch

from ..dispatch import choose, forward_operator, run_dtype
from ..validation import (check_dims_match, check_positive_finite, check_same_device,
                         check_tensor, promote)
from .onnx import LaplacianKernelNode, custom_node_requested
from .reference import laplacian_kernel_reference


def check_args(q, k, lam) -> None:
    """The public op's argument checks, also run by the Triton operators (the C++ ones repeat
    them in C++), so no kernel reads out of bounds whoever calls it."""
    check_tensor('q', q, rank=4)
    check_tensor('k', k, rank=4)
    check_same_device(('q', 'k'), (q, k))
    check_dims_match('q', q, 0, 'k', k, 0, 'batch size (dim 0)')
    check_dims_match('q', q, 1, 'k', k, 1, 'number of heads (dim 1)')
    check_dims_match('q', q, 3, 'k', k, 3, 'head dim (dim 3)')
    check_positive_finite('lam', lam)


def laplacian_kernel(q: torch.Tensor, k: torch.Tensor, lam: float = 4.0) -> torch.Tensor:
    """Laplacian kernel between queries and keys.

    ``out[b,h,i,j] = exp(-sum_c |q[b,h,i,c] - k[b,h,j,c]| / lam)``; gradients with sign(0) = 0.
    Non-finite inputs propagate (a NaN in q_i gives NaN in row i). See
    ``docs/ops/laplacian_kernel.md``.

    Args:
        q: [B, H, N, D] floating point.
        k: [B, H, M, D] on q's device; mixed dtypes are promoted as in ``q + k``.
        lam: bandwidth, > 0.

    Returns:
        [B, H, N, M] in the promoted dtype, computed in fp32 (fp64 stays fp64).
    """
    check_args(q, k, lam)
    dtype = promote(q, k)
    q, k = q.to(dtype), k.to(dtype)
    if custom_node_requested():
        return LaplacianKernelNode.apply(q, k, float(lam))
    implementation = choose('laplacian_kernel', q.device.type, dtype)
    if implementation == 'reference':
        return laplacian_kernel_reference(q, k, float(lam))
    kernel_dtype = run_dtype('laplacian_kernel', implementation, q.device.type, dtype)
    out = forward_operator('laplacian_kernel', implementation)(q.to(kernel_dtype),
                                                               k.to(kernel_dtype), float(lam))
    return out.to(dtype)
