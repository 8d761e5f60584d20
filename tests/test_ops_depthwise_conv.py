"""depthwise_conv2d: the compiled CPU operators against the reference (``F.conv2d`` with
``groups = C``) forward and backward, in fp64, fp32 and bf16, both memory formats, odd sizes and
kernels; the operators' registration (opcheck, torch.compile); dispatch and argument checks.

Tests of the compiled path use the ``compiled_ops`` fixture (conftest.py), so a missing extension
fails them."""
import pytest
import torch
import torch.nn.functional as F

from mmlinattn.ops import depthwise_conv2d
from mmlinattn.ops.depthwise_conv.reference import depthwise_conv2d_reference
from op_asserts import assert_close_to_scale
from thread_counts import assert_equal_at_thread_counts

# dtype -> (rtol, atol) of the compiled op against the reference computed in fp64, relative to
# the largest reference entry: bf16 rounds its inputs and outputs (8 bits), the sums run in fp32.
TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1.5e-2}
# (batch, channels, height, width, kernel): channel counts on both sides of the 16-lane register
# block, maps smaller than the kernel, a 1x1 kernel.
SHAPES = [(2, 5, 7, 9, 3), (1, 16, 5, 3, 5), (2, 35, 11, 6, 9), (3, 64, 13, 17, 5), (1, 8, 4, 4, 1),
          (2, 33, 1, 1, 3)]


def _inputs(shape, dtype, channels_last, bias=True, seed=0):
    batch, channels, height, width, k = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, height, width, generator=gen).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(channels, 1, k, k, generator=gen).to(dtype)
    b = torch.randn(channels, generator=gen).to(dtype) if bias else None
    grad = torch.randn(batch, channels, height, width, generator=gen).to(dtype)
    return x, weight, b, grad


def _forward_backward(function, x, weight, bias, grad):
    leaves = [t.detach().requires_grad_() for t in (x, weight) + (() if bias is None else (bias, ))]
    out = function(*leaves[:2], leaves[2] if bias is not None else None)
    return (out, ) + torch.autograd.grad(out, leaves, grad)


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('bias', [True, False])
def test_compiled_equals_reference_forward_and_backward(compiled_ops, shape, dtype, channels_last,
                                                        bias):
    x, weight, b, grad = _inputs(shape, dtype, channels_last, bias)
    got = _forward_backward(depthwise_conv2d, x, weight, b, grad)
    # the reference in fp64 on the same (rounded) inputs
    expected = _forward_backward(depthwise_conv2d_reference, x.double(), weight.double(),
                                 None if b is None else b.double(), grad.double())
    assert got[0].dtype == dtype and got[0].shape == x.shape
    for actual, want in zip(got, expected):
        assert_close_to_scale(actual, want, TOLERANCES[dtype])


@pytest.mark.parametrize('channels_last', [False, True])
def test_output_and_input_gradient_keep_the_memory_format(compiled_ops, channels_last):
    x, weight, b, grad = _inputs((2, 24, 6, 10, 3), torch.float32, channels_last)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out, dx, _, _ = _forward_backward(depthwise_conv2d, x, weight, b,
                                      grad.contiguous(memory_format=fmt))
    assert out.is_contiguous(memory_format=fmt) and dx.is_contiguous(memory_format=fmt)


def test_only_the_requested_gradients_are_computed(compiled_ops):
    x, weight, b, grad = _inputs((2, 20, 9, 7, 5), torch.float32, True)
    full = _forward_backward(depthwise_conv2d_reference, x, weight, b, grad)
    for wanted in ((True, False, False), (False, True, False), (False, False, True)):
        dx, dw, db = compiled_ops.depthwise_conv2d_backward(grad, x, weight, *wanted)
        for need, got, expected in zip(wanted, (dx, dw, db), full[1:]):
            if need:
                torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            else:
                assert got.numel() == 0


def weight_gradient_case():
    """The weight and bias gradients of one fixed case (run at several thread counts)."""
    x, weight, b, grad = _inputs((3, 48, 40, 23, 9), torch.float32, True)
    return torch.ops.mmlinattn.depthwise_conv2d_backward(grad, x, weight, False, True, True)[1:]


def test_weight_gradient_does_not_depend_on_the_thread_count(compiled_ops):
    assert_equal_at_thread_counts('test_ops_depthwise_conv', 'weight_gradient_case')


