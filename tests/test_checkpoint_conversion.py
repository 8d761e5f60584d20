"""Official PolaFormer checkpoint layout -> ours: conversion, strict loading, Pretrained init, CLI."""
import importlib.util
import os

import pytest
import torch

from mmlinattn.models.backbones import PolaPVT, PolaSwin
from mmlinattn.models.backbones.base import check_shapes
from mmlinattn.models.backbones.polaformer_converter import (convert_official, detect_family,
                                                             is_official_polaformer,
                                                             official_model_settings, to_official)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = {'pvt': (PolaPVT, 'pola_pvt_tiny'), 'swin': (PolaSwin, 'pola_swin_tiny')}


def _backbone(family, **kwargs):
    backbone_type, _ = FAMILIES[family]
    torch.manual_seed(0)
    model = backbone_type(arch='tiny', out_indices=kwargs.pop('out_indices', (3, )), **kwargs)
    model.init_weights()
    with torch.no_grad():  # the attention's power/scale/positional encodings start at zero
        for name, param in model.named_parameters():
            if name.endswith(('.power', '.scale', '.positional_encoding')):
                param.normal_(0, 0.1)
    return model.eval()


def _official_file(family, tmp_path, model):
    """An official-layout file made from ``model`` by the inverse mapping, with a 1000-class head."""
    dims = model.embed_dims[-1]
    classifier = {f'backbone.{k}': v for k, v in model.state_dict().items()}
    classifier['head.fc.weight'] = torch.randn(1000, dims)
    classifier['head.fc.bias'] = torch.randn(1000)
    path = str(tmp_path / f'official_{family}.pth')
    torch.save({**to_official(classifier, family), 'epoch': 300}, path)
    return path


@pytest.fixture(scope='module')
def official(tmp_path_factory):
    """family -> (our backbone, path of its official-layout file); built once per module."""
    cache = {}

    def get(family):
        if family not in cache:
            model = _backbone(family)
            cache[family] = model, _official_file(family, tmp_path_factory.mktemp(family), model)
        return cache[family]

    return get


OFFICIAL_KEYS = {
    'pvt': ['patch_embed1.proj.weight', 'patch_embed4.norm.bias', 'pos_embed1', 'pos_embed4',
            'block1.0.attn.qg.weight', 'block1.0.attn.kv.bias', 'block4.1.attn.power', 'block4.1.attn.scale',
            'block2.1.attn.positional_encoding', 'block3.0.attn.dwc.weight', 'block3.0.attn.proj.weight',
            'block1.0.norm1.weight', 'block1.0.mlp.fc1.weight', 'norm.weight', 'head.weight', 'head.bias'],
    'swin': ['patch_embed.proj.weight', 'patch_embed.norm.weight', 'layers.0.blocks.0.attn.qkvg.weight',
             'layers.1.blocks.1.attn.positional_encoding', 'layers.0.blocks.1.attn.dwc.weight',
             'layers.2.blocks.0.attn.qkv.weight', 'layers.2.blocks.5.attn.relative_position_bias_table',
             'layers.2.blocks.0.attn.relative_position_index', 'layers.2.blocks.1.attn_mask',
             'layers.0.downsample.reduction.weight', 'layers.2.downsample.norm.weight', 'norm.weight',
             'head.weight'],
}


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_official_layout_converts_loads_strictly_and_reproduces_outputs(family, official):
    model, path = official(family)
    official = torch.load(path)['model']
    assert set(OFFICIAL_KEYS[family]) <= set(official)
    assert detect_family(official) == family and is_official_polaformer(official)
    if family == 'swin':  # shifted blocks at 224: only stage 3 (14x14); stage 4 is one 7x7 window
        assert sorted(k for k in official if k.endswith('attn_mask')) == [
            f'layers.2.blocks.{j}.attn_mask' for j in (1, 3, 5)]
        assert official['layers.2.blocks.1.attn_mask'].shape == (4, 49, 49)

    converted, dropped = convert_official(torch.load(path), family)
    assert not is_official_polaformer(converted)
    assert 'head.weight' in dropped and 'head.bias' in dropped
    fresh = FAMILIES[family][0](arch='tiny', out_indices=(3, )).eval()
    fresh.load_state_dict(converted, strict=True)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_keep_head_gives_a_classifier_state_dict(family, official):
    model, path = official(family)
    converted, _ = convert_official(torch.load(path), family, keep_head=True)
    assert converted['head.fc.weight'].shape == (1000, model.embed_dims[-1])
    backbone_keys = set(converted) - {'head.fc.weight', 'head.fc.bias'}
    assert backbone_keys == {f'backbone.{k}' for k in model.state_dict()}


