"""Pola-DeiT: parameters and FLOPs (tools/get_flops.py) against DeiT and the paper, shapes, options."""
import importlib.util
import os

import pytest
import torch

from mmlinattn.models.backbones import PolaDeiT
from mmlinattn.models.layers import PolarityAttention
from mmlinattn.registry import MODELS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPTH, TOKENS = 12, 14 * 14  # 12 blocks; 224^2 / 16^2 patches


def _get_flops():
    spec = importlib.util.spec_from_file_location('get_flops', os.path.join(ROOT, 'tools', 'get_flops.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _count(module):
    return sum(p.numel() for p in module.parameters())


def _config(arch):
    from mmengine.config import Config
    return Config.fromfile(os.path.join(ROOT, 'configs', f'pola_deit_{arch}_8xb128_in1k.py'))


def _deit(arch):
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    import mmpretrain
    from mmpretrain.registry import MODELS as PRETRAIN_MODELS
    path = os.path.join(os.path.dirname(mmpretrain.__file__), '.mim', 'configs', 'deit',
                        f'deit-{arch}_4xb256_in1k.py')
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return PRETRAIN_MODELS.build(Config.fromfile(path).model)


@pytest.mark.parametrize('arch,dims', [('tiny', 192), ('small', 384)])
def test_parameters_are_deit_plus_the_polarity_blocks(arch, dims):
    """DeiT's classifier (mmpretrain) + per block the gate (C x C + C), the DWC on v
    (d x 5 x 5 + d, d = 64), the power and the scale (C each), - the class token and its position;
    the per-block positional encodings would add 196 x C each."""
    classifier = _get_flops().build_model(_config(arch))
    per_block = (dims * dims + dims) + (64 * 25 + 64) + dims + dims
    assert _count(classifier) == _count(_deit(arch)) + DEPTH * per_block - 2 * dims
    with torch.device('meta'):
        plain, with_pos = (PolaDeiT(arch=arch, block_pos_encoding=flag) for flag in (False, True))
    assert _count(with_pos) == _count(plain) + DEPTH * TOKENS * dims


def test_tiny_params_and_flops_from_get_flops_are_near_the_paper():
    """The paper's Pola-DeiT-T: 6.1M parameters, 1.2 GFLOPs; ours 6.19M and 1.29 G (the README's
    numbers; the polarity op counted as its products, see tools/get_flops.py)."""
    model, analyzer = _get_flops().analyse(_config('tiny'), (224, 224))
    with torch.no_grad():
        params_m, gflops = _count(model) / 1e6, analyzer.total() / 1e9
    assert round(params_m, 2) == 6.19 and round(gflops, 2) == 1.29
    assert abs(params_m - 6.1) / 6.1 < 0.02 and abs(gflops - 1.2) / 1.2 < 0.1


def test_output_shape_at_any_size_and_training_step():
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type='mmlinattn.PolaDeiT',
                                 arch=dict(embed_dims=32, depth=2, num_heads=2)))
    backbone.init_weights()
    x = torch.randn(2, 3, 97, 131)
    (out, ) = backbone(x)
    assert out.shape == (2, 32, 7, 9) and torch.isfinite(out).all()
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in backbone.parameters())
    attn = backbone.blocks[0].attn
    assert isinstance(attn, PolarityAttention) and attn.positional_encoding is None


def test_options_reach_every_block_and_frozen_stage_freezes_all():
    backbone = PolaDeiT(arch=dict(embed_dims=32, depth=2, num_heads=2),
                        attn_cfg=dict(polarity='same', power='fixed'), block_pos_encoding=True,
                        frozen_stages=1)
    layers = [block.attn for block in backbone.blocks]
    assert all(a.polarity == 'same' and a.power_mode == 'fixed' for a in layers)
    assert all(a.positional_encoding.shape == (1, 196, 32) for a in layers)
    backbone.train()
    assert not any(p.requires_grad for p in backbone.parameters())
    assert not any(m.training for stage in backbone.stage_modules(0) for m in stage.modules())


@pytest.mark.parametrize('kwargs,message', [(dict(out_indices=(1, )), 'out_indices'),
                                            (dict(frozen_stages=2), 'frozen_stages'),
                                            (dict(arch='base'), 'arch must be one of')])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolaDeiT(**kwargs)
