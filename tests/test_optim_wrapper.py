"""Mixed precision on the CPU: mmlinattn.MixedPrecisionOptimWrapper (bf16 autocast, fp32 parameters,
no loss scaling), built by name from mmdet's, mmseg's and mmpretrain's scopes; optimizer states and
runner checkpoints that move between fp32 and bf16 runs; mmlinattn.MixedPrecisionTestLoop; mmcv's
ops run in fp32 under bf16 autocast; the warning on a CPU without bf16 instructions; and ``--amp`` of
tools/train.py and tools/test.py."""
import copy
import importlib.util
import os
import types
import warnings

import pytest
import torch
from mmcv.ops import RoIAlign, nms
from mmengine.config import Config
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.model import BaseModel
from mmengine.optim import AmpOptimWrapper, OptimWrapper, build_optim_wrapper
from mmengine.registry import DefaultScope
from mmengine.runner import Runner

import train  # tools/ (pytest.ini puts it on sys.path)
from _common import load_config
from e2e_utils import ROOT, mmengine_log
from mmlinattn import cpu_autocast
from mmlinattn.cpu_autocast import run_mmcv_ops_in_fp32, warn_if_cpu_lacks_bf16
from mmlinattn.loops import MixedPrecisionTestLoop
from mmlinattn.optim_wrapper import MixedPrecisionOptimWrapper

WRAPPER = 'mmlinattn.MixedPrecisionOptimWrapper'
TEST_LOOP = 'mmlinattn.MixedPrecisionTestLoop'
DET_CONFIG = os.path.join(ROOT, 'configs/mask_rcnn_laplacian_tiny_1x_coco.py')
CLS_CONFIG = os.path.join(ROOT, 'tests/configs/resnet18_toy_imagenet.py')
# The CPU path: on a GPU machine the wrapper is mmengine's AmpOptimWrapper (the `cuda` test below).
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU path (no CUDA device)')


@pytest.fixture(autouse=True)
def fresh_bf16_warning():
    """warn_if_cpu_lacks_bf16 warns once per process; each test starts (and leaves) it unwarned."""
    warn_if_cpu_lacks_bf16.cache_clear()
    yield
    warn_if_cpu_lacks_bf16.cache_clear()


def adamw_wrapper(model, wrapper_type=MixedPrecisionOptimWrapper, **kwargs):
    return wrapper_type(optimizer=torch.optim.AdamW(model.parameters(), lr=0.1), **kwargs)


# ---------------------------------------------------------------- the wrapper on the CPU


@cpu_only
def test_cpu_forward_is_bf16_with_fp32_parameters_and_unscaled_fp32_gradients():
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 4), torch.randn(16, 8)
    wrapper = adamw_wrapper(model, loss_scale=512.0)  # the GPU's setting: accepted, not used
    assert wrapper.loss_scaler is None and wrapper.cast_dtype == torch.bfloat16
    assert not any(isinstance(v, torch.amp.GradScaler) for v in vars(wrapper).values())

    with wrapper.optim_context(model):
        out = model(x)
    assert out.dtype == torch.bfloat16
    assert model(x).dtype == torch.float32  # autocast ends with the context
    loss = out.float().square().mean()
    wrapper.backward(loss)
    grad = model.weight.grad.clone()
    with torch.autocast('cpu', dtype=torch.bfloat16):  # the same forward, backward unscaled
        expected, = torch.autograd.grad(model(x).float().square().mean(), model.weight)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)
    assert grad.dtype == model.weight.dtype == torch.float32

    before = model.weight.detach().clone()
    wrapper.step()
    assert model.weight.dtype == torch.float32
    assert not torch.equal(model.weight.detach(), before)


