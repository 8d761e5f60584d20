"""PolaPVT and PolaSwin: parameter counts, output shapes, freezing, checkpointing, autocast, registry."""
import math

import pytest
import torch
from torch import nn

from mmlinattn.models.backbones import PolaPVT, PolaSwin
from mmlinattn.models.layers import PolarityAttention, ShiftedWindowAttention

# published totals of the ImageNet classifiers (backbone + 1000-class head), in millions
PUBLISHED = [(PolaPVT, 'tiny', 12.9), (PolaPVT, 'small', 23.2), (PolaPVT, 'medium', 40.0),
             (PolaPVT, 'large', 54.4), (PolaSwin, 'tiny', 29.3), (PolaSwin, 'small', 50.6),
             (PolaSwin, 'base', 89.1)]
# same widths and heads as tiny, fewer blocks (Swin keeps a shifted block in each window stage)
SHALLOW = {PolaPVT: dict(depths=[1, 1, 1, 1]),
           PolaSwin: dict(embed_dims=96, depths=[1, 1, 2, 2], num_heads=[3, 6, 12, 24])}
# narrow and shallow, for the tests of training behaviour
NARROW = {PolaPVT: dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], depths=[1, 1, 1, 1]),
          PolaSwin: dict(embed_dims=16, depths=[1, 1, 2, 2], num_heads=[1, 2, 4, 8])}


def _num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize('backbone_type,arch,millions', PUBLISHED,
                         ids=[f'{t.__name__}-{a}' for t, a, _ in PUBLISHED])
def test_classifier_parameter_count_matches_the_published_one(backbone_type, arch, millions):
    with torch.device('meta'):
        backbone = backbone_type(arch=arch, out_indices=(3, ))
    last_dims = backbone.embed_dims[-1]
    total = _num_params(backbone) + last_dims * 1000 + 1000  # + LinearClsHead(1000)
    assert abs(total / 1e6 - millions) / millions < 0.01, f'{total / 1e6:.3f}M vs {millions}M'


def _expected_shapes(backbone, height, width):
    shapes = []
    for i, dims in enumerate(backbone.embed_dims):
        height, width = math.ceil(height / (4 if i == 0 else 2)), math.ceil(width / (4 if i == 0 else 2))
        shapes.append((1, dims, height, width))
    return shapes


@pytest.mark.parametrize('backbone_type', [PolaPVT, PolaSwin])
@pytest.mark.parametrize('size,shallow', [((224, 224), False), ((97, 131), False), ((32, 32), False),
                                          ((512, 512), True), ((800, 1333), True)],
                         ids=['224', '97x131', '32', '512', '800x1333'])
def test_outputs_at_strides_4_to_32(backbone_type, size, shallow):
    backbone = backbone_type(arch=SHALLOW[backbone_type] if shallow else 'tiny').eval()
    with torch.no_grad():
        outs = backbone(torch.randn(1, 3, *size))
    assert [tuple(o.shape) for o in outs] == _expected_shapes(backbone, *size)
    assert all(torch.isfinite(o).all() for o in outs)
    # contiguous NCHW: mmcv's CPU RoIAlign reads a channels-last map as if it were NCHW
    assert all(o.is_contiguous() for o in outs)


