"""mmlinattn.models.roi_extractors: mmdet's SingleRoIExtractor with the plugin's CPU RoIAlign gives
mmdet's own extractor's features and gradients (fp32), reads bf16 and channels-last maps as they
are, hands ONNX export and other devices to mmcv's RoIAlign, and is not imported by
``import mmlinattn``."""
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip('mmdet')
from mmdet.registry import MODELS  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

import mmlinattn  # noqa: E402,F401
from mmlinattn.models import roi_extractors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRIDES = [4, 8, 16, 32]


def _extractors(output_size=7):
    """The plugin's extractor and mmdet's, with the same arguments."""
    init_default_scope('mmdet')
    layer = dict(output_size=output_size, sampling_ratio=0)
    common = dict(out_channels=16, featmap_strides=STRIDES)
    ours = MODELS.build(dict(type='mmlinattn.SingleRoIExtractor',
                             roi_layer=dict(type='mmlinattn.RoIAlign', **layer), **common))
    mmdet = MODELS.build(dict(type='SingleRoIExtractor', roi_layer=dict(type='RoIAlign', **layer),
                              **common))
    return ours, mmdet


def _feats_and_rois(seed=0):
    """A 2-image FPN pyramid of a 93x120 input and rois of every level's size."""
    gen = torch.Generator().manual_seed(seed)
    feats = [torch.randn(2, 16, -(-93 // s), -(-120 // s), generator=gen) for s in STRIDES]
    corner = torch.rand(30, 2, generator=gen) * torch.tensor([110., 85.])
    size = torch.rand(30, 2, generator=gen) ** 2 * 300 + 4
    rois = torch.cat([torch.randint(0, 2, (30, 1), generator=gen).float(), corner, corner + size], 1)
    return feats, rois


def _forward_backward(extractor, feats, rois, grad=None):
    leaves = [f.detach().requires_grad_() for f in feats]
    out = extractor(leaves, rois)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)) if grad is None else grad
    return out, torch.autograd.grad(out, leaves, grad.to(out.dtype))


@pytest.mark.parametrize('output_size', [7, 14])
def test_same_features_and_gradients_as_mmdets_extractor(output_size):
    ours, mmdet = _extractors(output_size)
    assert all(type(layer) is roi_extractors.RoIAlign for layer in ours.roi_layers)
    assert [layer.spatial_scale for layer in ours.roi_layers] == [1 / s for s in STRIDES]
    feats, rois = _feats_and_rois()
    (out, grads), (want, want_grads) = (_forward_backward(e, feats, rois) for e in (ours, mmdet))
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_bf16_and_channels_last_maps_are_read_as_they_are(monkeypatch):
    """No cast to fp32 and no misread layout (mmcv's CPU kernel reads channels-last as NCHW)."""
    ours, mmdet = _extractors()
    feats, rois = _feats_and_rois()
    want, want_grads = _forward_backward(mmdet, feats, rois)
    out, grads = _forward_backward(ours, [f.contiguous(memory_format=torch.channels_last)
                                          for f in feats], rois)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
    out, grads = _forward_backward(ours, [f.bfloat16() for f in feats], rois)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)
    # mmdet's extractor casts the rois to the maps' dtype ("when amp is on"): bf16 rounds them
    want, _ = _forward_backward(mmdet, feats, rois.bfloat16().float())
    torch.testing.assert_close(out.float(), want, rtol=0, atol=2e-2 * want.abs().max().item())


def test_onnx_export_runs_mmcvs_roi_align(monkeypatch):
    """mmdeploy exports mmcv's RoIAlign (its symbolic); the plugin's layer hands it over."""
    import importlib
    mmcv_roi_align = importlib.import_module('mmcv.ops.roi_align')  # the module, not the function
    calls = []
    original = mmcv_roi_align.roi_align

    def spy(*args, **kwargs):
        calls.append(args[0].dtype)
        return original(*args, **kwargs)

    monkeypatch.setattr(mmcv_roi_align, 'roi_align', spy)
    layer = roi_extractors.RoIAlign(7, spatial_scale=0.25, sampling_ratio=0)
    feats, rois = _feats_and_rois()
    layer(feats[0], rois)
    assert calls == []
    monkeypatch.setattr(torch.onnx, 'is_in_onnx_export', lambda: True)
    layer(feats[0], rois)
    assert calls == [torch.float32]


def test_max_pooling_is_mmcvs():
    layer = roi_extractors.RoIAlign(3, spatial_scale=0.5, pool_mode='max')
    mmcv_layer = roi_extractors.mmcv_ops.RoIAlign(3, spatial_scale=0.5, pool_mode='max')
    feats, rois = _feats_and_rois()
    assert torch.equal(layer(feats[1], rois), mmcv_layer(feats[1], rois))


def test_import_mmlinattn_leaves_it_and_mmdet_out():
    script = 'import sys, mmlinattn; assert not {"mmdet", "mmlinattn.models.roi_extractors"} & set(sys.modules)'
    subprocess.run([sys.executable, '-c', script], check=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=ROOT))
