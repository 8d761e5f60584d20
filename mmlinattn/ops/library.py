"""Fake (meta) kernels and autograd formulas of the compiled ops ``torch.ops.mmlinattn.*``.

The extension (``ops/csrc``) defines each operator's schema and its CPU / CUDA kernels; this
module adds what ``torch.compile``, ``torch.export`` and ``torch.library.opcheck`` need, with
``torch.library.register_fake`` (output shapes and dtypes from input shapes) and
``torch.library.register_autograd`` (the backward calls the op's ``*_backward`` operator).
:func:`register` runs once, when ``dispatch.py`` has loaded the extension.

Saved-state dtypes follow the ops' compute dtype (``validation.compute_dtype``).
The ``*_backward`` operators have no autograd formula: double backward is not supported.
"""
import torch

from .validation import compute_dtype

_LIB = 'mmlinattn'


def _fake_laplacian_forward(q, k, lam):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], k.shape[2]))


def _fake_laplacian_backward(grad_out, q, k, out, lam, need_dq, need_dk):
    return (q.new_empty(q.shape) if need_dq else q.new_empty((0, )),
            k.new_empty(k.shape) if need_dk else k.new_empty((0, )))


def _laplacian_setup(ctx, inputs, output):
    q, k, lam = inputs
    ctx.save_for_backward(q, k, output)
    ctx.lam = lam


def _laplacian_backward(ctx, grad_out):
    q, k, out = ctx.saved_tensors
    need_dq, need_dk = ctx.needs_input_grad[:2]
    dq, dk = torch.ops.mmlinattn.laplacian_kernel_backward(grad_out, q, k, out, ctx.lam, need_dq,
                                                           need_dk)
    return (dq if need_dq else None), (dk if need_dk else None), None


def _fake_newton_schulz(a, iters, eps, with_residual):
    dtype = compute_dtype(a.dtype)
    return (a.new_empty(a.shape, dtype=dtype),
            a.new_empty((a.shape[0] if with_residual else 0, ), dtype=dtype))


def _fake_newton_schulz_backward(grad_v, a, iters, eps):
    return a.new_empty(a.shape)


def _newton_schulz_setup(ctx, inputs, output):
    a, iters, eps, _ = inputs
    ctx.save_for_backward(a)
    ctx.iters, ctx.eps = iters, eps
    ctx.mark_non_differentiable(output[1])


def _newton_schulz_backward(ctx, grad_v, grad_residual):
    (a, ) = ctx.saved_tensors
    grad_a = torch.ops.mmlinattn.newton_schulz_inverse_backward(grad_v, a, ctx.iters, ctx.eps)
    return grad_a, None, None, None


def _fake_polarity_forward(q, k, v, power, eps):
    batch, heads, num_queries, head_dim = q.shape
    value_dim, acc = v.shape[3], compute_dtype(q.dtype)
    return (q.new_empty((batch, heads, num_queries, value_dim)),
            q.new_empty((batch, heads, 2 * head_dim, value_dim + 2), dtype=acc),
            q.new_empty((batch, heads, num_queries, 2), dtype=acc))


def _fake_polarity_backward(grad_out, q, k, v, power, out, state, den):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            power.new_empty(power.shape, dtype=compute_dtype(q.dtype)))


def _polarity_setup(ctx, inputs, output):
    q, k, v, power, _ = inputs
    out, state, den = output
    ctx.save_for_backward(q, k, v, power, out, state, den)
    ctx.mark_non_differentiable(state, den)


def _polarity_backward(ctx, grad_out, grad_state, grad_den):
    q, k, v, power, out, state, den = ctx.saved_tensors
    dq, dk, dv, dpower = torch.ops.mmlinattn.polarity_linear_attention_backward(
        grad_out, q, k, v, power, out, state, den)
    return dq, dk, dv, dpower.to(power.dtype), None


def missing_operators() -> list:
    """The operators this package registers that the loaded extension does not define (an
    extension built from other sources, e.g. before a ``git pull``)."""
    return [name for name in _fake_kernels() if not hasattr(getattr(torch.ops, _LIB), name)]


def _fake_kernels() -> dict:
    return {
        'laplacian_kernel_forward': _fake_laplacian_forward,
        'laplacian_kernel_backward': _fake_laplacian_backward,
        'newton_schulz_inverse': _fake_newton_schulz,
        'newton_schulz_inverse_backward': _fake_newton_schulz_backward,
        'polarity_linear_attention_forward': _fake_polarity_forward,
        'polarity_linear_attention_backward': _fake_polarity_backward,
    }


def register() -> None:
    """Register the fake kernels and autograd formulas (the extension must be loaded and define
    every operator, see :func:`missing_operators`)."""
    for name, fake in _fake_kernels().items():
        torch.library.register_fake(f'{_LIB}::{name}', fake)
    autograd = {
        'laplacian_kernel_forward': (_laplacian_backward, _laplacian_setup),
        'newton_schulz_inverse': (_newton_schulz_backward, _newton_schulz_setup),
        'polarity_linear_attention_forward': (_polarity_backward, _polarity_setup),
    }
    for name, (backward, setup) in autograd.items():
        torch.library.register_autograd(f'{_LIB}::{name}', backward, setup_context=setup)
