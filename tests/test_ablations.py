"""The ablation switches (docs/ablations.md): each one against an independent computation of what it
says, forward and backward, through the registries, in the analysis rows, with clear errors."""
import math

import pytest
import torch
import torch.nn.functional as F

from analysis import attention_streams, record_attentions
from mmlinattn.models.backbones import LaplacianFormer, PolaPVT, PolaSwin
from mmlinattn.models.layers import LaplacianAttention, PolarityAttention
from mmlinattn.models.layers.laplacian_attention import (cholesky_solve_spd, conjugate_gradient_solve,
                                                         gaussian_kernel)
from mmlinattn.registry import MODELS

# narrow, shallow variants: the options act in every layer, the widths do not matter here
LAPLACIAN_NARROW = dict(embed_dims=[32, 64, 96, 128], num_heads=[2, 2, 3, 4], depths=[1, 1, 1, 1])
POLA_NARROW = {PolaPVT: dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], depths=[1, 1, 1, 1]),
               PolaSwin: dict(embed_dims=16, depths=[1, 1, 2, 2], num_heads=[1, 2, 4, 8])}


def _randomise(module, seed=0, std=0.5):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * std)
    return module


def _forward_backward(fn, params, x, *args):
    """``fn(x, *args)`` and the gradients of its squared sum with respect to x and ``params``."""
    x = x.clone().requires_grad_(True)
    out = fn(x, *args)
    grads = torch.autograd.grad(out.square().sum(), [x] + list(params))
    return out, grads


# ------------------------------------------------------------------ LaplacianAttention options


def _split_heads(t, heads):
    batch, tokens, channels = t.shape
    return t.reshape(batch, tokens, heads, channels // heads).transpose(1, 2)


def nystrom_by_hand(attn: LaplacianAttention, x, hw_shape, query_scale, kernel):
    """The attention written out in fp64: dense kernels from pairwise differences, ``torch.linalg.inv``
    of the shifted landmark Gram matrix, the clamped row normaliser, the local branch and the
    projection."""
    batch, tokens, channels = x.shape
    q = _split_heads(F.linear(x, attn.q.weight, attn.q.bias), attn.num_heads) * query_scale
    v = _split_heads(F.linear(x, attn.v.weight, attn.v.bias), attn.num_heads)
    if attn.landmark_ratio > 1:
        landmarks = attn.landmarks(q, hw_shape)
        eye = torch.eye(landmarks.shape[-2], dtype=x.dtype)
        inverse = torch.linalg.inv(kernel(landmarks, landmarks) + attn.landmark_shift * eye)
        cross = kernel(q, landmarks)
        weights = cross @ inverse @ cross.transpose(-2, -1)
    else:
        weights = kernel(q, q)
    y = (weights @ v) / (weights @ torch.ones_like(v[..., :1])).clamp(min=attn.den_eps)
    y = y.transpose(1, 2).reshape(batch, tokens, channels)
    v_image = v.transpose(-2, -1).reshape(batch, channels, *hw_shape)
    y = y + attn.local_conv(v_image).flatten(2).transpose(1, 2)
    return attn.proj(y)


def dense_gaussian(a, b):
    return torch.exp(-(a[..., :, None, :] - b[..., None, :, :]).square().sum(-1) / 2)


def dense_laplacian(lam):
    return lambda a, b: torch.exp(-(a[..., :, None, :] - b[..., None, :, :]).abs().sum(-1) / lam)


@pytest.mark.parametrize('ratio,hw', [(4, (9, 11)), (1, (5, 6))], ids=['nystrom', 'exact-stage'])
def test_gaussian_kernel_is_softs_gaussian_nystrom_in_fp64(ratio, hw):
    torch.manual_seed(0)
    attn = LaplacianAttention(32, 2, ratio, local_kernel_size=3, kernel='gaussian').double()
    _randomise(attn, std=0.15)  # larger q: far landmarks, row sums near 0 (clamped, see den_eps)
    x = torch.randn(2, hw[0] * hw[1], 32, dtype=torch.float64)
    head_dims = 16
    params = list(attn.parameters())
    out, grads = _forward_backward(attn, params, x, hw)
    ref, ref_grads = _forward_backward(
        lambda t, shape: nystrom_by_hand(attn, t, shape, head_dims**-0.25, dense_gaussian), params,
        x, hw)
    assert attn.scale == head_dims**-0.25 and attn.lam is None
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
    # the Laplacian model on the same weights computes something else
    laplacian = LaplacianAttention(32, 2, ratio, local_kernel_size=3).double()
    laplacian.load_state_dict(attn.state_dict())
    assert (laplacian(x, hw) - out).abs().max() > 1e-3


def test_gaussian_kernel_matmul_form_equals_the_distances_and_never_goes_above_one():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 7, 5, generator=gen, dtype=torch.float64) * 3
    b = torch.cat([a[:, :, :2], torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64)], dim=2)
    torch.testing.assert_close(gaussian_kernel(a, b), dense_gaussian(a, b), rtol=1e-10, atol=1e-12)
    same = gaussian_kernel(a.float(), a.float())  # rounding can make |a|^2 + |a|^2 - 2 a.a < 0
    assert (same <= 1).all()