@cpu_only
def test_update_params_clips_and_steps_like_the_plain_wrapper():
    """Gradient clipping and accumulation are OptimWrapper's: the same parameters from the same grads."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(8, 4) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    wrappers = [adamw_wrapper(models[0], clip_grad=dict(max_norm=0.01)),
                adamw_wrapper(models[1], OptimWrapper, clip_grad=dict(max_norm=0.01))]
    x = torch.randn(16, 8)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = models[1](x).float().square().mean()
    wrappers[1].update_params(loss)
    with wrappers[0].optim_context(models[0]):
        loss = models[0](x).float().square().mean()
    wrappers[0].update_params(loss)
    torch.testing.assert_close(models[0].state_dict(), models[1].state_dict(), rtol=0, atol=0)


@cpu_only
def test_logs_its_precision_once_built():
    with mmengine_log() as messages:
        adamw_wrapper(torch.nn.Linear(2, 2))
    assert messages == ['MixedPrecisionOptimWrapper: autocast to torch.bfloat16 on cpu, fp32 parameters, '
                        'loss scaling: none']


@cpu_only
@pytest.mark.parametrize('arguments,message', [
    (dict(dtype='float16'), 'dtype: on the CPU MixedPrecisionOptimWrapper autocasts to bfloat16 only'),
    (dict(dtype='half'), "dtype must be None, one of ('float16', 'bfloat16', 'float32', 'float64')"),
    (dict(dtype=torch.int8), 'dtype must be None, one of'),
    (dict(loss_scale='dynamc'), "loss_scale must be 'dynamic', a float or a dict, got 'dynamc'"),
], ids=['float16-on-cpu', 'unknown-dtype-name', 'integer-dtype', 'unknown-loss-scale'])
def test_bad_arguments_raise_naming_them(arguments, message):
    with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
        adamw_wrapper(torch.nn.Linear(2, 2), **arguments)


@cpu_only
@pytest.mark.parametrize('dtype', [None, 'bfloat16', torch.bfloat16])
def test_bfloat16_spelled_any_way_is_the_cpu_dtype(dtype):
    assert adamw_wrapper(torch.nn.Linear(2, 2), dtype=dtype).cast_dtype == torch.bfloat16


@pytest.mark.cuda
def test_on_cuda_it_is_mmengines_amp_wrapper():
    model = torch.nn.Linear(8, 4).cuda()
    wrapper = adamw_wrapper(model)
    assert isinstance(wrapper, AmpOptimWrapper) and wrapper.cast_dtype is None
    assert isinstance(wrapper.loss_scaler, torch.amp.GradScaler)
    with wrapper.optim_context(model):
        assert model(torch.randn(2, 8, device='cuda')).dtype == torch.float16
    assert 'loss_scaler' in wrapper.state_dict()
    bf16 = adamw_wrapper(model, dtype='bfloat16')
    with bf16.optim_context(model):
        assert model(torch.randn(2, 8, device='cuda')).dtype == torch.bfloat16


# ---------------------------------------------------------------- the registry


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_built_by_name_from_each_librarys_scope(scope):
    """The Runner's path (build_optim_wrapper under the config's default_scope) and the library's
    own registry."""
    registry = importlib.import_module(f'{scope}.registry').OPTIM_WRAPPERS
    DefaultScope.get_instance(f'test_optim_wrapper_{scope}', scope_name=scope)
    model = torch.nn.Linear(2, 2)
    cfg = dict(type=WRAPPER, optimizer=dict(type='AdamW', lr=1e-3), clip_grad=dict(max_norm=1.0))
    built = build_optim_wrapper(model, cfg)
    assert type(built) is MixedPrecisionOptimWrapper
    assert built.optimizer.defaults['lr'] == 1e-3 and built.clip_grad_kwargs == dict(max_norm=1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert type(registry.build(dict(type=WRAPPER, optimizer=optimizer))) is MixedPrecisionOptimWrapper
    assert importlib.import_module(f'{scope}.registry').LOOPS.get(TEST_LOOP) is MixedPrecisionTestLoop


# ---------------------------------------------------------------- optimizer states, both ways


def _stepped(wrapper_type, seed=0):
    """A two-group AdamW (so that OptimWrapper also saves base_param_settings) after one step."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW([{'params': model[0].parameters()},
                                   {'params': model[1].parameters(), 'lr': 0.01}], lr=0.1)
    wrapper = wrapper_type(optimizer=optimizer)
    with wrapper.optim_context(model):
        loss = model(torch.randn(8, 4)).float().square().mean()
    wrapper.update_params(loss)
    return wrapper