def test_autocast_runs_it_in_the_autocast_dtype(compiled_ops):
    x, weight, b, grad = _inputs((2, 16, 8, 8, 5), torch.float32, True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = depthwise_conv2d(x, weight, b)
        expected = F.conv2d(x, weight, b, padding=2, groups=16)  # what autocast makes of the conv
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.bfloat16])
def test_opcheck(compiled_ops, dtype):
    """Schema, fake kernels (memory formats included), autograd registration and AOT dispatch."""
    for channels_last in (False, True):
        x, weight, b, grad = _inputs((2, 18, 6, 5, 3), dtype, channels_last)
        torch.library.opcheck(compiled_ops.depthwise_conv2d_forward,
                              (x.requires_grad_(), weight.requires_grad_(), b.requires_grad_()))
        torch.library.opcheck(compiled_ops.depthwise_conv2d_forward,
                              (x.detach().requires_grad_(), weight, None))
        torch.library.opcheck(compiled_ops.depthwise_conv2d_backward,
                              (grad, x.detach(), weight.detach(), True, True, True))


def test_compiles_in_one_graph_with_the_same_gradients(compiled_ops):
    x, weight, b, grad = _inputs((2, 16, 12, 7, 5), torch.float32, True)
    eager = _forward_backward(depthwise_conv2d, x, weight, b, grad)
    compiled = _forward_backward(torch.compile(depthwise_conv2d, fullgraph=True), x, weight, b, grad)
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('mode', ['reference', 'triton'])
def test_modes_without_this_kernel_run_the_reference(monkeypatch, mode):
    """MMLINATTN_OPS=reference forces the reference; the op has no Triton kernel, so under
    MMLINATTN_OPS=triton it runs as in auto (the compiled CPU kernel where built), without error."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    x, weight, b, grad = _inputs((1, 8, 5, 6, 3), torch.float64, False)
    got = _forward_backward(depthwise_conv2d, x, weight, b, grad)
    want = _forward_backward(depthwise_conv2d_reference, x, weight, b, grad)
    for actual, expected in zip(got, want):
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('args,match', [
    ((torch.ones(2, 3, 4), torch.ones(3, 1, 3, 3)), r'x must have 4 dimensions, got shape \[2x3x4\]'),
    ((torch.ones(1, 3, 4, 4), torch.ones(3, 1, 2, 2)),
     r'weight must be \[C, 1, k, k\] with C = x.shape\[1\] = 3 and k odd, got shape \[3x1x2x2\]'),
    ((torch.ones(1, 3, 4, 4), torch.ones(4, 1, 3, 3)),
     r'weight must be \[C, 1, k, k\] with C = x.shape\[1\] = 3'),
    ((torch.ones(1, 3, 4, 4), torch.ones(3, 2, 3, 3)), r'weight must be \[C, 1, k, k\]'),
    ((torch.ones(1, 3, 4, 4), torch.ones(3, 1, 3, 3), torch.ones(4)),
     r'bias must be \[C\] with C = x.shape\[1\] = 3, got shape \[4\]'),
    ((torch.ones(1, 3, 4, 4, dtype=torch.int64), torch.ones(3, 1, 3, 3)),
     r'x must be a floating-point tensor, got dtype torch.int64'),
    ((torch.ones(1, 3, 4, 4), torch.ones(3, 1, 3, 3, device='meta')),
     r'weight is on meta but x is on cpu'),
])
def test_bad_calls_raise_value_error(args, match):
    with pytest.raises(ValueError, match=match):
        depthwise_conv2d(*args)


def test_compiled_op_checks_its_own_arguments(compiled_ops):
    x = torch.ones(1, 3, 4, 4)
    with pytest.raises(ValueError, match=r'weight must be \[C, 1, k, k\]'):
        compiled_ops.depthwise_conv2d_forward(x, torch.ones(3, 1, 2, 2), None)
    with pytest.raises(ValueError, match=r'weight must have x\'s dtype'):
        compiled_ops.depthwise_conv2d_forward(x, torch.ones(3, 1, 3, 3, dtype=torch.float64), None)
    with pytest.raises(ValueError, match=r'grad_out must have x\'s shape'):
        compiled_ops.depthwise_conv2d_backward(torch.ones(1, 3, 4, 5), x, torch.ones(3, 1, 3, 3),
                                               True, True, True)


@pytest.mark.cuda
def test_cuda_runs_the_reference():
    x, weight, b, grad = _inputs((2, 16, 9, 7, 5), torch.float32, True)
    got = _forward_backward(depthwise_conv2d, *(t.cuda() for t in (x, weight, b, grad)))
    want = _forward_backward(depthwise_conv2d_reference, x, weight, b, grad)
    for actual, expected in zip(got, want):
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-4)