def _landmark_attention(**kwargs):
    torch.manual_seed(0)
    attn = LaplacianAttention(32, 2, 4, local_kernel_size=3, **kwargs).double()
    return _randomise(attn, std=0.3)


def test_exact_inverse_equals_newton_schulz_at_convergence():
    x = torch.randn(2, 12 * 12, 32, dtype=torch.float64)
    exact = _landmark_attention(inverse='exact')
    converged = _landmark_attention(ns_iters=80)
    short = _landmark_attention(ns_iters=3)
    out_exact, grads_exact = _forward_backward(exact, exact.parameters(), x, (12, 12))
    out_ns, grads_ns = _forward_backward(converged, converged.parameters(), x, (12, 12))
    torch.testing.assert_close(out_exact, out_ns, rtol=1e-9, atol=1e-10)
    for got, want in zip(grads_exact, grads_ns):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
    assert (short(x, (12, 12)) - out_exact).abs().max() > 1e-4  # 3 steps are far from converged
    ref = nystrom_by_hand(exact, x, (12, 12), 16**-0.5, dense_laplacian(4.0))
    torch.testing.assert_close(out_exact, ref, rtol=1e-9, atol=1e-10)


def test_conjugate_gradient_converges_to_the_exact_solve():
    x = torch.randn(2, 12 * 12, 32, dtype=torch.float64)
    exact = _landmark_attention(inverse='exact')(x, (12, 12))
    errors = [(_landmark_attention(inverse='conjugate_gradient', cg_iters=n)(x, (12, 12)) - exact)
              .abs().max().item() for n in (1, 3, 9, 30)]
    assert errors[0] > 1e-3 and errors[-1] < 1e-9, errors
    assert all(later < earlier for earlier, later in zip(errors, errors[1:])), errors


def test_solvers_on_an_ill_conditioned_spd_system():
    """CG and Cholesky against ``torch.linalg.solve`` (fp64, condition number 1e4, 24 unknowns);
    CG's relative residual falls with the steps and its gradient is autograd's."""
    gen = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(3, 24, 24, generator=gen, dtype=torch.float64))
    matrix = basis @ torch.diag_embed(torch.logspace(0, -4, 24, dtype=torch.float64)) @ basis.mT
    rhs = torch.randn(3, 24, 5, generator=gen, dtype=torch.float64)
    want = torch.linalg.solve(matrix + 1e-3 * torch.eye(24, dtype=torch.float64), rhs)
    torch.testing.assert_close(cholesky_solve_spd(matrix, rhs, shift=1e-3), want, rtol=1e-9, atol=1e-9)
    residuals = [((rhs - (matrix + 1e-3 * torch.eye(24, dtype=torch.float64))
                   @ conjugate_gradient_solve(matrix, rhs, n, shift=1e-3)).norm() / rhs.norm()).item()
                 for n in (2, 8, 24, 60)]
    assert all(later < earlier for earlier, later in zip(residuals, residuals[1:])), residuals
    assert residuals[-1] < 1e-8
    small = (matrix[:1, :6, :6] + torch.eye(6, dtype=torch.float64)).requires_grad_(True)
    small_rhs = rhs[:1, :6, :2].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: conjugate_gradient_solve(a, b, 4), (small, small_rhs))


def test_converged_column_stays_finite():
    matrix = torch.eye(4).expand(2, 4, 4)
    rhs = torch.zeros(2, 4, 3)
    rhs[0, :, 0] = 1.0  # one column is solved in a single step, the zero ones from the start
    out = conjugate_gradient_solve(matrix, rhs, 5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, rhs)


@pytest.mark.parametrize('kwargs', [dict(kernel='gaussian'), dict(inverse='exact'),
                                    dict(inverse='conjugate_gradient', cg_iters=5), dict(lam=16.0)],
                         ids=['gaussian', 'exact', 'cg', 'lam16'])
