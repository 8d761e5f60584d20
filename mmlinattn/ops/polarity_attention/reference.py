"""Pure-PyTorch reference of ``polarity_linear_attention``, composed as PolaFormer's code does.

It is the tests' ground truth, the fallback when no kernel runs, and what the ONNX exporter
translates. Half-precision inputs are computed in fp32 and the result is cast back, as the kernels
do. Non-finite inputs are not checked and propagate.
"""
from typing import Tuple

import torch

from ..validation import compute_dtype


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
