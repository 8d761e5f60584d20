"""``polarity_linear_attention``: PolaFormer's polarity-aware linear attention as one fused op.

Per batch and head, with ``x+ = relu(x)^p``, ``x- = relu(-x)^p`` (p per head and channel),
``phi_s(q) = [q+, q-]``, ``phi_o(q) = [q-, q+]``, ``phi(k) = [k+, k-]``,
``v1, v2 = chunk(v, 2, -1)``, ``z = mean_j phi(k_j)`` and ``kv_a = phi(k)^T v_a / n``::

    out = [ phi_s(q) kv_1 / (phi_s(q).z + eps)  ||  phi_o(q) kv_2 / (phi_o(q).z + eps) ]

The compiled kernels (``ops/csrc/polarity_attention``) never build the ``[.., N, 2d]`` feature
tensors: one pass over the keys reduces ``phi(k)^T [v, 1]`` into a ``[2d, dv+1]`` state (chunked,
summed in a fixed order), one pass over the queries applies it. The backward is analytic and
deterministic in the same two passes. Under autocast (CUDA or CPU) the op computes in fp32 and
returns fp32, because PolaFormer's attention overflows in fp16 (DESIGN.md §6).
"""
import numbers

import torch

from .dispatch import choose
from .reference import polarity_linear_attention_reference
from .validation import check_dims_match, check_tensor

OP_FORWARD = 'polarity_linear_attention_forward'
SUPPORTED = {
    'cpu': (torch.float32, torch.float64),
    'cuda': (torch.float32, torch.float16, torch.bfloat16),
}


def _shape(t: torch.Tensor) -> str:
    return 'x'.join(str(s) for s in t.shape)


def _check_arguments(q, k, v, power, eps) -> None:
    for name, t in (('q', q), ('k', k), ('v', v)):
        check_tensor(name, t, rank=4)
    check_tensor('power', power)
    for name, t in (('k', k), ('v', v), ('power', power)):
        if t.device != q.device:
            raise ValueError(f'{name} is on {t.device} but q is on {q.device}; '
                             'all inputs must be on one device')
    for name, t in (('k', k), ('v', v)):
        if t.dtype != q.dtype:
            raise ValueError(f'{name} has dtype {t.dtype} but q has {q.dtype}')
    check_dims_match('q', q, 0, 'k', k, 0, 'batch size')
    check_dims_match('q', q, 0, 'v', v, 0, 'batch size')
    check_dims_match('q', q, 1, 'k', k, 1, 'number of heads')
    check_dims_match('q', q, 1, 'v', v, 1, 'number of heads')
    check_dims_match('q', q, 3, 'k', k, 3, 'head dim')
    check_dims_match('k', k, 2, 'v', v, 2, 'number of tokens')
    heads, head_dim, value_dim = q.shape[1], q.shape[3], v.shape[3]
    if k.shape[2] < 1:
        raise ValueError(f'k must have at least one token, got shape [{_shape(k)}]')
    if head_dim < 1:
        raise ValueError(f'q must have a head dim of at least 1, got shape [{_shape(q)}]')
    if value_dim < 2 or value_dim % 2:
        raise ValueError('v must have an even, non-zero last dim (it is split into the same-sign '
                         f'and opposite-sign halves), got shape [{_shape(v)}]')
    if tuple(power.shape) not in ((heads, head_dim), (1, heads, 1, head_dim)):
        raise ValueError(f'power must have shape [{heads}, {head_dim}] or [1, {heads}, 1, '
                         f'{head_dim}] (heads, head dim of q), got [{_shape(power)}]')
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f'eps must be a non-negative number, got {eps!r}')


class _PolarityLinearAttention(torch.autograd.Function):
    """Compiled forward/backward; ``power`` arrives as a contiguous [h, d] tensor."""

    @staticmethod
    def forward(ctx, q, k, v, power, eps):
        out, state, den = torch.ops.mmlinattn.polarity_linear_attention_forward(
            q.contiguous(), k.contiguous(), v.contiguous(), power, float(eps))
        ctx.save_for_backward(q, k, v, power, out, state, den)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, power, out, state, den = ctx.saved_tensors
        dq, dk, dv, dpower = torch.ops.mmlinattn.polarity_linear_attention_backward(
            grad_out.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), power, out,
            state, den)
        return dq, dk, dv, dpower, None


def polarity_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              power: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Polarity-aware linear attention (PolaFormer, DESIGN.md §6), fused.

    Args:
        q: [B, h, N, d] queries, already divided by the softplus scale.
        k: [B, h, n, d] keys, scaled and with the positional encoding added.
        v: [B, h, n, dv] values, dv even: the first half feeds the same-sign stream, the second
            half the opposite-sign stream.
        power: [h, d] or [1, h, 1, d] per head and channel exponents (> 0, not checked as that
            would sync the device; PolaFormer uses ``1 + 4 * sigmoid(theta)``), cast to q's
            dtype; gradients flow to it.
        eps: added to both normalisers.

    Returns:
        [B, h, N, dv] in q's dtype; fp32 when called under autocast (the inputs are cast to fp32
        and autocast is switched off inside, for the compiled kernels and the reference alike).
    """
    _check_arguments(q, k, v, power, eps)
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        with torch.autocast(device_type, enabled=False):
            return _dispatch(q.float(), k.float(), v.float(), power.float(), eps)
    return _dispatch(q, k, v, power.to(q.dtype), eps)


def _dispatch(q, k, v, power, eps):
    power = power.reshape(q.shape[1], q.shape[3])
    impl, _ = choose(OP_FORWARD, q, SUPPORTED)
    if impl == 'reference':
        return polarity_linear_attention_reference(q, k, v, power, eps)
    return _PolarityLinearAttention.apply(q, k, v, power.contiguous(), eps)
