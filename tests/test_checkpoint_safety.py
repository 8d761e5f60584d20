"""Checkpoint loading never runs code from a file unless the user opts in for that load: a pickle that
would create a file, through every load path of the plugin and its tools; foreign objects beside the
weights read as inert records; mmengine's own checkpoints (resume, load_from) through torch's
weights-only loader; the official PolaFormer layout with its config object; and ``import mmlinattn``
changing nothing outside its registry scope."""
import argparse
import json
import os
import pathlib
import pickle
import subprocess
import sys
import types
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.model import BaseModel
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader, load_checkpoint

import convert_checkpoint  # tools/ (pytest.ini puts it on sys.path)
from e2e_utils import ROOT, mmengine_log, require_toy_data, run
from mmlinattn.checkpoint import (MMENGINE_CHECKPOINT_GLOBALS, UnloadedObject,
                                  UnsafeCheckpointError, load_checkpoint_file,
                                  safe_checkpoint_loading)
from mmlinattn.models.backbones import LaplacianFormer, PolaPVT
from mmlinattn.models.backbones.polaformer_converter import convert_official, to_official
from mmlinattn.restricted_unpickler import _allowed_globals

CLS_CONFIG = 'tests/configs/resnet18_toy_imagenet.py'


# ---- files whose pickle would create a file -------------------------------------------------------
class RunsShellCommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}', )


class TouchesPath(RunsShellCommand):
    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker), )


PAYLOADS = {  # name -> (payload class, torch.save arguments)
    'os.system': (RunsShellCommand, {}),
    'Path.touch': (TouchesPath, {}),
    'Path.touch-protocol4': (TouchesPath, dict(pickle_protocol=4)),
    'os.system-legacy-format': (RunsShellCommand, dict(_use_new_zipfile_serialization=False)),
}


def save_malicious(tmp_path, payload='os.system'):
    """A checkpoint with weights beside an object whose unpickling creates MARKER: (path, marker)."""
    payload_type, save_args = PAYLOADS[payload]
    marker = tmp_path / 'MARKER'
    path = str(tmp_path / 'malicious.pth')
    torch.save({'state_dict': {'weight': torch.ones(2)}, 'meta': payload_type(marker)}, path,
               **save_args)
    return path, marker


OPT_IN_MESSAGE = (r'which would run code from the file.*--unsafe-trust-checkpoint.*'
                  r'unsafe_trust_checkpoint=True')


@pytest.mark.parametrize('payload', sorted(PAYLOADS))
def test_load_checkpoint_file_refuses_code(tmp_path, payload):
    path, marker = save_malicious(tmp_path, payload)
    # protocol 2 writes Path.touch as getattr(Path, 'touch'); protocol 4 by name, after its argument
    called = ('posix.system' if payload.startswith('os.system') else
              r'(getattr\(pathlib.Path, .touch.\)|pathlib.PosixPath\(\.\.\.\))')
    with pytest.raises(UnsafeCheckpointError, match=rf'malicious.pth: not loaded: its pickle calls {called}'):
        load_checkpoint_file(path)
    with pytest.raises(UnsafeCheckpointError, match=OPT_IN_MESSAGE):
        load_checkpoint_file(path)
    assert not marker.exists()
    load_checkpoint_file(path, unsafe_trust_checkpoint=True)  # the payload is real: it runs when asked
    assert marker.exists()


def test_mmengine_load_checkpoint_keeps_torchs_refusal_after_import(tmp_path):
    import mmlinattn  # noqa: F401
    path, marker = save_malicious(tmp_path)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(pickle.UnpicklingError, match='Weights only load failed'):
        load_checkpoint(model, path)  # torch's weights_only default, untouched by the plugin
    with safe_checkpoint_loading(), pytest.raises(UnsafeCheckpointError, match=OPT_IN_MESSAGE):
        load_checkpoint(model, path)  # what the plugin's tools run under
    assert not marker.exists()


