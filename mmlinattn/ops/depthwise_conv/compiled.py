"""``depthwise_conv2d``'s operators: schemas, fake kernels and the autograd formula of the C++
operators ``torch.ops.mmlinattn.depthwise_conv2d_forward`` / ``..._backward``
(``ops/csrc/depthwise_conv``)."""
import torch

from ..registration import OperatorPair, register_defined

FORWARD, BACKWARD = 'depthwise_conv2d_forward', 'depthwise_conv2d_backward'


def _layout_of(t: torch.Tensor) -> torch.memory_format:
    """The memory format of a result that follows ``t``, as the kernels choose it: channels-last
    when ``t`` is channels-last and not also plainly contiguous."""
    channels_last = t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
    return torch.channels_last if channels_last else torch.contiguous_format


def _fake_forward(x, weight, bias):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=_layout_of(x))


def _fake_backward(grad_out, x, weight, need_dx, need_dweight, need_dbias):
    empty = x.new_empty((0, ))
    dx = (torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=_layout_of(grad_out))
          if need_dx else empty)
    return (dx, weight.new_empty(weight.shape) if need_dweight else empty,
            x.new_empty((x.shape[1], )) if need_dbias else empty)


def _autograd(backward_op):
    """``dx = conv(g, flip(w))``, ``dw[c, ky, kx] = sum g[:, c] x_shifted[:, c]``,
    ``dbias = sum g`` by ``backward_op``."""

    def setup(ctx, inputs, output):
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        need_dx, need_dweight, need_dbias = ctx.needs_input_grad
        dx, dweight, dbias = backward_op(grad_out, x, weight, need_dx, need_dweight,
                                         bool(need_dbias and ctx.has_bias))
        return (dx if need_dx else None, dweight if need_dweight else None,
                dbias if need_dbias and ctx.has_bias else None)

    return backward, setup


OPERATORS = OperatorPair(
    forward_schema='(Tensor x, Tensor weight, Tensor? bias) -> Tensor',
    backward_schema=('(Tensor grad_out, Tensor x, Tensor weight, bool need_dx, bool need_dweight, '
                     'bool need_dbias) -> (Tensor, Tensor, Tensor)'),
    fake_forward=_fake_forward, fake_backward=_fake_backward, autograd=_autograd)


def register() -> None:
    """Fake kernels and autograd of the C++ operators (the extension must be loaded)."""
    register_defined(OPERATORS, FORWARD, BACKWARD)
