"""``polarity_linear_attention``: PolaFormer's polarity-aware linear attention as one fused op.

Per batch and head, with ``x+ = relu(x)^p``, ``x- = relu(-x)^p`` (p per head and channel),
``phi_s(q) = [q+, q-]``, ``phi_o(q) = [q-, q+]``, ``phi(k) = [k+, k-]``,
``v1, v2 = chunk(v, 2, -1)``, ``z = mean_j phi(k_j)`` and ``kv_a = phi(k)^T v_a / n``::

    out = [ phi_s(q) kv_1 / (phi_s(q).z + eps)  ||  phi_o(q) kv_2 / (phi_o(q).z + eps) ]

Implementations: ``reference.py`` (the composition of PolaFormer's code); the C++ operators
``torch.ops.mmlinattn.polarity_linear_attention_forward`` / ``..._backward`` (fake kernels and
autograd in ``compiled.py``), which never build the ``[.., N, 2d]`` feature tensors: one
pass over the keys reduces ``phi(k)^T [v, 1]`` into a ``[2d, dv+1]`` state, one pass over the
queries applies it. The state layout and the backward: ``docs/ops/polarity_linear_attention.md``.

:func:`attention_dtype` is the one home of the rule which dtype the attention runs in under
mixed precision (fp16 -> fp32, bf16 stays bf16).
"""
import torch

from ..dispatch import choose, forward_operator, run_dtype
from ..torch_compat import autocast_enabled
from ..validation import (check_dims_match, check_non_negative_finite, check_same_device,
                          check_tensor, promote, shape_str)
from .reference import polarity_linear_attention_reference


def attention_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype polarity attention runs in for activations of ``dtype`` under mixed precision.

    fp16 -> fp32: the features ``|x|^p`` (p up to 5) and their sums over all tokens overflow fp16
    (a component of 10 gives ``10^5 > 65504``), and an overflow in a normaliser turns the output
    into NaN. bf16 stays bf16: it has fp32's exponent range, so nothing overflows, and every
    implementation reads bf16 and accumulates in fp32 (the bf16 error is the rounding of the
    inputs and of the result, see the self-test's tolerances). fp32 and fp64 are unchanged.
    """
    return torch.float32 if dtype == torch.float16 else dtype


def _check_args(q, k, v, power, eps) -> None:
    for name, t in (('q', q), ('k', k), ('v', v)):
        check_tensor(name, t, rank=4)
    check_tensor('power', power)
    check_same_device(('q', 'k', 'v', 'power'), (q, k, v, power))
    check_dims_match('q', q, 0, 'k', k, 0, 'batch size')
    check_dims_match('q', q, 0, 'v', v, 0, 'batch size')
    check_dims_match('q', q, 1, 'k', k, 1, 'number of heads')
    check_dims_match('q', q, 1, 'v', v, 1, 'number of heads')
    check_dims_match('q', q, 3, 'k', k, 3, 'head dim')
    check_dims_match('k', k, 2, 'v', v, 2, 'number of tokens')
    heads, head_dim, value_dim = q.shape[1], q.shape[3], v.shape[3]
    if k.shape[2] < 1:
        raise ValueError(f'k must have at least one token, got shape [{shape_str(k)}]')
    if head_dim < 1:
        raise ValueError(f'q must have a head dim of at least 1, got shape [{shape_str(q)}]')
    if value_dim < 2 or value_dim % 2:
        raise ValueError('v must have an even, non-zero last dim (it is split into the same-sign '
                         f'and opposite-sign halves), got shape [{shape_str(v)}]')
    if tuple(power.shape) not in ((heads, head_dim), (1, heads, 1, head_dim)):
        raise ValueError(f'power must have shape [{heads}, {head_dim}] or [1, {heads}, 1, '
                         f'{head_dim}] (heads, head dim of q), got [{shape_str(power)}]')
    check_non_negative_finite('eps', eps)


def polarity_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              power: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Polarity-aware linear attention (PolaFormer), fused. See
    ``docs/ops/polarity_linear_attention.md``.

    Args:
        q: [B, h, N, d] queries, already divided by the softplus scale.
        k: [B, h, n, d] keys, scaled and with the positional encoding added.
        v: [B, h, n, dv] values, dv even: the first half feeds the same-sign stream, the second
            half the opposite-sign stream. Mixed dtypes of q, k, v are promoted as in ``q + k``.
        power: [h, d] or [1, h, 1, d] per head and channel exponents (> 0, not checked as that
            would sync the device; PolaFormer uses ``1 + 4 * sigmoid(theta)``), cast to the
            promoted dtype; gradients flow to it.
        eps: added to both normalisers, >= 0.

    Returns:
        [B, h, N, dv] in the promoted dtype, accumulated in fp32 (fp64 stays fp64). Under
        autocast the op switches autocast off and runs in :func:`attention_dtype` of the promoted
        dtype: fp16 inputs are computed and returned in fp32, bf16 ones stay bf16. Non-finite
        inputs propagate: a NaN in q_i gives NaN in row i, a NaN in any key NaN everywhere in that
        (batch, head), a NaN in value channel c NaN in column c of that (batch, head).
    """
    _check_args(q, k, v, power, eps)
    device_type = q.device.type
    dtype = promote(q, k, v)
    if autocast_enabled(device_type):
        dtype = attention_dtype(dtype)
        with torch.autocast(device_type, enabled=False):
            return _dispatch(q.to(dtype), k.to(dtype), v.to(dtype), power.to(dtype), eps)
    return _dispatch(q.to(dtype), k.to(dtype), v.to(dtype), power.to(dtype), eps)


def _dispatch(q, k, v, power, eps):
    power = power.reshape(q.shape[1], q.shape[3])
    implementation = choose('polarity_linear_attention', q.device.type, q.dtype)
    if implementation == 'reference':
        return polarity_linear_attention_reference(q, k, v, power, eps)
    dtype = run_dtype('polarity_linear_attention', implementation, q.device.type, q.dtype)
    out, _, _ = forward_operator('polarity_linear_attention', implementation)(
        q.to(dtype), k.to(dtype), v.to(dtype), power.to(dtype), float(eps))
    return out.to(q.dtype)