@pytest.mark.parametrize('payload', ['os.system', 'Path.touch'])
def test_pretrained_init_refuses_code(tmp_path, payload):
    path, marker = save_malicious(tmp_path, payload)
    backbone = PolaPVT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(UnsafeCheckpointError, match=OPT_IN_MESSAGE):
        backbone.init_weights()
    assert not marker.exists()


def test_convert_checkpoint_refuses_code(tmp_path, capsys):
    path, marker = save_malicious(tmp_path)
    dst = tmp_path / 'converted.pth'
    assert convert_checkpoint.main([path, str(dst), '--arch', 'pola_pvt_tiny']) == 1
    err = capsys.readouterr().err
    assert 'error: ' in err and 'its pickle calls posix.system' in err
    assert '--unsafe-trust-checkpoint' in err
    assert not marker.exists() and not dst.exists()

    # the opt-in runs the file (the payload works: the refusal above is what kept it from running)
    convert_checkpoint.main([path, str(dst), '--arch', 'pola_pvt_tiny', '--unsafe-trust-checkpoint'])
    assert marker.exists()


def test_opt_in_is_for_one_file_and_warns_naming_it(tmp_path):
    (tmp_path / 'trusted').mkdir()
    (tmp_path / 'other').mkdir()
    path, marker = save_malicious(tmp_path / 'trusted')
    other, other_marker = save_malicious(tmp_path / 'other')
    with pytest.raises(ValueError, match="unsafe_trust_checkpoint must be True or False, got 'yes'"):
        load_checkpoint_file(path, unsafe_trust_checkpoint='yes')
    with safe_checkpoint_loading(trusted_checkpoint=path), mmengine_log() as messages:
        with pytest.raises(UnsafeCheckpointError, match=OPT_IN_MESSAGE):
            load_checkpoint(torch.nn.Linear(2, 1), other)
        assert not other_marker.exists()
        checkpoint = CheckpointLoader.load_checkpoint(path)
    assert marker.exists() and checkpoint['meta'] == 0  # the payload ran: os.system's exit status
    assert [m for m in messages if 'fully unpickling' in m] == [
        f'mmlinattn: fully unpickling {path} (unsafe_trust_checkpoint): it can run any code it holds']


@pytest.mark.slow
def test_tools_test_refuses_code_and_names_the_opt_in(tmp_path):
    require_toy_data('imagenet')
    path, marker = save_malicious(tmp_path)
    proc = run(['tools/test.py', CLS_CONFIG, path, '--toy-data', '--work-dir', tmp_path / 'work'],
               expect_ok=False)
    assert proc.returncode != 0
    assert f'error: {path}: not loaded: its pickle calls posix.system(...)' in proc.output
    assert '--unsafe-trust-checkpoint' in proc.output
    assert not marker.exists()

    proc = run(['tools/test.py', CLS_CONFIG, path, '--toy-data', '--work-dir', tmp_path / 'work',
                '--unsafe-trust-checkpoint'], expect_ok=False)
    assert f'mmlinattn: fully unpickling {path} (unsafe_trust_checkpoint)' in proc.output
    assert marker.exists()  # the flag unpickled that file fully, as asked


class TinyModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return self.linear(inputs)


def hooked_runner(tmp_path, **hook_args):
    """A runner whose config names the hook as configs/_base_/plugin.py does, after before_run."""
    runner = Runner(model=TinyModel(), work_dir=str(tmp_path / 'work'), default_hooks=dict(
        safe_checkpoint_loading=dict(type='mmlinattn.SafeCheckpointLoadingHook', **hook_args)))
    runner.call_hook('before_run')
    return runner