def test_laplacianformer_options_build_from_the_registry_and_train(kwargs):
    torch.manual_seed(0)
    model = MODELS.build(dict(type='mmlinattn.LaplacianFormer', arch=LAPLACIAN_NARROW,
                              attn_cfg=kwargs))
    model.init_weights()
    reference = LaplacianFormer(arch=LAPLACIAN_NARROW)
    reference.load_state_dict(model.state_dict())
    layers = [m for m in model.modules() if isinstance(m, LaplacianAttention)]
    assert len(layers) == 4
    for name, value in kwargs.items():
        assert all(getattr(layer, name) == value for layer in layers), name
    x = torch.randn(2, 3, 72, 56)
    outs = model(x)
    sum(o.square().mean() for o in outs).backward()
    assert all(torch.isfinite(o).all() for o in outs)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    if 'inverse' not in kwargs:  # a converged solver gives the paper's output: tested per layer above
        model.eval()
        reference.eval()
        with torch.no_grad():
            assert (model(x)[-1] - reference(x)[-1]).abs().max() > 1e-4


@pytest.mark.parametrize('kwargs,message', [
    (dict(kernel='cosine'), 'kernel must be one of'),
    (dict(inverse='pinv'), 'inverse must be one of'),
    (dict(kernel='gaussian', lam=4.0), 'lam=None'),
    (dict(inverse='conjugate_gradient', cg_iters=0), 'cg_iters'),
    (dict(ns_iters=1.5), 'ns_iters'),
])
def test_bad_laplacian_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LaplacianAttention(32, 2, 4, **kwargs)
    with pytest.raises(ValueError, match=message):
        LaplacianFormer(arch=LAPLACIAN_NARROW, attn_cfg=kwargs)


@pytest.mark.parametrize('backbone_type,name,key', [
    (LaplacianFormer, 'lam', 'lam'), (LaplacianFormer, 'ns_eps', 'landmark_shift'),
    (LaplacianFormer, 'max_landmark_grid', 'max_landmark_grid'), (PolaPVT, 'polarity', 'polarity'),
    (PolaSwin, 'fixed_power', 'fixed_power')])
def test_attention_settings_given_to_the_backbone_name_their_attn_cfg_key(backbone_type, name, key):
    with pytest.raises(TypeError, match=rf'pass it as attn_cfg=dict\({key}=\.\.\.\)'):
        MODELS.build(dict(type=f'mmlinattn.{backbone_type.__name__}', **{name: 1.0}))
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['depth'\]"):
        backbone_type(depth=3)


@pytest.mark.parametrize('backbone_type,attn_cfg,message', [
    (LaplacianFormer, dict(ns_eps=0.1), "use 'landmark_shift' for 'ns_eps'"),
    (LaplacianFormer, dict(local_kernel_size=3), r"attn_cfg keys \['local_kernel_size'\]"),
    (PolaPVT, dict(lam=4.0), 'not settings of PolarityAttention'),
])
def test_attn_cfg_keys_must_be_settings_of_the_attention(backbone_type, attn_cfg, message):
    with pytest.raises(ValueError, match=message):
        backbone_type(attn_cfg=attn_cfg)


# ------------------------------------------------------------------ PolarityAttention options


def polarity_by_hand(attn: PolarityAttention, x, hw_shape, p, streams):
    """PolaFormer's attention (sr 1) in fp64 with the exponent ``p`` [h, d] given:
    'both': ``[S v1 || O v2]``; 'same': ``S v`` over all of v; S, O normalised as the official code."""
    batch, tokens, channels = x.shape
    heads, d = attn.num_heads, channels // attn.num_heads
    if attn.fused_qkvg:
        q, k, v, g = F.linear(x, attn.qkvg.weight, attn.qkvg.bias).chunk(4, dim=-1)
    else:
        q, g = F.linear(x, attn.qg.weight, attn.qg.bias).chunk(2, dim=-1)
        k, v = F.linear(x, attn.kv.weight, attn.kv.bias).chunk(2, dim=-1)
    if attn.positional_encoding is not None:
        pos = attn.positional_encoding.reshape(1, *attn.pos_grid, channels).permute(0, 3, 1, 2)
        pos = F.interpolate(pos, size=hw_shape, mode='bicubic', align_corners=False)
        k = k + pos.flatten(2).transpose(1, 2)
    s = torch.log1p(torch.exp(attn.scale))
    q, k = q / s, k / s
    qh, kh, vh = (t.reshape(batch, tokens, heads, d) for t in (q, k, v))
    q_pos, q_neg = qh.clamp(min=0)**p, (-qh).clamp(min=0)**p
    k_feat = torch.cat([kh.clamp(min=0)**p, (-kh).clamp(min=0)**p], -1)  # [B, n, h, 2d]
    sims_same = torch.einsum('bihc,bjhc->bhij', torch.cat([q_pos, q_neg], -1), k_feat)
    sims_opp = torch.einsum('bihc,bjhc->bhij', torch.cat([q_neg, q_pos], -1), k_feat)
    norm = lambda sims: sims / (sims.mean(-1, keepdim=True) + 1e-6) / tokens  # noqa: E731
    values = vh.transpose(1, 2)  # [B, h, n, d]
    if streams == 'same':
        y = norm(sims_same) @ values
    else:
        v1, v2 = values.chunk(2, dim=-1)
        y = torch.cat([norm(sims_same) @ v1, norm(sims_opp) @ v2], dim=-1)
    y = y.transpose(1, 2).reshape(batch, tokens, channels)
    v_img = vh.permute(0, 2, 3, 1).reshape(batch * heads, d, *hw_shape)
    local = F.conv2d(v_img, attn.dwc.weight, attn.dwc.bias, padding=attn.dwc.padding, groups=d)
    local = local.reshape(batch, channels, tokens).transpose(1, 2)
    return F.linear((y + local) * g, attn.proj.weight, attn.proj.bias)


