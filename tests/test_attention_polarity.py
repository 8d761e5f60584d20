"""PolarityAttention against an independent step-by-step implementation of its formulas
(docs/models/polaformer.md, "The attention")."""
import math

import pytest
import torch
import torch.nn.functional as F

from mmlinattn.models.layers import PolarityAttention


def polarity_attention_by_the_formulas(attn: PolarityAttention, x, hw_shape):
    """The formulas of docs/models/polaformer.md written out with einsum, reading the module's
    parameters (fp64 in the tests)."""
    batch, num_tokens, channels = x.shape
    height, width = hw_shape
    heads, d = attn.num_heads, channels // attn.num_heads
    if attn.fused_qkvg:
        projected = x @ attn.qkvg.weight.T + attn.qkvg.bias
        q, k, v, g = (projected[..., i * channels:(i + 1) * channels] for i in range(4))
        kv_grid = (height, width)
    else:
        qg = x @ attn.qg.weight.T + attn.qg.bias
        q, g = qg[..., :channels], qg[..., channels:]
        x_kv, kv_grid = x, (height, width)
        if attn.sr_ratio > 1:
            image = x.transpose(1, 2).reshape(batch, channels, height, width)
            reduced = F.conv2d(image, attn.sr.weight, attn.sr.bias, stride=attn.sr_ratio)
            kv_grid = tuple(reduced.shape[-2:])
            x_kv = F.layer_norm(reduced.flatten(2).transpose(1, 2), (channels, ), attn.norm.weight,
                                attn.norm.bias, attn.norm.eps)
        kv = x_kv @ attn.kv.weight.T + attn.kv.bias
        k, v = kv[..., :channels], kv[..., channels:]
    n = kv_grid[0] * kv_grid[1]

    # k + pos, the learned grid resized bicubically to the key grid
    pos_grid = attn.positional_encoding.reshape(1, *attn.pos_grid, channels).permute(0, 3, 1, 2)
    pos = F.interpolate(pos_grid, size=kv_grid, mode='bicubic', align_corners=False)
    k = k + pos.flatten(2).transpose(1, 2)

    s = torch.log1p(torch.exp(attn.scale))  # softplus
    q, k = q / s, k / s
    p = 1 + 4 * torch.sigmoid(attn.power.reshape(heads, d))

    qh = q.reshape(batch, num_tokens, heads, d)  # [B, N, h, d]
    kh = k.reshape(batch, n, heads, d)
    vh = v.reshape(batch, n, heads, d)
    q_pos, q_neg = torch.clamp(qh, min=0)**p, torch.clamp(-qh, min=0)**p
    k_pos, k_neg = torch.clamp(kh, min=0)**p, torch.clamp(-kh, min=0)**p
    phi_same = torch.cat([q_pos, q_neg], -1)  # [B, N, h, 2d]
    phi_opp = torch.cat([q_neg, q_pos], -1)
    phi_k = torch.cat([k_pos, k_neg], -1)  # [B, n, h, 2d]
    v1, v2 = vh[..., :d // 2], vh[..., d // 2:]
    z = phi_k.mean(dim=1)  # [B, h, 2d]
    kv1 = torch.einsum('bjhc,bjhe->bhce', phi_k / math.sqrt(n), v1 / math.sqrt(n))
    kv2 = torch.einsum('bjhc,bjhe->bhce', phi_k / math.sqrt(n), v2 / math.sqrt(n))
    x_same = torch.einsum('bihc,bhce->bihe', phi_same, kv1) / (
        torch.einsum('bihc,bhc->bih', phi_same, z)[..., None] + 1e-6)
    x_opp = torch.einsum('bihc,bhce->bihe', phi_opp, kv2) / (
        torch.einsum('bihc,bhc->bih', phi_opp, z)[..., None] + 1e-6)
    y = torch.cat([x_same, x_opp], -1).reshape(batch, num_tokens, channels)

    # depthwise 5x5 conv on v, one d-channel kernel shared by the heads; v stretched to N tokens
    v_seq = vh.permute(0, 2, 3, 1)  # [B, h, d, n]
    if n != num_tokens:
        v_seq = F.interpolate(v_seq.reshape(batch * heads, d, n), size=num_tokens, mode='linear')
    v_img = v_seq.reshape(batch * heads, d, num_tokens).transpose(1, 2).reshape(
        batch * heads, height, width, d).permute(0, 3, 1, 2)
    local = F.conv2d(v_img, attn.dwc.weight, attn.dwc.bias, padding=2, groups=d)
    local = local.reshape(batch, heads * d, num_tokens).transpose(1, 2)
    return ((y + local) * g) @ attn.proj.weight.T + attn.proj.bias


def _randomised(attn: PolarityAttention, seed: int = 0) -> PolarityAttention:
    """Non-trivial values for every parameter (power, scale and positional encoding start at 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.5)
    return attn


CASES = [
    # embed_dims, heads, pos_grid, sr, fused, (H, W)
    pytest.param(16, 2, (4, 6), 1, False, (5, 7), id='pvt-sr1-resized-nonsquare'),
    pytest.param(16, 2, (5, 7), 1, False, (5, 7), id='pvt-sr1-native-grid'),
    pytest.param(24, 3, (2, 2), 2, False, (6, 10), id='pvt-sr2-resized'),
    pytest.param(16, 4, (3, 3), 3, False, (7, 8), id='pvt-sr3-floor'),
    pytest.param(16, 2, (6, 6), 1, True, (4, 9), id='swin-qkvg-resized'),
]


@pytest.mark.parametrize('dims,heads,pos_grid,sr,fused,hw', CASES)
def test_matches_formulas_fp64_forward_and_backward(dims, heads, pos_grid, sr, fused, hw):
    attn = _randomised(PolarityAttention(dims, heads, pos_grid, sr_ratio=sr, fused_qkvg=fused)).double()
    x = torch.randn(2, hw[0] * hw[1], dims, dtype=torch.float64, requires_grad=True)
    out = attn(x, hw)
    ref = polarity_attention_by_the_formulas(attn, x, hw)
    assert out.shape == (2, hw[0] * hw[1], dims)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)

    grad_out = torch.randn_like(out)
    params = [x] + list(attn.parameters())
    grads = torch.autograd.grad(out, params, grad_out)
    ref_grads = torch.autograd.grad(ref, params, grad_out)
    names = ['x'] + [name for name, _ in attn.named_parameters()]
    for name, got, want in zip(names, grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10, msg=lambda m: f'{name}: {m}')


def test_parameter_names_are_the_official_ones():
    pvt = PolarityAttention(64, 1, (7, 7), sr_ratio=2)
    assert {n.split('.')[0] for n, _ in pvt.named_parameters()} == {
        'qg', 'kv', 'sr', 'norm', 'dwc', 'power', 'scale', 'positional_encoding', 'proj'}
    swin = PolarityAttention(96, 3, (56, 56), fused_qkvg=True)
    shapes = {n: tuple(p.shape) for n, p in swin.named_parameters()}
    assert shapes['qkvg.weight'] == (384, 96)
    assert shapes['power'] == (1, 3, 1, 32)
    assert shapes['scale'] == (1, 1, 96)
    assert shapes['positional_encoding'] == (1, 56 * 56, 96)
    assert shapes['dwc.weight'] == (32, 1, 5, 5)


def test_power_stays_between_one_and_one_plus_alpha():
    attn = PolarityAttention(16, 2, (4, 4))
    with torch.no_grad():
        attn.power.copy_(torch.linspace(-20, 20, 16).reshape(1, 2, 1, 8))
    p = attn.double().feature_power()
    assert (p > 1).all() and (p < 5).all()
    # saturated: the power reaches the bounds, and the attention stays finite with gradients
    attn = _randomised(PolarityAttention(16, 2, (4, 4)))
    with torch.no_grad():
        attn.power.copy_(torch.tensor([-1e4, 1e4]).repeat(8).reshape(1, 2, 1, 8))
    p = attn.feature_power()
    assert (p >= 1).all() and (p <= 5).all()
    x = torch.randn(2, 16, 16, requires_grad=True)
    out = attn(x, (4, 4))
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(param.grad).all() for param in attn.parameters())


def cpu_autocast_takes(dtype) -> bool:
    """torch < 2.2 has CPU autocast for bf16 only."""
    try:
        with torch.autocast('cpu', dtype=dtype):
            return True
    except RuntimeError:
        return False


def _random_polarity_attention(*args, **kwargs):
    torch.manual_seed(0)
    attn = PolarityAttention(*args, **kwargs)
    with torch.no_grad():
        attn.power.normal_()
        attn.scale.normal_()
        attn.positional_encoding.normal_()
    return attn


@pytest.mark.skipif(not cpu_autocast_takes(torch.float16), reason='this torch has no fp16 CPU autocast')
def test_fp16_autocast_runs_the_attention_in_fp32():
    attn = _random_polarity_attention(32, 2, (6, 6))
    x = torch.randn(2, 48, 32)
    with torch.autocast('cpu', dtype=torch.float16):
        q, *_ = attn.attention_inputs(x, (6, 8))
        out = attn(x, (6, 8))
        # |q / s| reaches ~90 here: its 5th power overflows fp16, so the powers must run in fp32
        large = attn(8 * x, (6, 8))
    assert q.dtype == torch.float32 and out.dtype == torch.float16
    reference = attn(x, (6, 8))
    assert ((out.float() - reference).norm() / reference.norm()).item() < 2e-2
    assert torch.isfinite(large).all()


# bf16 rounds q, k, v and the power p to 8 bits: the output is off by 0.6-1.1% (norm-wise), the
# gradients by 1-5.4%, most for the power, scale and positional encoding, whose gradients see the
# per-channel rounding of p (up to 2^-6 at p > 4) through every |x|^p. With the attention in fp32
# (fp16's rule) these were 0.4-0.7% and 0.2-1.6%.
BF16_TOLERANCE = 7e-2


@pytest.mark.parametrize('hw, fused, sr', [((6, 8), True, 1), ((7, 9), False, 1), ((11, 5), False, 2),
                                           ((13, 17), True, 1)])
def test_bf16_autocast_runs_the_attention_in_bf16(hw, fused, sr):
    """bf16 has fp32's exponent range: after the projections the layer stays in bf16 (no fp32
    copies), and forward and backward match fp32 within bf16's error, at odd grid sizes too."""
    attn = _random_polarity_attention(32, 2, (6, 6), sr_ratio=sr, fused_qkvg=fused)
    x = torch.randn(2, hw[0] * hw[1], 32)
    x32, x16 = x.clone().requires_grad_(), x.clone().requires_grad_()
    reference = attn(x32, hw)
    reference.square().sum().backward()
    grads32 = {name: p.grad.clone() for name, p in attn.named_parameters()}
    attn.zero_grad()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        q, k, v, g, power, _ = attn.attention_inputs(x16, hw)
        out = attn(x16, hw)
        large = attn(8 * x16, hw)
    out.float().square().sum().backward()
    assert all(t.dtype == torch.bfloat16 for t in (q, k, v, g, power, out))
    assert torch.isfinite(large).all()

    def relative(a, b):
        return ((a.float() - b).norm() / b.norm()).item()

    assert relative(out, reference) < BF16_TOLERANCE
    assert relative(x16.grad, x32.grad) < BF16_TOLERANCE
    for name, param in attn.named_parameters():
        assert relative(param.grad, grads32[name]) < BF16_TOLERANCE, name


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='even'):
        PolarityAttention(15, 5, (4, 4))
    with pytest.raises(ValueError, match='sr_ratio=1'):
        PolarityAttention(16, 2, (4, 4), sr_ratio=2, fused_qkvg=True)
    attn = PolarityAttention(16, 2, (4, 4))
    with pytest.raises(ValueError, match=r'x must be \[B, H\*W, 16\]'):
        attn(torch.randn(1, 15, 16), (4, 4))
    with pytest.raises(ValueError, match='smaller than sr_ratio'):
        PolarityAttention(16, 2, (1, 1), sr_ratio=4)(torch.randn(1, 6, 16), (2, 3))


