"""roi_align: the compiled CPU operators against the reference (and the reference against mmcv's
RoIAlign) forward and backward, in fp64, fp32 and bf16, both memory formats, rois partly or wholly
outside the map, both sampling modes and both alignments; thread-count independence; the
operators' registration (opcheck, torch.compile); dispatch and argument checks.

Tests of the compiled path use the ``compiled_ops`` fixture (conftest.py), so a missing extension
fails them."""
import pytest
import torch

from mmlinattn.ops import roi_align
from mmlinattn.ops.roi_align.reference import roi_align_reference
from op_asserts import assert_close_to_scale
from thread_counts import assert_equal_at_thread_counts

# dtype -> absolute tolerance relative to the largest reference entry: bf16 rounds the map and the
# output (8 bits), the sums run in fp32.
TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1.5e-2}
# (batch, channels, height, width, output size, spatial scale): channel counts on both sides of
# the backward's 16-channel block, a 1x1 map, a non-square output.
SHAPES = [(2, 5, 13, 17, (7, 7), 0.25), (1, 35, 9, 6, (3, 5), 0.5), (3, 64, 20, 11, (14, 14), 0.125),
          (2, 3, 1, 1, (2, 2), 1.0)]


def _rois(num, batch, height, width, scale, gen):
    """Rois in image pixels, some reaching outside the map, one empty and one inverted."""
    size = torch.tensor([width, height, width, height]) / scale
    corner = torch.rand(num, 2, generator=gen) * size[:2] * 1.3 - 0.15 * size[:2]
    extent = torch.rand(num, 2, generator=gen) * size[:2] * 0.8
    boxes = torch.cat([corner, corner + extent], 1)
    boxes[0, 2:] = boxes[0, :2]  # empty
    boxes[1, 2:] = boxes[1, :2] - 3  # inverted
    index = torch.randint(0, batch, (num, 1), generator=gen).double()
    return torch.cat([index, boxes.double()], 1)


def _inputs(shape, dtype, channels_last, seed=0, num_rois=9):
    batch, channels, height, width, output_size, scale = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, height, width, generator=gen).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    rois = _rois(num_rois, batch, height, width, scale, gen).float()
    grad = torch.randn(num_rois, channels, *output_size, generator=gen).to(dtype)
    return x, rois, grad


def _forward_backward(function, x, rois, grad, *args):
    leaf = x.detach().requires_grad_()
    out = function(leaf, rois, *args)
    return out, torch.autograd.grad(out, leaf, grad)[0]


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('sampling_ratio,aligned', [(0, True), (2, True), (0, False), (1, False)])
def test_compiled_equals_reference_forward_and_backward(compiled_ops, shape, dtype, channels_last,
                                                        sampling_ratio, aligned):
    x, rois, grad = _inputs(shape, dtype, channels_last)
    args = (shape[4], shape[5], sampling_ratio, aligned)
    out, dx = _forward_backward(roi_align, x, rois, grad, *args)
    assert out.dtype == dx.dtype == dtype
    assert out.shape == (len(rois), shape[1], *shape[4]) and dx.shape == x.shape
    # the reference in fp64 on the same (rounded) inputs
    want_out, want_dx = _forward_backward(roi_align_reference, x.double(), rois, grad.double(),
                                          *args)
    assert_close_to_scale(out, want_out, TOLERANCES[dtype])
    assert_close_to_scale(dx, want_dx, TOLERANCES[dtype])
    if sampling_ratio == 0 and aligned:  # the empty and the inverted roi have no samples
        assert not out[:2].any()


@pytest.mark.parametrize('sampling_ratio,aligned', [(0, True), (2, False)])
def test_reference_equals_mmcv(sampling_ratio, aligned):
    """The same numbers as mmcv's RoIAlign (fp32, its CPU kernel), forward and backward."""
    mmcv_ops = pytest.importorskip('mmcv.ops')
    x, rois, grad = _inputs((2, 6, 15, 12, (7, 7), 0.25), torch.float32, False, num_rois=12)
    rois, grad = rois[rois[:, 3] >= rois[:, 1]], grad[rois[:, 3] >= rois[:, 1]]  # mmcv rejects inverted rois

    def mmcv_roi_align(x, rois, *args):
        return mmcv_ops.roi_align(x, rois, *args[:3], 'avg', args[3])

    args = ((7, 7), 0.25, sampling_ratio, aligned)
    for got, want in zip(_forward_backward(roi_align_reference, x, rois, grad, *args),
                         _forward_backward(mmcv_roi_align, x, rois, grad, *args)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def thread_count_case():
    """The output and the input gradient of one fixed case (run at several thread counts)."""
    x, rois, grad = _inputs((2, 96, 16, 16, (7, 7), 0.25), torch.float32, False, num_rois=40)
    return _forward_backward(roi_align, x, rois, grad, 7, 0.25, 0, True)


def test_output_and_gradient_do_not_depend_on_the_thread_count(compiled_ops):
    assert_equal_at_thread_counts('test_ops_roi_align', 'thread_count_case')


def test_no_rois_give_an_empty_output_and_a_zero_gradient(compiled_ops):
    x, _, _ = _inputs((2, 8, 6, 6, (7, 7), 0.5), torch.float32, False)
    rois = torch.zeros(0, 5)
    out, dx = _forward_backward(roi_align, x, rois, torch.zeros(0, 8, 7, 7), 7, 0.5)
    assert out.shape == (0, 8, 7, 7) and dx.shape == x.shape and not dx.any()


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.bfloat16])
def test_opcheck(compiled_ops, dtype):
    """Schema, fake kernels, autograd registration and AOT dispatch."""
    for channels_last in (False, True):
        x, rois, grad = _inputs((2, 18, 6, 5, (3, 4), 0.5), dtype, channels_last)
        torch.library.opcheck(compiled_ops.roi_align_forward,
                              (x.requires_grad_(), rois, 3, 4, 0.5, 0, True))
        torch.library.opcheck(compiled_ops.roi_align_backward,
                              (grad, rois, list(x.shape), 0.5, 2, False))


