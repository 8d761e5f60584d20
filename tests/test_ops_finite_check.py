"""Non-finite inputs: NaN in, NaN out, in both backbone families and every implementation of the
ops, with no exception; MMLINATTN_CHECK_FINITE=1 names the first attention layer whose input is
not finite."""
import pytest
import torch
from torch import nn

from mmlinattn.models.backbones import LaplacianFormer, PolaPVT, PolaSwin
from mmlinattn.ops import set_finite_checks
from mmlinattn.ops.torch_compat import missing_library_api

SMALL = {
    'LaplacianFormer': lambda: LaplacianFormer(
        arch=dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4], depths=[1, 1, 1, 1]),
        drop_path_rate=0.0),
    'PolaPVT': lambda: PolaPVT(arch=dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4],
                                         depths=[1, 1, 1, 1]), drop_path_rate=0.0),
    'PolaSwin': lambda: PolaSwin(arch=dict(embed_dims=32, depths=[1, 1, 1, 1],
                                           num_heads=[1, 2, 4, 8]), drop_path_rate=0.0),
}


class Detector(nn.Module):
    """Stands for an mmdet model: the backbone is its ``backbone`` attribute."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone

    def forward(self, x):
        return self.backbone(x)


def image_with_nan():
    image = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    image[1, 0, 10, 20] = float('nan')
    return image


@pytest.fixture(autouse=True)
def checks_follow_env(monkeypatch):
    monkeypatch.delenv('MMLINATTN_CHECK_FINITE', raising=False)
    set_finite_checks(None)
    yield
    set_finite_checks(None)


@pytest.mark.parametrize('family', list(SMALL))
def test_nan_image_gives_nan_outputs_in_every_implementation(monkeypatch, family):
    """Image 1 has one NaN pixel: its outputs are NaN, image 0's are finite, no exception, and the
    compiled ops and the references give the same NaN pattern (train mode: batch statistics).
    A torch too old for the compiled operators runs (and checks) the references only."""
    torch.manual_seed(0)
    model = SMALL[family]()
    image = image_with_nan()
    patterns = {}
    modes = ('reference', ) if missing_library_api() else ('compiled', 'reference')
    for mode in modes:
        monkeypatch.setenv('MMLINATTN_OPS', mode)
        outs = model(image)
        assert all(o[1].isnan().any() for o in outs), family
        patterns[mode] = [o.isnan() for o in outs]
    assert all(torch.equal(a, b) for a, b in zip(patterns[modes[0]], patterns['reference']))
    outs = SMALL[family]().eval()(image)  # a fresh model: train mode put NaN in the BN statistics
    assert all(torch.isfinite(o[0]).all() and o[1].isnan().any() for o in outs)


@pytest.mark.parametrize('family,first_layer', [
    ('LaplacianFormer', 'backbone.stages.0.blocks.0.attn'),
    ('PolaPVT', 'backbone.block1.0.attn'),
    ('PolaSwin', 'backbone.layers.0.blocks.0.attn'),
])
def test_opt_in_check_names_the_first_layer(monkeypatch, family, first_layer):
    monkeypatch.setenv('MMLINATTN_CHECK_FINITE', '1')
    detector = Detector(SMALL[family]())
    with pytest.raises(ValueError, match=rf'^{first_layer} \(\w+Attention\): its input of shape '
                       r'\[2, \d+, 32\] has \d+ non-finite values'):
        detector(image_with_nan())
    detector(torch.randn(1, 3, 64, 96))  # finite: no error


def test_check_finds_a_layer_deep_inside(monkeypatch):
    """A NaN weight in stage 2's downsampling conv: stage 1 passes, stage 2's first block fails."""
    detector = Detector(SMALL['LaplacianFormer']())
    with torch.no_grad():
        detector.backbone.stages[1].patch_embed.conv.weight[0, 0, 0, 0] = float('nan')
    image = torch.randn(1, 3, 64, 96)
    assert detector(image)[1].isnan().all()  # off by default: NaN out, no error
    set_finite_checks(True)
    with pytest.raises(ValueError, match=r'^backbone\.stages\.1\.blocks\.0\.attn '):
        detector(image)
    set_finite_checks(False)
    monkeypatch.setenv('MMLINATTN_CHECK_FINITE', '1')  # the explicit switch wins over the env
    assert detector(image)[1].isnan().all()
