"""Pure-PyTorch reference of ``newton_schulz_inverse``: the iteration, differentiable by autograd.

It is the tests' ground truth, the fallback when no kernel runs, and what the ONNX exporter
translates (the steps unrolled). Non-finite inputs are not checked and propagate.
"""
import torch

from ..validation import compute_dtype


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