def test_hook_makes_the_runner_refuse_code_and_load_its_own_checkpoints(tmp_path):
    path, marker = save_malicious(tmp_path)
    runner = hooked_runner(tmp_path)
    schemes = dict(CheckpointLoader._schemes)
    with pytest.raises(UnsafeCheckpointError, match=OPT_IN_MESSAGE) as refused:
        runner.load_checkpoint(path)
    assert 'default_hooks.safe_checkpoint_loading.unsafe_trust_checkpoint=True' in str(refused.value)
    assert not marker.exists()
    assert CheckpointLoader._schemes == schemes  # only the runner's loads changed, and only while loading

    # a runner's checkpoint (message hub with HistoryBuffer) loads exactly; a second run keeps one wrapper
    own = tmp_path / 'own.pth'
    weights = {k: torch.randn_like(v) for k, v in runner.model.state_dict().items()}
    hub = MessageHub('own')
    hub.update_scalar('train/loss', 0.5)
    torch.save(dict(state_dict=weights, message_hub=hub.state_dict()), own)
    runner.call_hook('before_run')
    checkpoint = runner.load_checkpoint(str(own))
    assert isinstance(checkpoint['message_hub']['log_scalars']['train/loss'], HistoryBuffer)
    torch.testing.assert_close(runner.model.state_dict(), weights, rtol=0, atol=0)
    assert runner.load_checkpoint.__wrapped__.__func__ is Runner.load_checkpoint


def test_hook_opt_in_unpickles_fully_and_is_a_bool(tmp_path):
    path, marker = save_malicious(tmp_path)
    runner = hooked_runner(tmp_path, unsafe_trust_checkpoint=True)
    with mmengine_log() as messages:  # the runner's logger is the current one from here on
        runner.load_checkpoint(path)
    assert marker.exists()  # the opt-in unpickled the file fully, as asked
    assert f'mmlinattn: fully unpickling {path} (unsafe_trust_checkpoint): it can run any code it ' \
        'holds' in messages
    with pytest.raises(ValueError, match="unsafe_trust_checkpoint must be True or False, got 'yes'"):
        hooked_runner(tmp_path, unsafe_trust_checkpoint='yes')


def test_the_tools_add_the_hook_and_its_opt_in(tmp_path):
    from mmengine.config import Config

    from _common import use_safe_checkpoint_loading
    hook = dict(type='mmlinattn.SafeCheckpointLoadingHook')
    foreign = Config(dict(load_from='a.pth', default_hooks=dict(logger=dict(type='LoggerHook'))))
    use_safe_checkpoint_loading(foreign, unsafe_trust_checkpoint=False)
    assert foreign.default_hooks == dict(logger=dict(type='LoggerHook'), safe_checkpoint_loading=hook)
    ours = Config.fromfile(os.path.join(ROOT, CLS_CONFIG))
    assert ours.default_hooks.safe_checkpoint_loading == hook  # from configs/_base_/plugin.py
    ours.resume = True
    use_safe_checkpoint_loading(ours, unsafe_trust_checkpoint=True)
    assert ours.default_hooks.safe_checkpoint_loading == dict(hook, unsafe_trust_checkpoint=True)
    with pytest.raises(SystemExit, match='--unsafe-trust-checkpoint: this run loads no checkpoint'):
        use_safe_checkpoint_loading(Config(dict(load_from=None, resume=False)), True)


# ---- foreign objects beside the weights ----------------------------------------------------------
CONSTRUCTED = []  # what a Recorder or a CfgNode ran


class Recorder:
    def __new__(cls, *args):
        CONSTRUCTED.append(f'{cls.__name__}.__new__')
        return super().__new__(cls)

    def __init__(self, text):
        CONSTRUCTED.append('Recorder.__init__')
        self.text = text

    def __setstate__(self, state):
        CONSTRUCTED.append('Recorder.__setstate__')
        self.__dict__.update(state)


