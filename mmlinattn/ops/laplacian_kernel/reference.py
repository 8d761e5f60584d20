"""Pure-PyTorch reference of ``laplacian_kernel``: the formula, differentiable by autograd.

It is the tests' ground truth, the fallback when no kernel runs, and what the ONNX exporter
translates. Half-precision inputs are computed in fp32 and the result is cast back, as the kernels
do. Non-finite inputs are not checked and propagate.
"""
import torch

from ..torch_compat import is_exporting
from ..validation import compute_dtype

# Channels per broadcast step of :func:`l1_distance_exportable`.
EXPORT_CHANNELS_PER_STEP = 8


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


def l1_distance_exportable(q: torch.Tensor, k: torch.Tensor,
                           channels_per_step: int = EXPORT_CHANNELS_PER_STEP) -> torch.Tensor:
    """``dist[..., i, j] = sum_c |q[..., i, c] - k[..., j, c]|`` from elementary ops only.

    q: [..., N, D], k: [..., M, D] -> [..., N, M]. The channels in steps of ``channels_per_step``:
    each step one broadcast ``|q[..., :, None, c0:c1] - k[..., None, :, c0:c1]|`` summed over its
    channels, so the intermediate is [..., N, M, channels_per_step] (not [..., N, M, D]) and the
    graph holds ``ceil(D / channels_per_step)`` steps; every exporter translates it. Equal to
    ``torch.cdist(q, k, p=1)`` up to summation order.
    """
    num_channels = q.shape[-1]
    q, k = q.unsqueeze(-2), k.unsqueeze(-3)  # [..., N, 1, D], [..., 1, M, D]
    dist = None
    for start in range(0, num_channels, channels_per_step):
        stop = start + channels_per_step  # a slice past the end stops at it
        part = (q[..., start:stop] - k[..., start:stop]).abs().sum(-1)
        dist = part if dist is None else dist + part
    return dist
