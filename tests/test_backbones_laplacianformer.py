"""LaplacianFormer backbone: shapes at any input size, freezing, checkpointing, bf16, loading."""
import math

import pytest
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from mmlinattn.models.backbones import LaplacianFormer
from mmlinattn.ops.dispatch import has_kernel

TINY_DIMS = (64, 128, 320, 512)


def tiny(**kwargs):
    torch.manual_seed(0)
    model = LaplacianFormer(arch='tiny', **kwargs)
    model.init_weights()
    return model


def expected_shapes(batch, height, width, out_indices=(0, 1, 2, 3)):
    return [(batch, TINY_DIMS[i], math.ceil(height / 2**(i + 2)), math.ceil(width / 2**(i + 2)))
            for i in out_indices]


@pytest.fixture(scope='module')
def tiny_eval():
    return tiny(drop_path_rate=0.0).eval()


@pytest.mark.parametrize('batch', [1, 3])
@pytest.mark.parametrize('size', [(224, 224), (97, 131), (32, 32)])
def test_output_shapes_and_strides(tiny_eval, batch, size):
    outs = tiny_eval(torch.randn(batch, 3, *size))
    assert [tuple(o.shape) for o in outs] == expected_shapes(batch, *size)
    assert all(torch.isfinite(o).all() for o in outs)
    # contiguous NCHW: mmcv's CPU RoIAlign reads a channels-last map as if it were NCHW
    assert all(o.is_contiguous() for o in outs)