def test_wrong_shape_fails_naming_the_key(official, tmp_path):
    checkpoint = torch.load(official('pvt')[1])
    path = str(tmp_path / 'misshapen.pth')
    checkpoint['model']['block2.1.attn.qg.weight'] = torch.zeros(256, 100)
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match=r'block2\.1\.attn\.qg\.weight has shape \[256, 100\] but PolaPVT '
                                         r'expects \[256, 128\]'):
        PolaPVT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path)).init_weights()
    converted, _ = convert_official(checkpoint, 'pvt')
    with pytest.raises(ValueError, match=r'block2\.1\.attn\.qg\.weight'):
        check_shapes(PolaPVT(arch='tiny'), converted)


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_pretrained_init_cfg_reads_official_files(family, official):
    model, path = official(family)
    dense = FAMILIES[family][0](arch='tiny', out_indices=(0, 1, 2, 3),
                                init_cfg=dict(type='Pretrained', checkpoint=path))
    dense.init_weights()
    loaded = dense.state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0, msg=key)
    if family == 'swin':  # the dense outputs' extra norms have no official weights: left at their init
        assert torch.equal(loaded['norm0.weight'], torch.ones(96))


def test_pretrained_init_cfg_reads_converted_classifier_files(official, tmp_path):
    model = official('swin')[0]
    classifier = {f'backbone.{k}': v for k, v in model.state_dict().items()}
    classifier['head.fc.weight'] = torch.zeros(1000, 768)
    path = str(tmp_path / 'classifier.pth')
    torch.save({'state_dict': classifier, 'meta': {}}, path)
    backbone = PolaSwin(arch='tiny', out_indices=(3, ), init_cfg=dict(type='Pretrained', checkpoint=path))
    backbone.init_weights()
    torch.testing.assert_close(backbone.state_dict(), model.state_dict(), rtol=0, atol=0)