def test_out_indices_select_outputs():
    backbone = PolaSwin(arch=NARROW[PolaSwin], out_indices=(1, 3)).eval()
    assert not hasattr(backbone, 'norm0') and hasattr(backbone, 'norm3')
    with torch.no_grad():
        outs = backbone(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [32, 128]


def test_default_init_matches_the_official_one():
    backbone = PolaPVT(arch=NARROW[PolaPVT])
    backbone.init_weights()
    assert 0.01 < backbone.pos_embed1.std().item() < 0.03
    attn = backbone.block1[0].attn
    assert attn.power.abs().max() == 0 and attn.scale.abs().max() == 0
    assert attn.positional_encoding.abs().max() == 0
    assert 0.01 < attn.qg.weight.std().item() < 0.03 and attn.qg.bias.abs().max() == 0
    swin = PolaSwin(arch=NARROW[PolaSwin])
    swin.init_weights()
    table = swin.layers[2].blocks[0].attn.relative_position_bias_table
    assert 0.01 < table.std().item() < 0.03


def test_stage_layout():
    swin = PolaSwin(arch='tiny')
    assert all(isinstance(b.attn, PolarityAttention) for i in (0, 1) for b in swin.layers[i].blocks)
    assert all(isinstance(b.attn, ShiftedWindowAttention) for i in (2, 3) for b in swin.layers[i].blocks)
    assert [b.attn.shift_size for b in swin.layers[2].blocks] == [0, 3, 0, 3, 0, 3]
    assert [swin.layers[i].blocks[0].attn.pos_grid for i in (0, 1)] == [(56, 56), (28, 28)]
    pvt = PolaPVT(arch='tiny')
    assert [pvt.block1[0].attn.pos_grid, pvt.block4[0].attn.pos_grid] == [(56, 56), (7, 7)]
    assert all(b.attn.sr_ratio == 1 for i in range(1, 5) for b in getattr(pvt, f'block{i}'))


def _frozen_and_trainable(backbone):
    frozen = [m for i in range(2) for m in backbone.stage_modules(i)]
    trainable = [m for i in range(2, 4) for m in backbone.stage_modules(i)]
    return frozen, trainable


@pytest.mark.parametrize('backbone_type', [PolaPVT, PolaSwin])
def test_frozen_stages(backbone_type):
    backbone = backbone_type(arch=NARROW[backbone_type], frozen_stages=2)
    backbone.train()
    frozen, trainable = _frozen_and_trainable(backbone)
    assert all(not m.training for f in frozen for m in f.modules())
    assert all(m.training for t in trainable for m in t.modules())
    if backbone_type is PolaPVT:
        assert not backbone.pos_embed1.requires_grad and not backbone.pos_embed2.requires_grad
        assert backbone.pos_embed3.requires_grad
    sum(o.sum() for o in backbone(torch.randn(1, 3, 64, 64))).backward()
    assert all(p.grad is None and not p.requires_grad for f in frozen for p in f.parameters())
    assert all(p.grad is not None for t in trainable for p in t.parameters())


@pytest.mark.parametrize('backbone_type', [PolaPVT, PolaSwin])
def test_with_cp_gives_the_same_outputs_and_gradients(backbone_type):
    torch.manual_seed(0)
    plain = backbone_type(arch=NARROW[backbone_type], drop_path_rate=0.0)
    plain.init_weights()
    checkpointed = backbone_type(arch=NARROW[backbone_type], drop_path_rate=0.0, with_cp=True)
    checkpointed.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 64, 96)
    results = []
    for backbone in (plain, checkpointed):
        outs = backbone.train()(x)
        sum((o * torch.linspace(0, 1, o.numel()).reshape(o.shape)).sum() for o in outs).backward()
        results.append((outs, {n: p.grad for n, p in backbone.named_parameters()}))
    (outs_a, grads_a), (outs_b, grads_b) = results
    for a, b in zip(outs_a, outs_b):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize('backbone_type', [PolaPVT, PolaSwin])
def test_norm_eval_is_accepted_and_leaves_the_layer_norms_training(backbone_type):
    backbone = backbone_type(arch=NARROW[backbone_type], norm_eval=True, drop_path_rate=0.0)
    assert backbone.train() is backbone
    assert all(m.training for m in backbone.modules())  # LayerNorms have no running statistics
    x = torch.randn(1, 3, 64, 64)
    train_outs = backbone(x)
    with torch.no_grad():
        eval_outs = backbone.eval()(x)
    for a, b in zip(train_outs, eval_outs):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize('backbone_type', [PolaPVT, PolaSwin])
def test_bf16_autocast_on_cpu_is_finite(backbone_type):
    torch.manual_seed(0)
    backbone = backbone_type(arch=NARROW[backbone_type])
    backbone.init_weights()
    with torch.no_grad():
        for name, param in backbone.named_parameters():
            if name.endswith(('.power', '.scale')):
                param.normal_()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = backbone(torch.randn(2, 3, 64, 80) * 3)
    assert all(torch.isfinite(o.float()).all() for o in outs)
    sum(o.float().sum() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in backbone.parameters() if p.grad is not None)


def test_registered_in_the_plugin_scope():
    from mmengine.registry import MODELS as ROOT_MODELS

    from mmlinattn.registry import MODELS
    assert isinstance(MODELS.build(dict(type='PolaPVT', arch=NARROW[PolaPVT])), PolaPVT)
    assert isinstance(ROOT_MODELS.build(dict(type='mmlinattn.PolaSwin', arch=NARROW[PolaSwin])), PolaSwin)


@pytest.mark.parametrize('kwargs,match', [
    (dict(arch='huge'), 'arch must be one of'),
    (dict(arch='tiny', out_indices=(4, )), 'out_indices'),
    (dict(arch='tiny', frozen_stages=5), 'frozen_stages'),
])
@pytest.mark.parametrize('backbone_type', [PolaPVT, PolaSwin])
def test_bad_arguments_are_named(backbone_type, kwargs, match):
    with pytest.raises(ValueError, match=match):
        backbone_type(**kwargs)