POLARITY_CASES = [
    pytest.param(dict(polarity='same'), 'same', None, id='same-learned'),
    pytest.param(dict(power='fixed'), 'both', 3.0, id='both-fixed3'),
    pytest.param(dict(polarity='same', power='fixed', fixed_power=2.0), 'same', 2.0, id='same-fixed2'),
    pytest.param(dict(), 'both', None, id='official'),
]


@pytest.mark.parametrize('fused', [False, True], ids=['pvt', 'swin'])
@pytest.mark.parametrize('kwargs,streams,fixed', POLARITY_CASES)
def test_polarity_options_equal_their_formulas_in_fp64(kwargs, streams, fixed, fused):
    torch.manual_seed(0)
    attn = _randomise(PolarityAttention(16, 2, (4, 6), fused_qkvg=fused, **kwargs).double())
    hw = (5, 7)
    x = torch.randn(2, 35, 16, dtype=torch.float64)
    if fixed is None:
        p = 1 + 4 * torch.sigmoid(attn.power.reshape(2, 8))
    else:
        assert not hasattr(attn, 'power') and 'power' not in dict(attn.named_parameters())
        p = torch.full((2, 8), fixed, dtype=torch.float64)
    torch.testing.assert_close(attn.feature_power().reshape(2, 8), p, rtol=0, atol=0)
    params = list(attn.parameters())
    out, grads = _forward_backward(attn, params, x, hw)
    ref, ref_grads = _forward_backward(lambda t, shape: polarity_by_hand(attn, t, shape, p, streams),
                                       params, x, hw)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def test_polarity_same_changes_the_output_and_no_pos_grid_drops_the_encoding():
    torch.manual_seed(0)
    both = _randomise(PolarityAttention(16, 2, (5, 7)))
    same = PolarityAttention(16, 2, (5, 7), polarity='same')
    same.load_state_dict(both.state_dict())
    x = torch.randn(2, 35, 16)
    assert (both(x, (5, 7)) - same(x, (5, 7))).abs().max() > 1e-3
    plain = PolarityAttention(16, 2, None)
    assert plain.positional_encoding is None and 'positional_encoding' not in plain.state_dict()
    plain.load_state_dict({k: v for k, v in both.state_dict().items() if k != 'positional_encoding'})
    with torch.no_grad():
        both.positional_encoding.zero_()
    torch.testing.assert_close(plain(x, (5, 7)), both(x, (5, 7)), rtol=0, atol=0)


@pytest.mark.parametrize('backbone_type', [PolaPVT, PolaSwin])
@pytest.mark.parametrize('kwargs', [dict(polarity='same'), dict(power='fixed')], ids=['same', 'fixed'])
def test_pola_backbone_options_build_from_the_registry_and_train(backbone_type, kwargs):
    torch.manual_seed(0)
    model = MODELS.build(dict(type=f'mmlinattn.{backbone_type.__name__}',
                              arch=POLA_NARROW[backbone_type], attn_cfg=kwargs))
    model.init_weights()
    layers = [m for m in model.modules() if isinstance(m, PolarityAttention)]
    assert layers and all(layer.polarity == kwargs.get('polarity', 'both') for layer in layers)
    assert all(layer.power_mode == kwargs.get('power', 'learned') for layer in layers)
    official = backbone_type(arch=POLA_NARROW[backbone_type])
    missing, unexpected = official.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(k.endswith('.power') for k in missing)
    assert bool(missing) == (kwargs.get('power') == 'fixed')
    x = torch.randn(2, 3, 64, 48)
    outs = model(x)
    sum(o.square().mean() for o in outs).backward()
    assert all(torch.isfinite(o).all() for o in outs)
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in model.parameters() if p.requires_grad)
    model.eval()
    official.eval()
    with torch.no_grad():
        for name, param in official.named_parameters():  # theta = 0 would give p = 3 exactly
            if name.endswith('.power'):
                param.fill_(2.0)
        assert (model(x)[0] - official(x)[0]).abs().max() > 1e-4