def test_foreign_objects_stay_inert_and_the_weights_load_exactly(tmp_path):
    torch.manual_seed(0)
    model = LaplacianFormer(arch='tiny', out_indices=(3, ))
    args = argparse.Namespace(lr=1e-3, output_dir='out', epochs=300)
    path = str(tmp_path / 'foreign.pth')
    torch.save({'state_dict': model.state_dict(), 'args': args, 'note': Recorder('kept')}, path)
    CONSTRUCTED.clear()
    torch.load(path, weights_only=False)  # a plain unpickle runs the class: the check below can fail
    assert CONSTRUCTED == ['Recorder.__new__', 'Recorder.__setstate__']
    CONSTRUCTED.clear()

    with mmengine_log() as messages:
        checkpoint = load_checkpoint_file(path)
    assert CONSTRUCTED == []
    note, loaded_args = checkpoint['note'], checkpoint['args']
    assert isinstance(note, UnloadedObject) and not isinstance(note, Recorder)
    assert note.class_path == 'test_checkpoint_safety.Recorder' and note.state == {'text': 'kept'}
    assert loaded_args.class_path == 'argparse.Namespace' and loaded_args.state == vars(args)
    assert f'mmlinattn: {path} holds objects of argparse.Namespace, test_checkpoint_safety.Recorder; ' \
           'they were read as inert UnloadedObject records, never constructed' in messages
    torch.testing.assert_close(checkpoint['state_dict'], model.state_dict(), rtol=0, atol=0)

    fresh = LaplacianFormer(arch='tiny', out_indices=(3, ),
                            init_cfg=dict(type='Pretrained', checkpoint=path))
    fresh.init_weights()
    assert CONSTRUCTED == []
    torch.testing.assert_close(fresh.state_dict(), model.state_dict(), rtol=0, atol=0)


def test_official_polaformer_file_with_its_config_converts_and_loads(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    model = PolaPVT(arch='tiny', out_indices=(3, ))
    model.init_weights()
    classifier = {f'backbone.{k}': v for k, v in model.state_dict().items()}
    classifier['head.fc.weight'] = torch.randn(1000, model.embed_dims[-1])
    classifier['head.fc.bias'] = torch.randn(1000)
    official = to_official(classifier, 'pvt')

    class CfgNode(dict):  # pickles as yacs.config.CfgNode does: NEWOBJ, SETITEMS, BUILD
        def __init__(self, *args, **kwargs):
            CONSTRUCTED.append('CfgNode.__init__')
            super().__init__(*args, **kwargs)

        def __setitem__(self, key, value):
            CONSTRUCTED.append('CfgNode.__setitem__')
            super().__setitem__(key, value)

        def __setstate__(self, state):
            CONSTRUCTED.append('CfgNode.__setstate__')
            self.__dict__.update(state)

    yacs_config = types.ModuleType('yacs.config')
    CfgNode.__module__, CfgNode.__qualname__ = 'yacs.config', 'CfgNode'
    yacs_config.CfgNode = CfgNode
    config = CfgNode(MODEL=CfgNode(TYPE='pola_pvt', NAME='pola_pvt_tiny'), TRAIN=CfgNode(EPOCHS=300))
    config.__dict__['__immutable__'] = True
    src = str(tmp_path / 'pola_pvt_t.pth')
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, 'yacs', types.ModuleType('yacs'))
        patch.setitem(sys.modules, 'yacs.config', yacs_config)
        torch.save({**official, 'config': config, 'args': argparse.Namespace(model='pola_pvt_tiny'),
                    'max_accuracy': 78.8, 'epoch': 300}, src)
    CONSTRUCTED.clear()

    checkpoint = load_checkpoint_file(src)
    assert checkpoint['config'].class_path == 'yacs.config.CfgNode'
    assert checkpoint['config'].items['MODEL'].items == {'TYPE': 'pola_pvt', 'NAME': 'pola_pvt_tiny'}

    dst = str(tmp_path / 'pola_pvt_tiny.pth')
    assert convert_checkpoint.main([src, dst, '--arch', 'pola_pvt_tiny']) == 0
    assert 'missing keys: none' in capsys.readouterr().out
    expected, _ = convert_official(official, 'pvt')
    written = torch.load(dst, weights_only=True)['state_dict']  # the output is plain weights
    torch.testing.assert_close(dict(written), expected, rtol=0, atol=0)

    backbone = PolaPVT(arch='tiny', out_indices=(3, ), init_cfg=dict(type='Pretrained', checkpoint=src))
    backbone.init_weights()
    torch.testing.assert_close(backbone.state_dict(), model.state_dict(), rtol=0, atol=0)
    assert CONSTRUCTED == []


