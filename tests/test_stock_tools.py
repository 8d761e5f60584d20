"""mmdet's, mmseg's and mmpretrain's own ``tools/train.py`` and ``tools/test.py`` (from their wheels' ``.mim/tools``),
run from a folder outside the repo against the installed mmlinattn wheel, on user configs that inherit
the package's configs through ``read_base()``: train, evaluate the checkpoint with metrics, resume;
and the stock ``test.py`` refusing a checkpoint whose pickle would run code, naming the opt-in."""
import os
import re
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

from e2e_utils import SMALL_MASK_RCNN, TOOL_THREADS, toy_config

pytestmark = pytest.mark.slow

# Settings of the toy run (toy_config: the toy set at a smaller side of 128 px, 2 evaluation images)
# that the user config copies from it.
TOY_KEYS = ('train_dataloader', 'val_dataloader', 'test_dataloader', 'val_evaluator', 'test_evaluator',
            'default_hooks', 'log_processor', 'randomness')


def stock_tool(library, name):
    path = os.path.join(os.path.dirname(__import__(library).__file__), '.mim', 'tools', name)
    assert os.path.isfile(path), f'the {library} wheel ships its tools under {library}/.mim/tools'
    return path


def write_user_config(tmp_path, name, train_cfg, model_edits, **toy_args):
    """``user/<name>_user.py``: ``from mmlinattn.configs.<name> import *`` under ``read_base()``, then
    the user's changes as plain assignments: the toy data and schedule, and ``model_edits``."""
    toy = Config.fromfile(toy_config(f'configs/{name}.py', tmp_path / 'toy.py', **toy_args))
    lines = ['from mmengine.config import read_base', '', 'with read_base():',
             f'    from mmlinattn.configs.{name} import *', '']
    lines += [f'{key} = {toy[key].to_dict()!r}' for key in TOY_KEYS]
    lines += [f'train_cfg = {train_cfg!r}', 'param_scheduler = None']
    lines += [f'model.{path} = {value!r}' for path, value in model_edits.items()]
    user = tmp_path / 'user'
    user.mkdir()
    path = user / f'{name}_user.py'
    path.write_text('\n'.join(lines) + '\n')
    return path


def run_stock(library, tool, *args, cwd, site, expect_ok=True):
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONUNBUFFERED='1',
               OMP_NUM_THREADS=TOOL_THREADS)
    proc = subprocess.run([sys.executable, stock_tool(library, tool), *map(str, args)], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    proc.output = proc.stdout
    if expect_ok and proc.returncode != 0:
        pytest.fail(f'{library} {tool} {args} exited with {proc.returncode}:\n{proc.stdout[-6000:]}')
    return proc


@pytest.fixture
def det_config(tmp_path):
    """Mask R-CNN with LaplacianFormer-T on the toy COCO set (3 classes): one epoch of 4 images."""
    config = write_user_config(
        tmp_path, 'mask_rcnn_laplacian_tiny_1x_coco',
        train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=1, val_interval=1),
        model_edits={'roi_head.bbox_head.num_classes': 3, 'roi_head.mask_head.num_classes': 3,
                     **{k[len('model.'):]: v for k, v in SMALL_MASK_RCNN.items()}},
        side=128, iters=2, eval_images=2)
    text = config.read_text()
    text += ("train_dataloader['dataset']['indices'] = 4\n"
             "train_dataloader['sampler'] = dict(type='DefaultSampler', shuffle=True)\n"
             "default_hooks['checkpoint'] = dict(type='CheckpointHook', interval=1)\n"
             "log_processor = dict(by_epoch=True)\n")
    config.write_text(text)
    return config


