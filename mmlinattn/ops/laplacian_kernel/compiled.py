"""``laplacian_kernel``'s operators: schemas, fake kernels and the autograd formula, shared by
the C++ operators ``torch.ops.mmlinattn.laplacian_kernel_forward`` / ``..._backward``
(``ops/csrc/laplacian_kernel``) and the Triton ones (``triton.py``)."""
from ..registration import OperatorPair, register_defined

FORWARD, BACKWARD = 'laplacian_kernel_forward', 'laplacian_kernel_backward'


def _fake_forward(q, k, lam):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], k.shape[2]))


def _fake_backward(grad_out, q, k, out, lam, need_dq, need_dk):
    return (q.new_empty(q.shape) if need_dq else q.new_empty((0, )),
            k.new_empty(k.shape) if need_dk else k.new_empty((0, )))


def _autograd(backward_op):
    """``dq_ic = -sum_j g_ij sign(q_ic - k_jc)``, ``dk_jc = sum_i g_ij sign(q_ic - k_jc)`` with
    ``g = grad_out * out / lam``, computed by ``backward_op``."""

    def setup(ctx, inputs, output):
        q, k, lam = inputs
        ctx.save_for_backward(q, k, output)
        ctx.lam = lam

    def backward(ctx, grad_out):
        q, k, out = ctx.saved_tensors
        need_dq, need_dk = ctx.needs_input_grad[:2]
        dq, dk = backward_op(grad_out, q, k, out, ctx.lam, need_dq, need_dk)
        return (dq if need_dq else None), (dk if need_dk else None), None

    return backward, setup


OPERATORS = OperatorPair(
    forward_schema='(Tensor q, Tensor k, float lam) -> Tensor',
    backward_schema=('(Tensor grad_out, Tensor q, Tensor k, Tensor out, float lam, bool need_dq, '
                     'bool need_dk) -> (Tensor, Tensor)'),
    fake_forward=_fake_forward, fake_backward=_fake_backward, autograd=_autograd)


def register() -> None:
    """Fake kernels and autograd of the C++ operators (the extension must be loaded)."""
    register_defined(OPERATORS, FORWARD, BACKWARD)
