"""StagedBackbone, the base of the families: arch validation, index checks, frozen stages, the one
Pretrained loader (unwrapping, prefixes, strictness, shape check, conversion hook) and the input
check of forward (bad images named, empty batches, in_channels) in each of the four families."""
import pytest
import torch
from torch import nn

from mmlinattn.models.backbones import LaplacianFormer, PolaDeiT, PolaPVT, PolaSwin, StagedBackbone
from mmlinattn.models.backbones.base import strip_prefix, unwrap_state_dict


class TwoStage(StagedBackbone):
    """The smallest family: a linear layer and an output norm per stage."""
    num_stages = 2
    arch_settings = {'a': dict(widths=[2, 3])}
    arch_defaults = dict(scale=[1, 1])
    per_stage_keys = ('widths', 'scale')

    def __init__(self, arch='a', out_indices=(0, 1), frozen_stages=-1, norm_eval=False,
                 init_cfg=None):
        super().__init__(arch, out_indices, frozen_stages, norm_eval, init_cfg)
        self.stages = nn.ModuleList(nn.Linear(w, w) for w in self.arch['widths'])
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(self.arch['widths'][i]))
        self.bn = nn.BatchNorm1d(2)
        self._freeze_stages()

    def stage_modules(self, i):
        return [self.stages[i]]

    def convert_state_dict(self, state_dict):
        renamed = {k.replace('old_', ''): v for k, v in state_dict.items() if k != 'junk'}
        return renamed, ({'junk': 'not a weight of ours'} if 'junk' in state_dict else {})


@pytest.mark.parametrize('arch,match', [
    ('b', r"arch must be one of \['a'\] or a dict, got 'b'"),
    (3, 'arch must be a str or a dict, got int'),
    (dict(scale=[1, 2]), r"arch dict misses \['widths'\]"),
    (dict(widths=[1, 2, 3]), r'arch widths must have 2 entries, got \[1, 2, 3\]'),
])
def test_arch_validation_names_the_problem(arch, match):
    with pytest.raises(ValueError, match=match):
        TwoStage(arch=arch)


def test_arch_dict_is_completed_from_the_defaults():
    model = TwoStage(arch=dict(widths=[4, 5]))
    assert model.arch == dict(widths=[4, 5], scale=[1, 1])


@pytest.mark.parametrize('kwargs,match', [
    (dict(out_indices=(2, )), r'out_indices must be a non-empty subset of 0\.\.1'),
    (dict(out_indices=()), 'out_indices must be a non-empty subset'),
    (dict(frozen_stages=3), r'frozen_stages must be an integer in -1\.\.2, got 3'),
    (dict(frozen_stages=True), 'frozen_stages must be an integer'),
])
def test_index_checks(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TwoStage(**kwargs)


def test_negative_out_indices_count_from_the_end():
    assert TwoStage(out_indices=(-1, )).out_indices == (1, )


def test_frozen_stages_and_norm_eval_survive_train():
    model = TwoStage(frozen_stages=1, norm_eval=True).train()
    assert not model.stages[0].training and model.stages[1].training
    assert not any(p.requires_grad for p in model.stages[0].parameters())
    assert all(p.requires_grad for p in model.stages[1].parameters())
    assert not model.bn.training


def test_unwrap_state_dict_one_order_and_ddp_prefix():
    weights = {'module.w': torch.zeros(1)}
    assert list(unwrap_state_dict({'state_dict': weights, 'meta': {}})) == ['w']
    assert list(unwrap_state_dict({'model': weights, 'epoch': 3})) == ['w']
    with pytest.raises(ValueError, match='a checkpoint must be a dict of tensors'):
        unwrap_state_dict({'state_dict': {'w': 'not a tensor'}})
    assert list(strip_prefix({'backbone.a': 1, 'neck.b': 2})) == ['a']
    assert list(strip_prefix({'a': 1}, prefix='')) == ['a']


def _save(path, model, **edits):
    state = {f'backbone.{k}': v for k, v in model.state_dict().items()}
    state.update(edits)
    torch.save({'state_dict': state, 'meta': {}}, path)
    return str(path)


def test_pretrained_loads_through_the_conversion_hook(tmp_path):
    source = TwoStage()
    with torch.no_grad():
        source.stages[1].weight.fill_(3.0)
    state = {('backbone.old_' + k if k.startswith('stages.1') else 'backbone.' + k): v
             for k, v in source.state_dict().items()}
    state['backbone.junk'] = torch.zeros(1)
    path = str(tmp_path / 'renamed.pth')
    torch.save({'state_dict': state}, path)
    target = TwoStage(init_cfg=dict(type='Pretrained', checkpoint=path))
    target.init_weights()
    assert torch.equal(target.stages[1].weight, source.stages[1].weight)


def test_pretrained_is_strict_and_names_the_keys(tmp_path):
    path = _save(tmp_path / 'extra.pth', TwoStage(), **{'backbone.extra.weight': torch.zeros(1)})
    with pytest.raises(ValueError, match=r'missing keys: none; unexpected keys: extra\.weight'):
        TwoStage(init_cfg=dict(type='Pretrained', checkpoint=path)).init_weights()
    relaxed = TwoStage(init_cfg=dict(type='Pretrained', checkpoint=path, strict=False))
    relaxed.init_weights()  # logs the key and loads the rest

    source = TwoStage()
    state = {f'backbone.{k}': v for k, v in source.state_dict().items() if not k.startswith('stages.0')}
    path = str(tmp_path / 'missing.pth')
    torch.save({'state_dict': state}, path)
    with pytest.raises(ValueError, match=r'missing keys: stages\.0\.weight, stages\.0\.bias'):
        TwoStage().load_pretrained(path)


def test_output_norms_may_be_missing(tmp_path):
    path = _save(tmp_path / 'one_output.pth', TwoStage(out_indices=(1, )))
    missing, unexpected = TwoStage(out_indices=(0, 1)).load_pretrained(path)
    assert sorted(missing) == ['norm0.bias', 'norm0.weight'] and unexpected == []


def test_wrong_shape_fails_naming_the_key_before_loading(tmp_path):
    target = TwoStage()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    path = _save(tmp_path / 'misshapen.pth', TwoStage(arch=dict(widths=[2, 4])))
    with pytest.raises(ValueError, match=r'stages\.1\.weight has shape \[4, 4\] but TwoStage '
                                         r'expects \[3, 3\]'):
        target.load_pretrained(path)
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())


