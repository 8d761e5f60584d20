"""patch_linear (a kernel-p, stride-p conv as one GEMM), PatchEmbed, and resize_pos_embed (the
bicubic resize as two matmuls): each equal to the PyTorch operation it replaces, forward and
backward, at sizes that are not multiples of anything."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmlinattn.models.layers import PatchEmbed, resize_pos_embed
from mmlinattn.models.layers.patch_embed import patch_linear


@pytest.mark.parametrize('patch,bias,size', [(4, True, (12, 20)), (8, False, (16, 8)),
                                             (2, True, (6, 10)), (1, True, (3, 5))])
def test_patch_linear_is_the_strided_conv_forward_and_backward(patch, bias, size):
    torch.manual_seed(0)
    conv = nn.Conv2d(5, 7, patch, stride=patch, bias=bias).double()
    image = torch.randn(2, 5, *size, dtype=torch.float64, requires_grad=True)
    expected = conv(image).permute(0, 2, 3, 1)
    got = patch_linear(image.permute(0, 2, 3, 1), conv)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(expected)
    params = [image, conv.weight] + ([conv.bias] if bias else [])
    want = torch.autograd.grad(expected, params, grad)
    have = torch.autograd.grad(got, params, grad)
    for h, w in zip(have, want):
        torch.testing.assert_close(h, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('size', [(13, 18), (16, 16), (1, 1)])
def test_patch_embed_is_pad_conv_flatten_norm(size):
    torch.manual_seed(0)
    embed = PatchEmbed(3, 8, patch_size=4).double()
    image = torch.randn(2, 3, *size, dtype=torch.float64)
    grid = (-(-size[0] // 4), -(-size[1] // 4))
    padded = F.pad(image, (0, 4 * grid[1] - size[1], 0, 4 * grid[0] - size[0]))
    expected = embed.norm(embed.proj(padded).flatten(2).transpose(1, 2))
    tokens, hw_shape = embed(image)
    assert hw_shape == grid
    torch.testing.assert_close(tokens, expected, rtol=1e-12, atol=1e-12)


def test_patch_embed_under_bf16_autocast_runs_the_gemm_in_bf16():
    embed = PatchEmbed(3, 16, patch_size=4)
    image = torch.randn(1, 3, 20, 28)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        tokens, _ = embed(image)
    expected, _ = embed(image)
    assert tokens.dtype == torch.bfloat16  # CPU autocast keeps the LayerNorm of a bf16 GEMM in bf16
    torch.testing.assert_close(tokens.float(), expected, rtol=0, atol=0.1)


def _interpolated(pos, src, dst, mode):
    grid = pos.reshape(1, *src, -1).permute(0, 3, 1, 2)
    return F.interpolate(grid, size=dst, mode=mode, align_corners=False).flatten(2).transpose(1, 2)


@pytest.mark.parametrize('mode', ['bicubic', 'bilinear'])
@pytest.mark.parametrize('src,dst', [((7, 7), (13, 21)), ((14, 14), (5, 3)), ((3, 4), (3, 9)),
                                     ((56, 56), (50, 84))])
def test_resize_pos_embed_equals_interpolate_forward_and_backward(mode, src, dst):
    torch.manual_seed(0)
    pos = torch.randn(1, src[0] * src[1], 6, dtype=torch.float64, requires_grad=True)
    expected = _interpolated(pos, src, dst, mode)
    got = resize_pos_embed(pos, src, dst, mode=mode)
    assert got.shape == (1, dst[0] * dst[1], 6)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(expected)
    torch.testing.assert_close(torch.autograd.grad(got, pos, grad)[0],
                               torch.autograd.grad(expected, pos, grad)[0], rtol=1e-12, atol=1e-12)


def test_resize_pos_embed_keeps_the_parameter_at_its_own_size_and_checks_the_shape():
    pos = torch.randn(1, 12, 4)
    assert resize_pos_embed(pos, (3, 4), (3, 4)) is pos
    with pytest.raises(ValueError, match=r'pos_embed must be \[1, 3\*5, C\]'):
        resize_pos_embed(pos, (3, 5), (6, 10))


def test_resize_pos_embed_keeps_the_dtype():
    pos = torch.randn(1, 49, 8)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        out = resize_pos_embed(pos.to(dtype), (7, 7), (9, 11))
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), _interpolated(pos.double(), (7, 7), (9, 11), 'bicubic'),
                                   rtol=0, atol=0.05 if dtype == torch.bfloat16 else 1e-5)