def test_mmdet_stock_tools_train_test_and_resume_a_read_base_config(installed_wheel, det_config):
    site, _ = installed_wheel
    user = det_config.parent
    proc = run_stock('mmdet', 'train.py', det_config, '--work-dir', 'work', cwd=user, site=site)
    assert re.search(r'Epoch\(train\)\s+\[1\]\[2/2\].*loss', proc.output), proc.output[-3000:]
    assert 'LaplacianFormer' in proc.output
    checkpoint = user / 'work' / 'epoch_1.pth'
    assert checkpoint.is_file()

    proc = run_stock('mmdet', 'test.py', det_config, checkpoint, '--work-dir', 'test', cwd=user, site=site)
    assert f'Loads checkpoint by mmlinattn backend from path: {checkpoint}' in proc.output
    for metric in ('coco/bbox_mAP', 'coco/segm_mAP'):
        assert re.search(metric + r': \d', proc.output), proc.output[-3000:]

    proc = run_stock('mmdet', 'train.py', det_config, '--work-dir', 'work', '--resume',
                     '--cfg-options', 'train_cfg.max_epochs=2', cwd=user, site=site)
    assert 'resumed epoch: 1' in proc.output, proc.output[-3000:]
    assert re.search(r'Epoch\(train\)\s+\[2\]\[2/2\]', proc.output)
    assert not re.search(r'Epoch\(train\)\s+\[1\]', proc.output)
    assert (user / 'work' / 'epoch_2.pth').is_file()


def test_mmdet_stock_test_refuses_code_and_names_the_opt_in(installed_wheel, det_config):
    site, _ = installed_wheel
    user = det_config.parent
    marker = user / 'MARKER'

    class RunsShellCommand:
        def __reduce__(self):
            return os.system, (f'touch {marker}', )

    malicious = user / 'malicious.pth'
    torch.save({'state_dict': {}, 'meta': RunsShellCommand()}, malicious)
    proc = run_stock('mmdet', 'test.py', det_config, malicious, '--work-dir', 'test', cwd=user, site=site,
                     expect_ok=False)
    assert proc.returncode != 0
    assert 'not loaded: its pickle calls posix.system(...)' in proc.output, proc.output[-3000:]
    assert 'default_hooks.safe_checkpoint_loading.unsafe_trust_checkpoint=True' in proc.output
    assert not marker.exists()


@pytest.mark.parametrize('library,name,model_edits,side,metric', [
    ('mmseg', 'upernet_laplacian_tiny_512x512_160k_ade20k', {'data_preprocessor.size': (128, 128)}, 128,
     'mIoU'),
    ('mmpretrain', 'laplacianformer_tiny_8xb128_in1k', {'backbone.drop_path_rate': 0.0}, 64,
     'accuracy/top1'),
])
def test_stock_tools_train_test_and_resume_an_iteration_based_read_base_config(
        installed_wheel, tmp_path, library, name, model_edits, side, metric):
    """UperNet with mmseg's tools, a classifier with mmpretrain's: 2 iterations, the test with its
    metric, a resume to iteration 3."""
    site, _ = installed_wheel
    config = write_user_config(
        tmp_path, name, train_cfg=dict(type='IterBasedTrainLoop', max_iters=2, val_interval=2),
        model_edits=model_edits, side=side, iters=2, eval_images=8)
    user = config.parent
    proc = run_stock(library, 'train.py', config, '--work-dir', 'work', cwd=user, site=site)
    assert re.search(r'Iter\(train\) \[2/2\].*loss', proc.output), proc.output[-3000:]
    checkpoint = user / 'work' / 'iter_2.pth'
    assert checkpoint.is_file()

    proc = run_stock(library, 'test.py', config, checkpoint, '--work-dir', 'test', cwd=user, site=site)
    assert f'Loads checkpoint by mmlinattn backend from path: {checkpoint}' in proc.output
    assert re.search(re.escape(metric) + r': \d', proc.output), proc.output[-3000:]

    proc = run_stock(library, 'train.py', config, '--work-dir', 'work', '--resume',
                     '--cfg-options', 'train_cfg.max_iters=3', cwd=user, site=site)
    assert 'resumed epoch: 0, iter: 2' in proc.output, proc.output[-3000:]
    assert re.search(r'Iter\(train\) \[3/3\]', proc.output)
    assert (user / 'work' / 'iter_3.pth').is_file()
