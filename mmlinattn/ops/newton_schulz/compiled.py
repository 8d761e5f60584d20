"""``newton_schulz_inverse``'s operators: schemas, fake kernels and the autograd formula, shared
by the C++ operators ``torch.ops.mmlinattn.newton_schulz_inverse`` / ``..._backward``
(``ops/csrc/newton_schulz``) and any other implementation of the same schemas.

The forward's outputs are in the compute dtype (``validation.compute_dtype``)."""
from ..registration import OperatorPair, register_defined
from ..validation import compute_dtype

FORWARD, BACKWARD = 'newton_schulz_inverse', 'newton_schulz_inverse_backward'


def _fake_forward(a, iters, eps, with_residual):
    dtype = compute_dtype(a.dtype)
    return (a.new_empty(a.shape, dtype=dtype),
            a.new_empty((a.shape[0] if with_residual else 0, ), dtype=dtype))


def _fake_backward(grad_v, a, iters, eps):
    return a.new_empty(a.shape)


def _autograd(backward_op):
    """The gradient of the computed iterate with respect to ``a``, by ``backward_op``; the
    residual is not differentiable."""

    def setup(ctx, inputs, output):
        a, iters, eps, _ = inputs
        ctx.save_for_backward(a)
        ctx.iters, ctx.eps = iters, eps
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, grad_v, grad_residual):
        (a, ) = ctx.saved_tensors
        return backward_op(grad_v, a, ctx.iters, ctx.eps), None, None, None

    return backward, setup


OPERATORS = OperatorPair(
    forward_schema='(Tensor a, int iters, float eps, bool with_residual) -> (Tensor, Tensor)',
    backward_schema='(Tensor grad_v, Tensor a, int iters, float eps) -> Tensor',
    fake_forward=_fake_forward, fake_backward=_fake_backward, autograd=_autograd)


def register() -> None:
    """Fake kernels and autograd of the C++ operators (the extension must be loaded)."""
    register_defined(OPERATORS, FORWARD, BACKWARD)