def test_compiles_in_one_graph_with_the_same_gradients(compiled_ops):
    x, rois, grad = _inputs((2, 16, 12, 7, (7, 7), 0.5), torch.float32, True)
    eager = _forward_backward(roi_align, x, rois, grad, 7, 0.5)
    compiled = _forward_backward(torch.compile(roi_align, fullgraph=True), x, rois, grad, 7, 0.5)
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_half_inputs_run_the_fp32_kernel(compiled_ops):
    x, rois, grad = _inputs((2, 8, 9, 9, (7, 7), 0.5), torch.float16, False)
    out, dx = _forward_backward(roi_align, x, rois, grad, 7, 0.5)
    assert out.dtype == dx.dtype == torch.float16
    want = _forward_backward(roi_align_reference, x.double(), rois, grad.double(), (7, 7), 0.5)
    assert_close_to_scale(out, want[0], TOLERANCES[torch.bfloat16])
    assert_close_to_scale(dx, want[1], TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize('mode', ['reference', 'triton'])
def test_modes_without_this_kernel_run_the_reference(monkeypatch, mode):
    """MMLINATTN_OPS=reference forces the reference; the op has no Triton kernel, so under
    MMLINATTN_OPS=triton it runs as in auto (the compiled CPU kernel where built), without error."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    x, rois, grad = _inputs((1, 8, 5, 6, (3, 3), 1.0), torch.float64, False)
    got = _forward_backward(roi_align, x, rois, grad, 3)
    want = _forward_backward(roi_align_reference, x, rois, grad, (3, 3))
    for actual, expected in zip(got, want):
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('args,kwargs,match', [
    ((torch.ones(2, 3, 4), torch.zeros(1, 5), 7), {},
     r'input must have 4 dimensions, got shape \[2x3x4\]'),
    ((torch.ones(1, 3, 4, 4), torch.zeros(1, 4), 7), {},
     r'rois must be \[K, 5\] \(batch index, x1, y1, x2, y2\), got shape \[1x4\]'),
    ((torch.ones(1, 3, 4, 4), torch.zeros(1, 5, dtype=torch.int64), 7), {},
     r'rois must be a floating-point tensor, got dtype torch.int64'),
    ((torch.ones(1, 3, 4, 4), torch.zeros(1, 5, device='meta'), 7), {},
     r'rois is on meta but input is on cpu'),
    ((torch.ones(1, 3, 4, 4), torch.zeros(1, 5), (7, 0)), {},
     r'output_size must be a positive int or a pair of them, got \(7, 0\)'),
    ((torch.ones(1, 3, 4, 4), torch.zeros(1, 5), 7), dict(spatial_scale=0.0),
     r'spatial_scale must be a positive finite number, got 0.0'),
    ((torch.ones(1, 3, 4, 4), torch.zeros(1, 5), 7), dict(sampling_ratio=-1),
     r'sampling_ratio must be an int >= 0'),
    ((torch.ones(1, 3, 4, 4), torch.zeros(1, 5), 7), dict(aligned=1),
     r'aligned must be a bool, got 1'),
])
def test_bad_calls_raise_value_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        roi_align(*args, **kwargs)


def test_compiled_op_checks_the_rois_values(compiled_ops):
    """The kernel indexes the map with the rois' batch indices and sizes its loops by their
    extent: a bad value is an error, never a read outside the map or a loop without end."""
    x = torch.ones(2, 3, 4, 4)
    for index in (2.0, -1.0, float('nan')):
        with pytest.raises(IndexError, match=r'rois\[1, 0\] must be a batch index in \[0, 2\)'):
            roi_align(x, torch.tensor([[0, 0, 0, 2, 2], [index, 0, 0, 2, 2.]]), 2)
    with pytest.raises(ValueError, match=r'rois\[0\] spans .* pass a positive sampling_ratio'):
        roi_align(x, torch.tensor([[0, 0, 0, 1e9, 2.]]), 2)
    out = roi_align(x, torch.tensor([[0, float('nan'), 0, 2, 2.], [0, 0, 0, 1e9, 2.]]), 2,
                    sampling_ratio=2)  # a NaN roi has no samples; a huge one, two per side
    assert torch.isfinite(out).all() and not out[0].any()
    with pytest.raises(ValueError, match=r'grad_out must be \[K, C, ph, pw\] with K = 1 rois'):
        compiled_ops.roi_align_backward(torch.ones(2, 3, 2, 2), torch.zeros(1, 5), [2, 3, 4, 4],
                                        1.0, 0, True)