# ---- mmengine's own checkpoints ------------------------------------------------------------------
def save_mmengine_like(path):
    """What mmengine's runner pickles: a message hub of HistoryBuffers (numpy arrays inside, their
    statistics methods pickled through getattr), a numpy scalar, optimizer and scheduler state."""
    hub = MessageHub.get_instance(f'checkpoint-safety-{path}')  # a fresh hub per file
    for loss in (2.5, 2.0):
        hub.update_scalar('train/loss', loss)
    hub.update_info('eta', np.float64(3.5), resumed=True)
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    layer(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    torch.save({'meta': dict(epoch=0, iter=2, seed=0), 'state_dict': OrderedDict(layer.state_dict()),
                'message_hub': hub.state_dict(), 'optimizer': optimizer.state_dict(),
                'param_schedulers': [dict(last_step=2, base_values=[1e-3], by_epoch=False)]}, path)
    return optimizer


def check_mmengine_like(checkpoint, optimizer):
    history = checkpoint['message_hub']['log_scalars']['train/loss']
    assert type(history) is HistoryBuffer and history.current() == 2.0 and history.mean() == 2.25
    assert checkpoint['message_hub']['runtime_info']['eta'] == np.float64(3.5)
    assert checkpoint['optimizer']['state'][0]['step'] == optimizer.state_dict()['state'][0]['step']


def test_mmengine_objects_load_weights_only_with_the_allow_list(tmp_path):
    path = str(tmp_path / 'iter_2.pth')
    optimizer = save_mmengine_like(path)
    with pytest.raises(pickle.UnpicklingError, match='HistoryBuffer'):
        torch.load(path, weights_only=True)  # torch's defaults alone refuse it
    with torch.serialization.safe_globals(MMENGINE_CHECKPOINT_GLOBALS):
        check_mmengine_like(torch.load(path, weights_only=True), optimizer)
    with mmengine_log() as messages:
        check_mmengine_like(load_checkpoint_file(path), optimizer)
    assert not [m for m in messages if 'UnloadedObject' in m]


def test_other_schemes_load_through_mmengine_weights_only(tmp_path, monkeypatch):
    """A scheme mmengine's loader knows (here ``memory://``, standing for http:// and the like)."""
    monkeypatch.setattr(CheckpointLoader, '_schemes', OrderedDict(CheckpointLoader._schemes))
    CheckpointLoader.register_scheme('memory://', lambda name, map_location: torch.load(
        name[len('memory://'):], map_location=map_location))  # torch's default: weights only
    path = str(tmp_path / 'iter_2.pth')
    optimizer = save_mmengine_like(path)
    check_mmengine_like(load_checkpoint_file(f'memory://{path}'), optimizer)
    malicious, marker = save_malicious(tmp_path)
    with pytest.raises(pickle.UnpicklingError, match='Weights only load failed'):
        load_checkpoint_file(f'memory://{malicious}')
    with pytest.raises(ValueError, match='unsafe_trust_checkpoint applies to local files'):
        load_checkpoint_file(f'memory://{malicious}', unsafe_trust_checkpoint=True)
    assert not marker.exists()


def test_without_torchs_allow_list_the_restricted_unpickler_reads_everything(tmp_path, monkeypatch):
    """torch < 2.5 has no torch.serialization.safe_globals: local files (mmengine's objects
    included) load through the restricted unpickler alone, code is still refused, and remote
    files, which mmengine's loader would fully unpickle before torch 2.6, are refused naming the
    way out, also when mmengine itself loads them inside safe_checkpoint_loading."""
    from mmlinattn import checkpoint
    monkeypatch.setattr(checkpoint, '_SAFE_GLOBALS', None)
    monkeypatch.setattr(checkpoint, '_REMOTE_LOADS_WEIGHTS_ONLY', False)
    path = str(tmp_path / 'iter_2.pth')
    optimizer = save_mmengine_like(path)
    with mmengine_log() as messages:
        check_mmengine_like(load_checkpoint_file(path), optimizer)
        with safe_checkpoint_loading():
            check_mmengine_like(CheckpointLoader.load_checkpoint(path), optimizer)
    assert not [m for m in messages if 'UnloadedObject' in m]
    malicious, marker = save_malicious(tmp_path)
    with pytest.raises(UnsafeCheckpointError, match='would run code'):
        load_checkpoint_file(malicious)
    remote = f'http://example.invalid/{os.path.basename(path)}'
    with pytest.raises(ValueError, match='reads local files only there; download it'):
        load_checkpoint_file(remote)
    with safe_checkpoint_loading(), pytest.raises(ValueError, match='would unpickle it fully'):
        CheckpointLoader.load_checkpoint(remote)  # mmengine's own loading, e.g. load_from=http://
    assert CheckpointLoader._schemes['http://'] is not checkpoint._refusing_loader  # restored
    assert not marker.exists()


@pytest.mark.parametrize('attribute', ['update', '__init__'])
def test_getattr_resolves_only_the_history_buffer_statistics(tmp_path, attribute):
    path = str(tmp_path / 'getattr.pth')
    torch.save({'statistics': [HistoryBuffer.min, HistoryBuffer.mean]}, path)
    assert load_checkpoint_file(path)['statistics'] == [HistoryBuffer.min, HistoryBuffer.mean]
    torch.save({'method': getattr(HistoryBuffer, attribute)}, path)  # pickled as getattr(class, name)
    with pytest.raises(UnsafeCheckpointError, match=rf"getattr\(<class '.*HistoryBuffer'>, '{attribute}'\)"):
        load_checkpoint_file(path)


def _derived_config(tmp_path) -> str:
    """configs/laplacianformer_tiny_8xb128_in1k.py, deterministic and small: no drop path, no
    Mixup/CutMix, a fixed 64x64 pipeline, 2 toy images per epoch (1 iteration), the warm-up LR."""
    path = tmp_path / 'laplacianformer_tiny_toy.py'
    path.write_text(f"""_base_ = ['{ROOT}/configs/laplacianformer_tiny_8xb128_in1k.py']
model = dict(backbone=dict(drop_path_rate=0.0), train_cfg=None)
pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(64, 64)), dict(type='PackInputs')]
loader = dict(batch_size=2, num_workers=0, persistent_workers=False,
              dataset=dict(pipeline=pipeline, indices=2))
train_dataloader = loader
test_dataloader = loader
val_dataloader = val_cfg = val_evaluator = None
param_scheduler = [dict(type='LinearLR', start_factor=0.001, by_epoch=True, end=20,
                        convert_to_iter_based=True)]
default_hooks = dict(logger=dict(interval=1))
randomness = dict(seed=0)
""")
    return str(path)


@pytest.mark.slow
def test_resume_continues_exactly_and_load_from_loads(tmp_path):
    """Kill after iteration 2 and resume: iteration 3 gives the weights and the loss of an
    uninterrupted run; load_from (tools/test.py) reads the runner's checkpoint; default loading."""
    require_toy_data('imagenet')
    config = _derived_config(tmp_path)
    whole, resumed = tmp_path / 'whole', tmp_path / 'resumed'
    train = ['tools/train.py', config, '--toy-data', '--work-dir']
    run([*train, whole, '--cfg-options', 'train_cfg.max_epochs=3'])
    run([*train, resumed, '--cfg-options', 'train_cfg.max_epochs=2'])
    proc = run([*train, resumed, '--resume', '--cfg-options', 'train_cfg.max_epochs=3'])
    assert 'resumed epoch: 2, iter: 2' in proc.output
    assert f'Loads checkpoint by mmlinattn backend from path: {resumed}/epoch_2.pth' in proc.output
    assert 'Epoch(train) [1]' not in proc.output and 'UnloadedObject' not in proc.output

    # what the runner wrote beyond torch's defaults is exactly what the allow-list names
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(resumed / 'epoch_2.pth'))
    assert 'builtins.getattr' in unsafe and set(unsafe) <= set(_allowed_globals()), unsafe

    a, b = (load_checkpoint_file(str(d / 'epoch_3.pth')) for d in (whole, resumed))
    torch.testing.assert_close(b['state_dict'], a['state_dict'], rtol=0, atol=0)
    for key in ('train/loss', 'train/lr'):
        history_a, history_b = (c['message_hub']['log_scalars'][key]._log_history for c in (a, b))
        assert len(history_a) == 3 and np.array_equal(history_a, history_b), (key, history_a, history_b)

    out_json = tmp_path / 'metrics.json'
    proc = run(['tools/test.py', config, resumed / 'epoch_2.pth', '--toy-data', '--work-dir',
                tmp_path / 'test', '--out-json', out_json])
    assert f'Load checkpoint from {resumed}/epoch_2.pth' in proc.output
    assert 'UnloadedObject' not in proc.output
    assert 0.0 <= float(json.loads(out_json.read_text())['accuracy/top1']) <= 100.0