@pytest.mark.parametrize('size', [(512, 512), pytest.param((800, 1333), marks=pytest.mark.slow)])
def test_large_inputs_forward_only(size):
    # Paper-literal landmarks grow with the input (m = H*W / 32^2 per head at every Nystrom stage:
    # 1050 at 800x1333), and each Newton-Schulz step costs 2 m^3; 2 steps keep this shape test fast.
    model = tiny(drop_path_rate=0.0, attn_cfg=dict(ns_iters=2, max_landmark_grid=None)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    assert [tuple(o.shape) for o in outs] == expected_shapes(1, *size)
    assert all(torch.isfinite(o).all() for o in outs)


def test_default_landmark_cap_keeps_the_224_model_and_large_inputs_cheap(tiny_eval):
    """The default max_landmark_grid=7 is the 224^2 grid: bit-identical to the paper-literal
    landmarks (None) at 224^2, at most 49 landmarks per head above it."""
    assert all(block.attn.max_landmark_grid == (7, 7) for stage in tiny_eval.stages
               for block in stage.blocks)
    uncapped = tiny(drop_path_rate=0.0, attn_cfg=dict(max_landmark_grid=None)).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        for out, ref in zip(tiny_eval(x), uncapped(x)):
            assert torch.equal(out, ref)
        attn = tiny_eval.stages[0].blocks[0].attn
        q = torch.randn(1, attn.num_heads, 128 * 160, attn.head_dims)
        assert attn.landmarks(q, (128, 160)).shape[2] == 49
        outs = tiny_eval(torch.randn(1, 3, 512, 640))
    assert [tuple(o.shape) for o in outs] == expected_shapes(1, 512, 640)
    assert all(torch.isfinite(o).all() for o in outs)


def test_backward_reaches_every_parameter():
    model = tiny(drop_path_rate=0.1).train()
    outs = model(torch.randn(2, 3, 64, 96))
    sum(o.square().mean() for o in outs).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_out_indices_select_stages_and_norms():
    model = tiny(out_indices=(1, 3))
    outs = model(torch.randn(1, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == expected_shapes(1, 64, 64, (1, 3))
    assert hasattr(model, 'norm1') and hasattr(model, 'norm3') and not hasattr(model, 'norm0')


def test_frozen_stages_have_no_grads_and_stay_in_eval():
    model = tiny(frozen_stages=2, drop_path_rate=0.0)
    model.train()
    frozen = [model.stages[0], model.stages[1], model.norm0, model.norm1]
    for module in frozen:
        assert all(not m.training for m in module.modules())
        assert all(not p.requires_grad for p in module.parameters())
    assert all(m.training for m in model.stages[2].modules())
    outs = model(torch.randn(1, 3, 64, 64))
    sum(o.sum() for o in outs).backward()
    assert all(p.grad is None for module in frozen for p in module.parameters())
    assert all(p.grad is not None for p in model.stages[2].parameters())


def test_norm_eval_keeps_batchnorm_in_eval_mode():
    model = tiny(norm_eval=True).train()
    batch_norms = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert batch_norms and all(not bn.training for bn in batch_norms)
    assert model.stages[0].blocks[0].training
    running_mean = batch_norms[0].running_mean.clone()
    model(torch.randn(2, 3, 32, 32))
    assert torch.equal(batch_norms[0].running_mean, running_mean)


def test_with_cp_gives_same_outputs_and_grads():
    x = torch.randn(2, 3, 48, 64)
    results = []
    for with_cp in (False, True):
        model = tiny(with_cp=with_cp, drop_path_rate=0.0).train()
        outs = model(x)
        sum((o * torch.linspace(-1, 1, o.numel()).reshape(o.shape)).sum() for o in outs).backward()
        results.append((outs, {n: p.grad for n, p in model.named_parameters()}))
    (outs_plain, grads_plain), (outs_cp, grads_cp) = results
    for a, b in zip(outs_plain, outs_cp):
        assert torch.allclose(a, b, atol=1e-6)
    for name, grad in grads_plain.items():
        assert torch.allclose(grads_cp[name], grad, rtol=1e-4, atol=1e-6), name


def test_bf16_autocast_is_finite_and_close_to_fp32(tiny_eval):
    x = torch.randn(2, 3, 128, 160)
    with torch.no_grad():
        expected = tiny_eval(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            outs = tiny_eval(x)
    for out, ref in zip(outs, expected):
        assert torch.isfinite(out).all()
        assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2


@pytest.mark.parametrize('batch', [1, 2])
def test_blocks_and_their_gradients_see_dense_tokens(tiny_eval, batch):
    """The stem and the stage convolutions run channels-last, so each block's tokens
    [B, H*W, C], and the gradients flowing back into them, are contiguous rows: a transposed view
    would make every residual add and norm of the stage stride through or copy it."""
    model = tiny(drop_path_rate=0.0).train()
    seen = []
    hooks = [block.register_forward_pre_hook(lambda _, args: seen.append(args[0].is_contiguous()))
             for stage in model.stages for block in stage.blocks]
    grads = []
    for stage in model.stages:
        stage.blocks[0].register_full_backward_pre_hook(
            lambda _, grad_out: grads.append(grad_out[0].is_contiguous()))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(batch, 3, 96, 128))
    sum(out.float().mean() for out in outs).backward()
    for hook in hooks:
        hook.remove()
    assert seen == [True] * sum(model.depths)
    assert grads == [True] * model.num_stages


def test_stage_batchnorms_get_gradients_with_their_outputs_strides():
    """At batch 1 a gradient whose batch stride differs from the map's (what
    ``map.flatten(2).transpose(1, 2)`` hands back) sends BatchNorm's CPU backward to a path ~15x
    slower; the stage tokens are a view whose backward keeps the map's strides."""
    model = tiny(drop_path_rate=0.0).train()
    pairs = []

    def keep_strides(module, args, out):
        out.register_hook(lambda grad: pairs.append((out.stride(), grad.stride())))

    for stage in model.stages[1:]:
        stage.patch_embed.bn.register_forward_hook(keep_strides)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(1, 3, 96, 128))
    sum(out.float().mean() for out in outs).backward()
    assert len(pairs) == model.num_stages - 1
    assert all(out_strides == grad_strides for out_strides, grad_strides in pairs), pairs


@pytest.mark.skipif(not has_kernel('laplacian_kernel', 'cpu'),
                    reason='mmlinattn._ext is not built with the CPU Laplacian kernel')
def test_compiled_ops_match_reference(tiny_eval, monkeypatch):
    x = torch.randn(1, 3, 96, 128)
    outs = {}
    for mode in ('reference', 'compiled'):
        monkeypatch.setenv('MMLINATTN_OPS', mode)
        with torch.no_grad():
            outs[mode] = tiny_eval(x)
    for ref, compiled in zip(outs['reference'], outs['compiled']):
        assert torch.allclose(compiled, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('wrapper', ['state_dict', 'model', None])
def test_pretrained_checkpoint_loads_through_wrappers(tmp_path, wrapper):
    source = tiny()
    state_dict = {f'backbone.{k}': v for k, v in source.state_dict().items()}
    state_dict['head.fc.weight'] = torch.zeros(3)
    path = tmp_path / 'ckpt.pth'
    torch.save({wrapper: state_dict} if wrapper else state_dict, path)
    torch.manual_seed(1)
    target = LaplacianFormer(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    target.init_weights()
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name


def test_pretrained_loads_a_classifier_checkpoint_into_a_dense_backbone(tmp_path):
    """A classifier (out_indices=(3,)) saved by mmpretrain loads into the 4-output detection
    backbone: the stride-4..16 output norms are the only keys allowed to be missing."""
    classifier = tiny(out_indices=(3, ))
    path = tmp_path / 'classifier.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in classifier.state_dict().items()},
                'meta': {}}, path)
    dense = LaplacianFormer(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    missing, unexpected = dense.load_pretrained(str(path))
    assert sorted(missing) == [f'norm{i}.{p}' for i in range(3) for p in ('bias', 'weight')]
    assert unexpected == []
    for key, value in classifier.state_dict().items():
        assert torch.equal(dense.state_dict()[key], value), key


def _with_ffn_keys(state_dict):
    """The layout of checkpoints that name the blocks' MLP ``ffn`` (``stages.i.blocks.j.ffn.*``)."""
    return {key.replace('.mlp.', '.ffn.'): value for key, value in state_dict.items()}


def test_checkpoints_with_ffn_keys_load_strictly_and_through_load_state_dict(tmp_path):
    source = tiny()
    legacy = _with_ffn_keys(source.state_dict())
    assert sum('.ffn.fc1.weight' in key for key in legacy) == sum(source.depths)
    path = tmp_path / 'ffn_keys.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in legacy.items()}}, path)
    torch.manual_seed(1)
    pretrained = LaplacianFormer(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    pretrained.init_weights()  # strict: an unmapped ffn key would be unexpected, mlp missing
    torch.manual_seed(2)
    detector = torch.nn.ModuleDict({'backbone': LaplacianFormer(arch='tiny')})  # as a runner loads
    result = detector.load_state_dict({f'backbone.{k}': v for k, v in legacy.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for model in (pretrained, detector['backbone']):
        for name, tensor in source.state_dict().items():
            assert torch.equal(model.state_dict()[name], tensor), name


def test_builds_from_downstream_registries():
    from mmengine.registry import MODELS as ROOT_MODELS
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmengine'):
        model = ROOT_MODELS.build(dict(type='mmlinattn.LaplacianFormer', arch='tiny'))
    assert isinstance(model, LaplacianFormer)


def test_arch_as_dict_and_invalid_arguments():
    model = LaplacianFormer(arch=dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4],
                                      depths=[1, 1, 1, 1]))
    outs = model(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [32, 64, 96, 128]
    with pytest.raises(ValueError, match='arch must be one of'):
        LaplacianFormer(arch='giant')
    with pytest.raises(ValueError, match='misses'):
        LaplacianFormer(arch=dict(embed_dims=[64] * 4))
    with pytest.raises(ValueError, match='out_indices'):
        LaplacianFormer(out_indices=(4, ))
