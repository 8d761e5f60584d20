"""``roi_align``'s operators: schemas, fake kernels and the autograd formula of the C++ operators
``torch.ops.mmlinattn.roi_align_forward`` / ``..._backward`` (``ops/csrc/roi_align``)."""
import torch

from ..registration import OperatorPair, register_defined

FORWARD, BACKWARD = 'roi_align_forward', 'roi_align_backward'


def _fake_forward(input, rois, pooled_height, pooled_width, spatial_scale, sampling_ratio,
                  aligned):
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))


def _fake_backward(grad_out, rois, input_size, spatial_scale, sampling_ratio, aligned):
    return grad_out.new_empty(input_size)


def _autograd(backward_op):
    """``d input[b, c, y, x] = sum over the samples that read (y, x) of weight / count * g``, by
    ``backward_op``; the rois get no gradient (as in mmcv)."""

    def setup(ctx, inputs, output):
        input, rois, _, _, spatial_scale, sampling_ratio, aligned = inputs
        ctx.save_for_backward(rois)
        ctx.input_size = input.shape
        ctx.args = (spatial_scale, sampling_ratio, aligned)

    def backward(ctx, grad_out):
        rois, = ctx.saved_tensors
        grad_input = None
        if ctx.needs_input_grad[0]:
            grad_input = backward_op(grad_out, rois, list(ctx.input_size), *ctx.args)
        return grad_input, None, None, None, None, None, None

    return backward, setup


OPERATORS = OperatorPair(
    forward_schema=('(Tensor input, Tensor rois, int pooled_height, int pooled_width, '
                    'float spatial_scale, int sampling_ratio, bool aligned) -> Tensor'),
    backward_schema=('(Tensor grad_out, Tensor rois, SymInt[] input_size, float spatial_scale, '
                     'int sampling_ratio, bool aligned) -> Tensor'),
    fake_forward=_fake_forward, fake_backward=_fake_backward, autograd=_autograd)


def register() -> None:
    """Fake kernels and autograd of the C++ operators (the extension must be loaded)."""
    register_defined(OPERATORS, FORWARD, BACKWARD)