def _assert_same_state(loaded, saved):
    assert loaded['param_groups'] == saved['param_groups']
    assert loaded.keys() == saved.keys()
    for index, state in saved['state'].items():
        torch.testing.assert_close(loaded['state'][index], state, rtol=0, atol=0)


@cpu_only
@pytest.mark.parametrize('source,target', [(OptimWrapper, MixedPrecisionOptimWrapper),
                                           (MixedPrecisionOptimWrapper, OptimWrapper)])
def test_optimizer_state_moves_between_fp32_and_bf16(source, target):
    saved = _stepped(source).state_dict()
    assert 'loss_scaler' not in saved and 'base_param_settings' in saved
    target_wrapper = _stepped(target, seed=1)
    target_wrapper.load_state_dict(dict(saved))
    _assert_same_state(target_wrapper.state_dict(), saved)
    assert all(t.dtype == torch.float32 for s in saved['state'].values() for t in s.values())


@cpu_only
def test_a_gpu_amp_state_loads_on_the_cpu_without_its_loss_scaler():
    saved = _stepped(OptimWrapper).state_dict()
    wrapper = _stepped(MixedPrecisionOptimWrapper, seed=1)
    with mmengine_log() as messages:
        wrapper.load_state_dict(dict(saved, loss_scaler={'scale': 65536.0, '_growth_tracker': 3}))
    assert messages == ['the loss scaler state in this optimizer state is not used: bf16 on the CPU is '
                        'not loss-scaled']
    _assert_same_state(wrapper.state_dict(), saved)


# ---------------------------------------------------------------- the CPU without bf16 instructions