def _converter():
    spec = importlib.util.spec_from_file_location('convert_checkpoint',
                                                  os.path.join(ROOT, 'tools', 'convert_checkpoint.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_converts_and_reports(official, tmp_path, capsys):
    model, src = official('swin')
    dst = str(tmp_path / 'converted.pth')
    assert _converter().main([src, dst, '--arch', 'pola_swin_tiny']) == 0
    out = capsys.readouterr().out
    assert 'dropped head.weight: classifier head' in out
    assert 'dropped layers.2.blocks.1.attn_mask: buffer' in out
    assert 'missing keys: none' in out and 'unexpected keys: none' in out
    saved = torch.load(dst)['state_dict']
    assert set(saved) == set(model.state_dict()) and 'norm3.weight' in saved

    assert _converter().main([src, dst, '--arch', 'pola_swin_tiny', '--keep-head']) == 0
    assert 'head.fc.weight' in torch.load(dst)['state_dict']


def test_cli_names_missing_and_unexpected_keys(official, tmp_path, capsys):
    checkpoint = torch.load(official('pvt')[1])
    src = str(tmp_path / 'edited.pth')
    del checkpoint['model']['block3.1.attn.power']
    checkpoint['model']['block3.1.attn.extra'] = torch.zeros(3)
    torch.save(checkpoint, src)
    dst = str(tmp_path / 'converted.pth')
    assert _converter().main([src, dst, '--arch', 'pola_pvt_tiny']) == 1
    out = capsys.readouterr().out
    assert 'missing keys: block3.1.attn.power' in out
    assert 'unexpected keys: block3.1.attn.extra' in out
    assert not os.path.exists(dst)
    assert _converter().main([src, dst, '--arch', 'pola_pvt_small']) == 1
    assert 'does not match pola_pvt_small' in capsys.readouterr().err


def test_cli_fails_on_a_misshapen_key(official, tmp_path, capsys):
    checkpoint = torch.load(official('pvt')[1])
    checkpoint['model']['pos_embed2'] = torch.zeros(1, 100, 128)
    src, dst = str(tmp_path / 'misshapen.pth'), str(tmp_path / 'converted.pth')
    torch.save(checkpoint, src)
    assert _converter().main([src, dst, '--arch', 'pola_pvt_tiny']) == 1
    assert 'pos_embed2 has shape [1, 100, 128] but PolaPVT expects [1, 784, 128]' in capsys.readouterr().err
    assert not os.path.exists(dst)


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_converted_classifier_is_the_official_one(family, official):
    """Our backbone, pooled and passed through the head as the official forward does, equals the
    mmpretrain classifier of the config loaded (strictly) from the --keep-head conversion."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS

    model, path = official(family)
    cfg = Config.fromfile(os.path.join(ROOT, 'configs', f'{FAMILIES[family][1]}_8xb128_in1k.py'))
    init_default_scope('mmpretrain')
    classifier = MODELS.build(cfg.model).eval()
    converted, _ = convert_official(torch.load(path), family, keep_head=True)
    classifier.load_state_dict(converted, strict=True)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        pooled = model(x)[-1].mean(dim=(2, 3))  # PVT: no norm; Swin: norm3 is the official final norm
        official_logits = pooled @ converted['head.fc.weight'].T + converted['head.fc.bias']
        torch.testing.assert_close(classifier(x, mode='tensor'), official_logits, rtol=1e-5, atol=1e-5)


SWIN_NARROW = dict(embed_dims=16, depths=[1, 1, 2, 2], num_heads=[1, 2, 4, 8])


def _shapes_only(module):
    """The state dict of ``module`` as stride-0 zero tensors: every shape, almost no bytes."""
    return {k: torch.zeros((), dtype=v.dtype).expand(v.shape) for k, v in module.state_dict().items()}


def test_pola_swin_base_384_converts_strictly_at_its_own_size(tmp_path, capsys):
    """The official Pola-Swin-B-384 layout (window 12, 96^2/48^2 positional encodings, the shifted
    24x24 stage's masks): the CLI reads 384 and 12 from the shapes and converts without a
    missing or unexpected key; --img-size/--window-size override what the file says."""
    with torch.device('meta'):
        shapes = PolaSwin(arch='base', pretrain_img_size=384, window_size=12, out_indices=(3, ))
    classifier = {f'backbone.{k}': v for k, v in _shapes_only(shapes).items()}
    classifier['head.fc.weight'] = torch.zeros(()).expand(1000, 1024)
    classifier['head.fc.bias'] = torch.zeros(1000)
    official = to_official(classifier, 'swin', pretrain_img_size=384, window_size=12)
    assert official['model']['layers.0.blocks.0.attn.positional_encoding'].shape == (1, 96 * 96, 128)
    assert official['model']['layers.2.blocks.1.attn_mask'].shape == (4, 144, 144)
    assert 'layers.3.blocks.1.attn_mask' not in official['model']  # 12x12: one window, no shift
    assert official_model_settings(official, 'swin') == dict(pretrain_img_size=384, window_size=12)
    src, dst = str(tmp_path / 'pola_swin_b_384.pth'), str(tmp_path / 'converted.pth')
    torch.save(official, src)
    assert _converter().main([src, dst, '--arch', 'pola_swin_base', '--keep-head']) == 0
    out = capsys.readouterr().out
    assert 'missing keys: none' in out and 'unexpected keys: none' in out
    saved = torch.load(dst)['state_dict']
    assert saved['backbone.layers.1.blocks.0.attn.positional_encoding'].shape == (1, 48 * 48, 256)
    assert _converter().main([src, dst, '--arch', 'pola_swin_base', '--img-size', '224']) == 1
    assert 'positional_encoding has shape [1, 9216, 128]' in capsys.readouterr().err


def test_pretrained_init_at_384_and_a_clear_error_at_the_wrong_size(tmp_path):
    torch.manual_seed(0)
    model = PolaSwin(arch=SWIN_NARROW, pretrain_img_size=384, window_size=12, out_indices=(3, ))
    model.init_weights()
    classifier = {f'backbone.{k}': v for k, v in model.state_dict().items()}
    path = str(tmp_path / 'official_384.pth')
    torch.save(to_official(classifier, 'swin', pretrain_img_size=384, window_size=12), path)
    loaded = PolaSwin(arch=SWIN_NARROW, pretrain_img_size=384, window_size=12, out_indices=(3, ),
                      init_cfg=dict(type='Pretrained', checkpoint=path))
    loaded.init_weights()
    torch.testing.assert_close(loaded.state_dict(), model.state_dict(), rtol=0, atol=0)
    x = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), model.eval()(x), rtol=0, atol=0)
    wrong = PolaSwin(arch=SWIN_NARROW, out_indices=(3, ), init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(ValueError, match=r'made for pretrain_img_size=384, window_size=12, but '
                                         r'PolaSwin is built with pretrain_img_size=224, window_size=7'):
        wrong.init_weights()


def test_official_model_settings_of_pvt_and_bad_shapes():
    with torch.device('meta'):
        pvt = PolaPVT(arch='tiny', pretrain_img_size=256, out_indices=(3, ))
    assert official_model_settings(pvt.state_dict(), 'pvt') == dict(pretrain_img_size=256)
    with pytest.raises(ValueError, match='pos_embed1 is missing'):
        official_model_settings({'block1.0.attn.qg.weight': torch.zeros(2, 1)}, 'pvt')
    with pytest.raises(ValueError, match='pos_embed1 holds 10 tokens, not a square grid'):
        official_model_settings({'pos_embed1': torch.zeros(1, 10, 4)}, 'pvt')