def test_fixed_power_backbone_names_the_official_power_keys_when_loading(tmp_path):
    official = PolaPVT(arch=POLA_NARROW[PolaPVT])
    path = str(tmp_path / 'official_power.pth')
    torch.save({'state_dict': official.state_dict()}, path)
    fixed = PolaPVT(arch=POLA_NARROW[PolaPVT], attn_cfg=dict(power='fixed'),
                    init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(ValueError, match=r'unexpected keys: block1\.0\.attn\.power'):
        fixed.init_weights()
    fixed.init_cfg['strict'] = False
    fixed.init_weights()
    torch.testing.assert_close(fixed.block1[0].attn.qg.weight, official.block1[0].attn.qg.weight)


@pytest.mark.parametrize('kwargs,message', [
    (dict(polarity='opposite'), 'polarity must be one of'),
    (dict(power='none'), 'power must be one of'),
    (dict(power='fixed', fixed_power=0.5), 'fixed_power must be >= 1'),
])
def test_bad_polarity_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolarityAttention(16, 2, (4, 4), **kwargs)
    with pytest.raises(ValueError, match=message):
        PolaPVT(arch=POLA_NARROW[PolaPVT], attn_cfg=kwargs)


# ------------------------------------------------------------------ analysis rows follow the options


@pytest.mark.parametrize('backbone_type,kwargs', [
    (LaplacianFormer, dict(kernel='gaussian', inverse='exact')),
    (LaplacianFormer, dict(inverse='conjugate_gradient', cg_iters=60)),
    (PolaPVT, dict(polarity='same', power='fixed')),
    (PolaSwin, dict(polarity='same')),
], ids=['gaussian-exact', 'cg-converged', 'pvt-same-fixed', 'swin-same'])
def test_attention_rows_are_what_the_ablated_layers_apply(backbone_type, kwargs):
    """``A v`` rebuilt into each layer's output equals the recorded output (fp64): the analysis
    reads the kernel, the solver, the streams and the power from the layer."""
    arch = LAPLACIAN_NARROW if backbone_type is LaplacianFormer else POLA_NARROW[backbone_type]
    torch.manual_seed(0)
    backbone = backbone_type(arch=arch, attn_cfg=kwargs)
    backbone.init_weights()
    backbone.double().eval()
    records = record_attentions(backbone, torch.randn(1, 3, 72, 88, dtype=torch.float64))
    for record in records:
        module, x = record.module, record.x
        batch, tokens, channels = x.shape
        streams, *_ = attention_streams(record)
        with torch.no_grad():
            if isinstance(module, LaplacianAttention):
                _, _, v = module.attention_inputs(x, record.hw_shape)
                y = (streams['laplacian'] @ v).transpose(1, 2).reshape(batch, tokens, channels)
                v_image = v.transpose(-2, -1).reshape(batch, channels, *record.hw_shape)
                out = module.proj(y + module.local_conv(v_image).flatten(2).transpose(1, 2))
            else:
                assert set(streams) == {'same'}
                _, _, v, gate, _, _ = module.attention_inputs(x, record.hw_shape)
                y = (streams['same'] @ v).transpose(1, 2).reshape(x.shape)
                out = module.proj((y + module._local_branch(v, record.hw_shape)) * gate)
        tol = 1e-6 if kwargs.get('inverse') == 'conjugate_gradient' else 1e-9
        torch.testing.assert_close(out, record.output, rtol=tol, atol=tol, msg=record.name)
    if kwargs.get('kernel') == 'gaussian':  # the statistics draw the model's Gaussian (sigma 1)
        from analysis import layer_statistics
        scales = layer_statistics(records[0], max_queries=64).scales
        assert scales['sigma'] == 1.0
        assert math.exp(-scales['median_l1'] / scales['lam']) == pytest.approx(
            math.exp(-scales['median_sq_l2'] / 2), rel=1e-9)