@cpu_only
def test_warns_once_naming_the_missing_flags(monkeypatch):
    monkeypatch.setattr(cpu_autocast, 'cpu_flags', lambda: frozenset({'fpu', 'avx512f', 'avx512bw'}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        adamw_wrapper(torch.nn.Linear(2, 2))
        adamw_wrapper(torch.nn.Linear(2, 2))
        warn_if_cpu_lacks_bf16()
    assert [str(w.message) for w in caught] == [
        'this CPU has none of the bf16 instructions avx512_bf16 / amx_bf16 (not in /proc/cpuinfo flags): '
        'bf16 autocast runs emulated here, many times slower than fp32 (30x for a Mask R-CNN training '
        'step on an AVX2 CPU); train in fp32 here']
    assert caught[0].filename.endswith('optim_wrapper.py')  # said where the wrapper is built


@pytest.mark.parametrize('flags', [{'avx512_bf16'}, {'amx_bf16'}, {'avx512_bf16', 'amx_bf16'}, None])
def test_no_warning_with_either_flag_or_unreadable_flags(monkeypatch, flags):
    monkeypatch.setattr(cpu_autocast, 'cpu_flags', lambda: None if flags is None else frozenset(flags))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        warn_if_cpu_lacks_bf16()


@pytest.mark.parametrize('flags, cuda, native', [
    ({'avx2', 'fma'}, False, False), ({'avx2', 'amx_bf16'}, False, True),
    ({'avx512_bf16'}, False, True), ({'avx2'}, True, True), (None, False, False)])
def test_mixed_precision_is_native_on_a_gpu_or_a_cpu_with_bf16_instructions(monkeypatch, flags, cuda,
                                                                             native):
    # what the main job and the e2e tests read to choose --amp; unreadable flags choose fp32
    monkeypatch.setattr(cpu_autocast, 'cpu_flags', lambda: None if flags is None else frozenset(flags))
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: cuda)
    assert cpu_autocast.mixed_precision_is_native() is native


@pytest.mark.skipif(not os.path.isfile('/proc/cpuinfo'), reason='Linux: /proc/cpuinfo')
def test_cpu_flags_reads_proc_cpuinfo():
    with open('/proc/cpuinfo') as f:
        line = next(line for line in f if line.startswith('flags'))
    assert cpu_autocast.cpu_flags() == frozenset(line.split(':')[1].split())


# ---------------------------------------------------------------- mmcv's ops under bf16 autocast


class ToyDetector(torch.nn.Module):
    """A bf16-producing conv, an mmcv RoIAlign on its features, and a head whose post-processing runs
    mmcv's NMS: the places where mmdet's detectors hand mmcv's fp32-only CPU kernels bf16 tensors."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.roi_align = RoIAlign(output_size=2, spatial_scale=1.0, sampling_ratio=2)
        self.head = ToyHead()

    def forward(self, images, rois):
        features = self.conv(images)
        return features, self.roi_align(features, rois.to(features.dtype))


class ToyHead(torch.nn.Module):
    def predict_by_feat(self, boxes, scores, iou_threshold=0.5):
        dets, keep = nms(boxes, scores, iou_threshold)
        return dets


def _toy_inputs():
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(1, 3, 16, 16, generator=generator)
    rois = torch.tensor([[0, 1.0, 1.0, 9.0, 9.0], [0, 4.0, 2.0, 14.0, 12.0]])
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30.0]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    return images, rois, boxes, scores


def test_mmcv_ops_need_fp32_on_the_cpu():
    """Why run_mmcv_ops_in_fp32 exists: mmcv 2.1's CPU RoIAlign and NMS refuse bf16."""
    model = ToyDetector()
    images, rois, boxes, scores = _toy_inputs()
    with torch.autocast('cpu', dtype=torch.bfloat16), pytest.raises((RuntimeError, NotImplementedError)):
        model(images, rois)
    with pytest.raises(RuntimeError, match='Float but found BFloat16'):
        model.head.predict_by_feat(boxes.bfloat16(), scores.bfloat16())


def test_mmcv_ops_run_in_fp32_under_bf16_autocast():
    model = ToyDetector()
    images, rois, boxes, scores = _toy_inputs()
    _, expected = model(images, rois)
    run_mmcv_ops_in_fp32(model)
    images.requires_grad_(True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        features, pooled = model(images, rois)
    assert features.dtype == pooled.dtype == torch.bfloat16  # RoIAlign hands back autocast's dtype
    torch.testing.assert_close(pooled.float(), expected, rtol=0.05, atol=0.05)
    pooled.float().sum().backward()  # through mmcv's fp32 backward to the bf16 features
    assert images.grad is not None and images.grad.dtype == torch.float32
    with torch.autocast('cpu', dtype=torch.bfloat16):
        dets = model.head.predict_by_feat(boxes.bfloat16(), scores.bfloat16(), iou_threshold=0.5)
    assert dets.dtype == torch.float32  # post-processing results stay fp32
    torch.testing.assert_close(dets, model.head.predict_by_feat(boxes, scores), rtol=1e-2, atol=0)


def test_fp32_calls_run_unchanged_and_the_change_is_per_instance():
    model, other = ToyDetector(), ToyDetector()
    other.load_state_dict(model.state_dict())
    run_mmcv_ops_in_fp32(model)
    forward, predict = model.roi_align.forward, model.head.predict_by_feat
    run_mmcv_ops_in_fp32(model)  # idempotent
    assert model.roi_align.forward == forward and model.head.predict_by_feat == predict
    assert 'forward' not in vars(other.roi_align) and 'predict_by_feat' not in vars(other.head)
    assert 'forward' not in vars(model.conv)  # torch's modules keep their own forward
    images, rois, boxes, scores = _toy_inputs()
    torch.testing.assert_close(model(images, rois), other(images, rois), rtol=0, atol=0)
    torch.testing.assert_close(model.head.predict_by_feat(boxes, scores),
                               other.head.predict_by_feat(boxes, scores), rtol=0, atol=0)
    copied = copy.deepcopy(model)  # an EMA copy calls its own modules
    assert copied.roi_align.forward.__self__ is copied.roi_align
    assert copied.head.predict_by_feat.__self__ is copied.head


# ---------------------------------------------------------------- through mmengine's Runner


class TinyRegressor(BaseModel):
    """A linear regressor that records the dtype of each training and prediction forward."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.roi_align = RoIAlign(output_size=1)  # an mmcv op for the test loop to ready
        self.forward_dtypes = []

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.linear(inputs)
        self.forward_dtypes.append(out.dtype)
        if mode == 'loss':
            return dict(loss=(out.float() - data_samples).square().mean())
        return out


class CountMetric(BaseMetric):
    def process(self, data_batch, data_samples):
        self.results.append(len(data_samples))

    def compute_metrics(self, results):
        return dict(samples=sum(results))


def _toy_regression_data():
    generator = torch.Generator().manual_seed(0)
    return [dict(inputs=torch.randn(4, generator=generator), data_samples=torch.randn(1, generator=generator))
            for _ in range(8)]


def _train(work_dir, wrapper_type, max_iters, resume_from=None):
    data = _toy_regression_data()
    runner = Runner(
        model=TinyRegressor(), work_dir=str(work_dir), experiment_name=f'{wrapper_type}_{max_iters}',
        train_dataloader=dict(dataset=data, sampler=dict(type='InfiniteSampler', shuffle=False),
                              batch_size=4, collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        optim_wrapper=dict(type=wrapper_type, optimizer=dict(type='AdamW', lr=0.01)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=max_iters, by_epoch=False),
                           # how the project's configs resume (torch >= 2.6 loads weights only)
                           safe_checkpoint_loading=dict(type='mmlinattn.SafeCheckpointLoadingHook')),
        load_from=resume_from and str(resume_from), resume=resume_from is not None, randomness=dict(seed=0))
    runner.train()
    return runner, work_dir / f'iter_{max_iters}.pth'


def _fp32_tensors(checkpoint):
    state = torch.load(checkpoint, weights_only=False)  # the file this test wrote
    tensors = list(state['state_dict'].values())
    tensors += [t for s in state['optimizer']['state'].values() for t in s.values() if t.is_floating_point()]
    return tensors and all(t.dtype == torch.float32 for t in tensors), state['optimizer'].keys()


@cpu_only
def test_runner_trains_in_bf16_saves_fp32_and_resumes_across_precisions(tmp_path):
    """fp32 for 2 iterations, resumed in bf16 to 4 (checkpoint fp32, no loss scaler), resumed in fp32
    to 5: each run continues the optimizer's step count."""
    _, fp32_checkpoint = _train(tmp_path / 'fp32', 'OptimWrapper', 2)
    runner, bf16_checkpoint = _train(tmp_path / 'bf16', WRAPPER, 4, resume_from=fp32_checkpoint)
    assert type(runner.optim_wrapper) is MixedPrecisionOptimWrapper
    assert runner.model.forward_dtypes == [torch.bfloat16] * 2
    assert 'forward' in vars(runner.model.roi_align)  # mmcv's ops readied for training and validation
    all_fp32, optimizer_keys = _fp32_tensors(bf16_checkpoint)
    assert all_fp32 and set(optimizer_keys) == {'state', 'param_groups'}

    runner, _ = _train(tmp_path / 'fp32_again', 'OptimWrapper', 5, resume_from=bf16_checkpoint)
    assert runner.model.forward_dtypes == [torch.float32] and 'forward' not in vars(runner.model.roi_align)
    steps = {int(s['step']) for s in runner.optim_wrapper.optimizer.state.values()}
    assert steps == {5}


@cpu_only
def test_the_mixed_precision_test_loop_tests_in_bf16_with_mmcv_ops_ready(tmp_path):
    runner = Runner(
        model=TinyRegressor(), work_dir=str(tmp_path), experiment_name='test_loop',
        test_dataloader=dict(dataset=_toy_regression_data(), sampler=dict(type='DefaultSampler', shuffle=False),
                             batch_size=4, collate_fn=dict(type='default_collate')),
        test_cfg=dict(type=TEST_LOOP), test_evaluator=Evaluator(CountMetric()))
    with mmengine_log() as messages:
        metrics = runner.test()
    assert metrics == dict(samples=8)
    assert runner.model.forward_dtypes == [torch.bfloat16] * 2
    assert 'forward' in vars(runner.model.roi_align)
    assert 'MixedPrecisionTestLoop: autocast to torch.bfloat16 on cpu, mmcv ops in fp32' in messages


# ---------------------------------------------------------------- the tools' --amp


def _tool(name):
    """tools/<name>.py as a module (``test`` would otherwise be the standard library's package)."""
    spec = importlib.util.spec_from_file_location(f'mmlinattn_tool_{name}', os.path.join(ROOT, 'tools',
                                                                                         f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _captured_runs(monkeypatch, tool):
    """The configs the tool builds its runner from, with a runner that does nothing."""
    configs = []

    def build_runner(cfg):
        configs.append(cfg)
        return types.SimpleNamespace(rank=0, train=lambda: None, test=dict)

    monkeypatch.setattr(tool, 'build_runner', build_runner)
    return configs


def test_train_amp_sets_the_wrapper_and_validates_under_autocast(tmp_path, monkeypatch):
    tool = _tool('train')
    configs = _captured_runs(monkeypatch, tool)
    tool.main([DET_CONFIG, '--amp', '--work-dir', str(tmp_path), '--cfg-options',
               f'train_dataloader.dataset.data_root={tmp_path}', f'val_dataloader.dataset.data_root={tmp_path}'])
    cfg, = configs
    assert cfg.optim_wrapper.type == WRAPPER and cfg.val_cfg.fp16 is True
    plain = Config.fromfile(DET_CONFIG)
    assert plain.optim_wrapper.get('type', 'OptimWrapper') == 'OptimWrapper' and 'fp16' not in plain.val_cfg
    for key in ('optimizer', 'clip_grad', 'paramwise_cfg'):  # the config's optimisation, kept
        assert cfg.optim_wrapper.get(key) == plain.optim_wrapper.get(key)
    assert plain.optim_wrapper.paramwise_cfg


def test_train_amp_replaces_an_amp_wrapper_keeps_its_loss_scale_and_refuses_other_types():
    cfg = load_config(train.parse_args([CLS_CONFIG, '--amp']))
    cfg.optim_wrapper.update(type='AmpOptimWrapper', loss_scale=512.0)
    train.enable_amp(cfg)
    assert cfg.optim_wrapper.type == WRAPPER and cfg.optim_wrapper.loss_scale == 512.0
    no_val = Config(dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)), val_cfg=None))
    train.enable_amp(no_val)
    assert no_val.optim_wrapper.type == WRAPPER and no_val.val_cfg is None
    with pytest.raises(SystemExit, match="--amp replaces optim_wrapper.type OptimWrapper or AmpOptimWrapper; "
                       "this config has 'OptimWrapperDict'"):
        train.enable_amp(Config(dict(optim_wrapper=dict(type='OptimWrapperDict'))))


def test_test_amp_runs_the_mixed_precision_test_loop(tmp_path, monkeypatch):
    tool = _tool('test')
    configs = _captured_runs(monkeypatch, tool)
    checkpoint = tmp_path / 'model.pth'
    checkpoint.touch()
    data_root = f'test_dataloader.dataset.data_root={tmp_path}'
    tool.main([CLS_CONFIG, str(checkpoint), '--work-dir', str(tmp_path), '--cfg-options', data_root])
    tool.main([CLS_CONFIG, str(checkpoint), '--amp', '--work-dir', str(tmp_path), '--cfg-options', data_root])
    plain, amp = configs
    assert plain.test_cfg.get('type', 'TestLoop') == 'TestLoop' and 'fp16' not in plain.test_cfg
    assert amp.test_cfg == dict(plain.test_cfg, type=TEST_LOOP, fp16=True)
    with pytest.raises(SystemExit, match="--amp replaces test_cfg.type TestLoop; this config has 'MyLoop'"):
        tool.main([CLS_CONFIG, str(checkpoint), '--amp', '--cfg-options', 'test_cfg.type=MyLoop'])