@pytest.mark.parametrize('family', [LaplacianFormer, PolaPVT, PolaSwin])
def test_the_three_families_share_the_base(family):
    assert issubclass(family, StagedBackbone)
    with pytest.raises(ValueError, match='arch must be one of'):
        family(arch='no-such-arch')
    with pytest.raises(ValueError, match='out_indices must be a non-empty subset of 0..3'):
        family(out_indices=(4, ))


# ---- the input check (StagedBackbone.forward) ----------------------------------------------------
# The smallest member of each family that runs a 32x32 image.
TINY = {
    LaplacianFormer: dict(arch=dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 1, 1, 2],
                                    depths=[1, 1, 1, 1])),
    PolaPVT: dict(arch=dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], depths=[1, 1, 1, 1])),
    PolaSwin: dict(arch=dict(embed_dims=16, depths=[1, 1, 2, 2], num_heads=[1, 2, 4, 8])),
    PolaDeiT: dict(arch=dict(embed_dims=32, depth=2, num_heads=2)),
}
FAMILIES = pytest.mark.parametrize('family', list(TINY), ids=[f.__name__ for f in TINY])


def _tiny(family, **kwargs):
    torch.manual_seed(0)
    return family(**TINY[family], **kwargs).eval()


@FAMILIES
@pytest.mark.parametrize('image,got', [
    (torch.zeros(2, 1, 32, 32), r'shape \[2, 1, 32, 32\], dtype torch\.float32'),
    (torch.zeros(2, 4, 32, 32), r'shape \[2, 4, 32, 32\], dtype torch\.float32'),
    (torch.zeros(3, 32, 32), r'shape \[3, 32, 32\], dtype torch\.float32'),
    (torch.zeros(1, 2, 3, 32, 32), r'shape \[1, 2, 3, 32, 32\], dtype torch\.float32'),
    (torch.zeros(2, 3, 32, 32, dtype=torch.uint8), r'shape \[2, 3, 32, 32\], dtype torch\.uint8'),
    (torch.zeros(2, 3, 32, 32, dtype=torch.int64), r'shape \[2, 3, 32, 32\], dtype torch\.int64'),
    (torch.zeros(2, 3, 0, 32), r'shape \[2, 3, 0, 32\], dtype torch\.float32'),
    ([torch.zeros(3, 32, 32)], 'a list'),
], ids=['1-channel', '4-channel', '3-D', '5-D', 'uint8', 'int64', 'no-rows', 'list'])
def test_bad_input_is_named(family, image, got):
    """One ValueError naming the backbone, what it expects and what arrived, before any stage runs."""
    expected = (rf'{family.__name__} expects a floating-point tensor \[B, in_channels=3, H, W\] '
                rf'with H, W >= 1; got {got}$')
    with pytest.raises(ValueError, match=expected):
        _tiny(family)(image)


@FAMILIES
@pytest.mark.parametrize('size', [(32, 32), (37, 21)], ids=['32', '37x21'])
def test_empty_batch_gives_the_shapes_of_a_full_one(family, size):
    """B = 0 gives empty outputs of the shapes (and dtype) a B = 1 run gives, for every out_indices
    selection (outputs come in stage order, whatever the order of out_indices)."""
    for out_indices in ([(0, )] if family.num_stages == 1 else [(0, 1, 2, 3), (3, 1)]):
        model = _tiny(family, out_indices=out_indices)
        with torch.no_grad():
            full = model(torch.randn(1, 3, *size))
            empty = model(torch.randn(0, 3, *size))
        assert [tuple(o.shape[1:]) for o in empty] == [tuple(o.shape[1:]) for o in full]
        assert all(o.shape[0] == 0 and o.dtype == torch.float32 for o in empty)
        assert [shape for shape in model.output_shapes(*size)] == [tuple(o.shape[1:]) for o in full]


@FAMILIES
def test_in_channels_sets_what_the_check_accepts(family):
    model = _tiny(family, in_channels=4)
    with torch.no_grad():
        outs = model(torch.randn(1, 4, 32, 32))
    assert [tuple(o.shape[1:]) for o in outs] == model.output_shapes(32, 32)
    with pytest.raises(ValueError, match=r'in_channels=4, H, W\] with H, W >= 1; got shape \[1, 3,'):
        model(torch.randn(1, 3, 32, 32))
    for bad in (0, True, 3.0):
        with pytest.raises(ValueError, match=f'in_channels must be a positive integer, got {bad!r}'):
            family(**TINY[family], in_channels=bad)
