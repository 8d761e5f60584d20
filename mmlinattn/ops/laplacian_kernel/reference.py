"""Pure-PyTorch reference of ``laplacian_kernel``: the formula, differentiable by autograd.

It is the tests' ground truth, the fallback when no kernel runs, and what the ONNX exporter
translates. Half-precision inputs are computed in fp32 and the result is cast back, as the kernels
do. Non-finite inputs are not checked and propagate.
"""
import torch

from ..torch_compat import is_exporting
from ..validation import compute_dtype


def laplacian_kernel_reference(q: torch.Tensor, k: torch.Tensor, lam: float) -> torch.Tensor:
    """``out[b,h,i,j] = exp(-sum_c |q[b,h,i,c] - k[b,h,j,c]| / lam)``.

    q: [B, H, N, D], k: [B, H, M, D] -> [B, H, N, M]. ``torch.cdist(p=1)`` computes the L1
    distances without a [B, H, N, M, D] intermediate; its gradient uses sign(0) = 0 at ties.
    While a model is being exported (ONNX, ``torch.export``), where ``cdist(p=1)`` has no
    translation, :func:`l1_distance_exportable` computes the same distances.
    """
    out_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    q, k = q.to(dtype), k.to(dtype)
    exporting = torch.onnx.is_in_onnx_export() or is_exporting()
    dist = l1_distance_exportable(q, k) if exporting else torch.cdist(q, k, p=1)
    return torch.exp(dist * (-1.0 / lam)).to(out_dtype)


def l1_distance_exportable(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``dist[..., i, j] = sum_c |q[..., i, c] - k[..., j, c]|`` from elementary ops only.

    q: [..., N, D], k: [..., M, D] -> [..., N, M]. One broadcast subtraction per channel, so the
    memory stays O(N M) (no [..., N, M, D] intermediate) and every exporter can translate it; D
    is unrolled into the graph. Equal to ``torch.cdist(q, k, p=1)`` up to summation order.
    """
    k_t = k.transpose(-2, -1)  # [..., D, M]
    dist = (q[..., :, 0:1] - k_t[..., 0:1, :]).abs()
    for c in range(1, q.shape[-1]):
        dist = dist + (q[..., :, c:c + 1] - k_t[..., c:c + 1, :]).abs()
    return dist
