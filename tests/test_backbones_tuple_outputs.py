"""TupleOutputs: a library backbone that returns a list (mmdet's PVT) handed on as a tuple, with
its parameters under ``backbone.``, and a clear error for a backbone that is not a config."""
import pytest
import torch

from mmlinattn.models.backbones import TupleOutputs


def test_list_outputs_become_a_tuple_with_the_wrapped_values():
    import mmdet.models  # noqa: F401  (registers mmdet's backbones)
    torch.manual_seed(0)
    cfg = dict(type='mmdet.PyramidVisionTransformer', num_layers=[1, 1, 1, 1], out_indices=(2, 3))
    model = TupleOutputs(backbone=cfg).eval()
    image = torch.randn(1, 3, 35, 45)
    with torch.no_grad():
        out = model(image)
        expected = model.backbone(image)
    assert isinstance(expected, list) and isinstance(out, tuple)
    assert [o.shape[1] for o in out] == [320, 512]
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    assert all(key.startswith('backbone.') for key in model.state_dict())


@pytest.mark.parametrize('backbone', [None, 'mmdet.PyramidVisionTransformer', dict(num_layers=[1, 1, 1, 1])])
def test_backbone_must_be_a_config_with_a_type(backbone):
    with pytest.raises(TypeError, match='TupleOutputs: backbone must be a config dict with a type'):
        TupleOutputs(backbone=backbone)
