"""Pure-PyTorch references of the fused ops: the formulas, differentiable by autograd.

They are the tests' ground truth, the fallback when the compiled extension is absent, and what
the ONNX exporter translates. Keep this file a flat list of functions, one (or a few) per op.
Half-precision inputs are computed in fp32 and the result is cast back, as the compiled kernels
do. Non-finite inputs are not checked and propagate.
"""
from typing import Tuple

import torch

from .torch_compat import is_exporting
from .validation import compute_dtype


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


def newton_schulz_inverse_reference(a: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Approximate ``(a + eps*I)^-1`` for SPD ``a`` [..., M, M] by Newton–Schulz.

    ``P = a + eps*I``; ``V0 = I / s``, ``s = ||P||_inf`` (max absolute row sum, per matrix);
    ``V <- 2V - V P V`` for ``iters`` steps, in fp32 (fp64 stays fp64); returns V in a's dtype.
    The first ``iters - 1`` steps are evaluated in product form, ``V_{t+1} = V_t (I + R_t)``,
    ``R_0 = I - P/s``, ``R_{t+1} = R_t^2`` (the same iterates), and a matrix whose
    ``||R_t||_inf <= u`` (unit roundoff) skips its remaining product steps; the last step is
    ``2V - V P V``, which corrects the rounding of the product form. Autograd through this (and
    through the start) is the gradient every implementation computes
    (``docs/ops/newton_schulz.md``).
    """
    dtype = compute_dtype(a.dtype)
    p = newton_schulz_shifted_reference(a.to(dtype), eps)
    if p.shape[-1] == 0:
        return a * 0
    eye = torch.eye(a.shape[-1], dtype=dtype, device=a.device)
    inv = 1 / p.abs().sum(-1).amax(-1)[..., None, None]
    v, r = eye * inv, eye - p * inv
    unit_roundoff = torch.finfo(dtype).eps / 2
    running = torch.ones_like(inv, dtype=torch.bool)
    for step in range(iters - 1):
        running = running & ~(r.abs().sum(-1).amax(-1)[..., None, None] <= unit_roundoff)
        v = torch.where(running, v + v @ r, v)
        if step < iters - 2:
            r = r @ r
    return (2 * v - v @ p @ v).to(a.dtype)


def newton_schulz_shifted_reference(a: torch.Tensor, eps: float) -> torch.Tensor:
    """``P = a + eps*I`` for a [..., M, M]."""
    return a + eps * torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)


def newton_schulz_residual_reference(a: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    """``||I - P V||_F / sqrt(M)`` per matrix, P = a + eps*I; a, v: [..., M, M] -> [...]."""
    dtype = compute_dtype(a.dtype)
    p = newton_schulz_shifted_reference(a.to(dtype), eps)
    eye = torch.eye(a.shape[-1], dtype=dtype, device=a.device)
    m = max(a.shape[-1], 1)
    return torch.linalg.matrix_norm(eye - p @ v.to(dtype)) / m**0.5


def polarity_features(x: torch.Tensor, power: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """PolaFormer's feature map ``(x+, x-) = (relu(x)^p, relu(-x)^p)``: x [..., n, d] and p
    broadcasting to it (e.g. [1, h, 1, d]) -> two tensors of x's shape."""
    return torch.relu(x)**power, torch.relu(-x)**power


def polarity_linear_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                        power: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """PolaFormer's polarity-aware linear attention, composed as the official code does.

    q: [B, h, N, d], k: [B, h, n, d], v: [B, h, n, dv] (dv even), power: [h, d] or [1, h, 1, d].
    ``x+, x- = polarity_features(x, p)``; ``phi_s(q) = [q+, q-]``, ``phi_o(q) = [q-, q+]``,
    ``phi(k) = [k+, k-]``; ``v1, v2 = chunk(v, 2, -1)``; ``z = mean_j phi(k_j)``,
    ``kv_a = (phi(k)/sqrt(n))^T (v_a/sqrt(n))``;
    ``out = [phi_s(q) kv_1 / (phi_s(q).z + eps) || phi_o(q) kv_2 / (phi_o(q).z + eps)]`` -> [B, h, N, dv].
    """
    dtype = compute_dtype(q.dtype)
    p = power.to(dtype).reshape(1, q.shape[1], 1, q.shape[-1])
    q, k, v_ = q.to(dtype), k.to(dtype), v.to(dtype)
    q_pos, q_neg = polarity_features(q, p)
    k_pos, k_neg = polarity_features(k, p)
    q_same = torch.cat([q_pos, q_neg], dim=-1)
    q_opp = torch.cat([q_neg, q_pos], dim=-1)
    k_feat = torch.cat([k_pos, k_neg], dim=-1)
    v1, v2 = torch.chunk(v_, 2, dim=-1)
    n = k.shape[-2]
    k_mean = k_feat.mean(dim=-2, keepdim=True).transpose(-2, -1)
    k_scaled = k_feat.transpose(-2, -1) * n**-0.5
    x_same = (q_same @ (k_scaled @ (v1 * n**-0.5))) * (1 / (q_same @ k_mean + eps))
    x_opp = (q_opp @ (k_scaled @ (v2 * n**-0.5))) * (1 / (q_opp @ k_mean + eps))
    return torch.cat([x_same, x_opp], dim=-1).to(v.dtype)
