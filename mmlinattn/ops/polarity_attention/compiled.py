"""``polarity_linear_attention``'s operators: schemas, fake kernels and the autograd formula,
shared by the C++ operators ``torch.ops.mmlinattn.polarity_linear_attention_forward`` /
``..._backward`` (``ops/csrc/polarity_attention``) and any other implementation of the same
schemas.

The saved state and normalisers are in the compute dtype (``validation.compute_dtype``)."""
from ..registration import OperatorPair, register_defined
from ..validation import compute_dtype

FORWARD = 'polarity_linear_attention_forward'
BACKWARD = 'polarity_linear_attention_backward'


def _fake_forward(q, k, v, power, eps):
    batch, heads, num_queries, head_dim = q.shape
    value_dim, acc = v.shape[3], compute_dtype(q.dtype)
    return (q.new_empty((batch, heads, num_queries, value_dim)),
            q.new_empty((batch, heads, 2 * head_dim, value_dim + 2), dtype=acc),
            q.new_empty((batch, heads, num_queries, 2), dtype=acc))


def _fake_backward(grad_out, q, k, v, power, out, state, den):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            power.new_empty(power.shape, dtype=compute_dtype(q.dtype)))


def _autograd(backward_op):
    """Gradients of q, k, v and power by ``backward_op`` from the saved state; the state and
    normalisers are not differentiable."""

    def setup(ctx, inputs, output):
        q, k, v, power, _ = inputs
        out, state, den = output
        ctx.save_for_backward(q, k, v, power, out, state, den)
        ctx.mark_non_differentiable(state, den)

    def backward(ctx, grad_out, grad_state, grad_den):
        q, k, v, power, out, state, den = ctx.saved_tensors
        dq, dk, dv, dpower = backward_op(grad_out, q, k, v, power, out, state, den)
        return dq, dk, dv, dpower.to(power.dtype), None

    return backward, setup


OPERATORS = OperatorPair(
    forward_schema='(Tensor q, Tensor k, Tensor v, Tensor power, float eps) -> (Tensor out, '
    'Tensor state, Tensor den)',
    backward_schema='(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor power, Tensor out, '
    'Tensor state, Tensor den) -> (Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor '
    'grad_power)',
    fake_forward=_fake_forward, fake_backward=_fake_backward, autograd=_autograd)


def register() -> None:
    """Fake kernels and autograd of the C++ operators (the extension must be loaded)."""
    register_defined(OPERATORS, FORWARD, BACKWARD)