# ---- import mmlinattn changes nothing global -----------------------------------------------------
SNAPSHOT = r'''
import json, pickle
import torch, numpy, mmcv.cnn, mmengine.logging, mmengine.model, mmengine.runner  # mmlinattn's deps
import torch._dynamo  # the ops' torch.library registration loads it, and with it torch's own safe globals
import mmdet.registry, mmseg.registry, mmpretrain.registry
import mmengine.registry as registry
from mmengine.runner.checkpoint import CheckpointLoader


def registries():
    todo = [v for v in vars(registry).values() if isinstance(v, registry.Registry)]
    seen = {}
    while todo:
        reg = todo.pop()
        if reg.scope != 'mmlinattn':
            seen[f'{reg.scope}.{reg.name}'] = [sorted(map(str, reg.module_dict.items())),
                                               sorted(k for k in reg.children if k != 'mmlinattn')]
            todo += list(reg.children.values())
    return seen


def snapshot():
    return dict(schemes=[(prefix, repr(loader)) for prefix, loader in CheckpointLoader._schemes.items()],
                safe_globals=sorted(map(repr, torch.serialization.get_safe_globals())),
                loaders=[id(torch.load), id(torch.serialization.load), id(pickle.Unpickler),
                         id(pickle.load), id(CheckpointLoader.load_checkpoint.__func__)],
                registries=registries())


before = snapshot()
import mmlinattn
after = snapshot()
print(json.dumps(dict(before=before, after=after,
                      plugin=sorted(registry.MODELS.children['mmlinattn'].module_dict))))
'''


def test_import_mmlinattn_changes_nothing_global():
    proc = subprocess.run([sys.executable, '-c', SNAPSHOT], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {'LaplacianFormer', 'PolaPVT', 'PolaSwin'} <= set(result['plugin'])  # it did register
    assert len(result['before']['registries']) > 20  # mmengine's, mmdet's, mmseg's, mmpretrain's
    for key in ('schemes', 'safe_globals', 'loaders', 'registries'):
        assert result['after'][key] == result['before'][key], key