@pytest.mark.parametrize('mode', ['reference', 'auto'])
def test_get_flops_counts_the_op_as_the_reference_products(mode, monkeypatch):
    """tools/get_flops.py: the fused op's handle gives the FLOPs of the reference's matmuls."""
    import importlib.util
    import os

    from mmengine.analysis import FlopAnalyzer

    from mmlinattn.ops import polarity_linear_attention
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location('get_flops', os.path.join(root, 'tools', 'get_flops.py'))
    get_flops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(get_flops)

    class Op(torch.nn.Module):
        def forward(self, q, k, v, power):
            return polarity_linear_attention(q, k, v, power)

    monkeypatch.setenv('MMLINATTN_OPS', mode)
    batch, heads, num_q, num_kv, d, dv = 2, 3, 50, 40, 8, 6
    inputs = (torch.randn(batch, heads, num_q, d), torch.randn(batch, heads, num_kv, d),
              torch.randn(batch, heads, num_kv, dv), torch.rand(heads, d) + 1)
    analyzer = FlopAnalyzer(Op(), inputs)
    analyzer.set_op_handle(**get_flops.OP_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    expected = batch * heads * (2 * num_kv * d * dv + 2 * num_q * d * dv + 4 * num_q * d)
    assert analyzer.total() == expected
