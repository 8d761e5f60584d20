"""The main job (tools/dev/run_demo.sh) end to end on the toy sets, its report tool, and the set-up's
build-progress reporter."""
import glob
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from PIL import Image

from e2e_utils import ROOT, TOOL_THREADS

BUILD_PROGRESS = osp.join(ROOT, 'tools', 'dev', 'build_progress.sh')


# ------------------------------------------------------------------------------- set-up progress

def _fake_build(tmp_path, objects):
    temp = tmp_path / 'build' / 'temp.linux-x86_64-cpython-311'
    temp.mkdir(parents=True)
    (temp / 'build.ninja').write_text(
        'ninja_required_version = 1.3\nrule compile\n  command = c++ $in -o $out\n'
        + ''.join(f'build {temp}/ops/{name}.o: compile /src/{name}.cpp\n' for name in objects)
        + f'build {temp}/ops/_ext.so: link ' + ' '.join(f'{temp}/ops/{n}.o' for n in objects) + '\n')
    (temp / 'ops').mkdir()
    return temp / 'ops'


def test_build_progress_counts_objects_and_stops_with_the_build(tmp_path):
    """One line per interval, compiled/total from the objects on disk and build.ninja; the reporter
    exits by itself once the watched build process is gone."""
    ops = _fake_build(tmp_path, ['nms', 'roi_align', 'deform_conv', 'focal_loss'])
    (ops / 'nms.o').write_bytes(b'')
    build = subprocess.Popen(['sleep', '4.5'])
    reporter = subprocess.Popen(['bash', BUILD_PROGRESS, str(tmp_path / 'build'), str(build.pid), '1',
                                 'mmcv build'], stdout=subprocess.PIPE, text=True)
    time.sleep(2.4)
    for name in ('roi_align', 'deform_conv'):
        (ops / f'{name}.o').write_bytes(b'')
    build.wait()
    output, _ = reporter.communicate(timeout=10)
    lines = output.splitlines()
    assert lines[0] == '[setup] mmcv build: 1/4 objects compiled (0 min)', output
    assert lines[-1] == '[setup] mmcv build: 3/4 objects compiled (0 min)', output
    assert 3 <= len(lines) <= 5, output


def test_build_progress_before_the_build_dir_exists(tmp_path):
    build = subprocess.Popen(['sleep', '1.5'])
    reporter = subprocess.Popen(['bash', BUILD_PROGRESS, str(tmp_path / 'missing'), str(build.pid), '1'],
                                stdout=subprocess.PIPE, text=True)
    build.wait()   # reaped: a finished but unreaped build would still answer kill -0
    output, _ = reporter.communicate(timeout=10)
    assert output.splitlines()[0] == '[setup] build: preparing the sources (0 min)'


# ------------------------------------------------------------------------------- report tool

def test_schedule_of_the_coco_config_is_read_from_the_config():
    from mmengine.config import Config
    from dev.demo_report import describe_schedule
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'mask_rcnn_laplacian_tiny_1x_coco.py'))
    # 117266 = COCO train2017 images with annotations (what CocoDataset keeps)
    assert describe_schedule(cfg, 117266) == (
        '12 epochs x 7330 iterations at 8 GPUs x 2 images (87960 iterations, 117266 training '
        'images); this single-process run: 12 x 58633 iterations of 2 images')


def _fake_run(run_dir, rows):
    vis = run_dir / '20261204_000000' / 'vis_data'
    vis.mkdir(parents=True)
    (vis / 'scalars.json').write_text(''.join(json.dumps(row) + '\n' for row in rows))


def test_report_of_a_detector_trained_from_random_weights(tmp_path, capsys):
    """No pretrain/ run (run_demo.sh with PRETRAIN_ITERS=0): the summary says the detector started
    from random weights, warns about no classifier load, and the curves have the detector's panel."""
    from dev.demo_report import main
    _fake_run(tmp_path / 'finetune', [dict(epoch=1, iter=10, loss=5.5), dict(epoch=2, iter=20, loss=1.3),
                                      {'coco/bbox_mAP': 0.1, 'coco/segm_mAP': 0.12, 'step': 2}])
    metrics = {'coco/bbox_mAP': 0.102, 'coco/bbox_mAP_50': 0.233, 'coco/segm_mAP': 0.12,
               'coco/segm_mAP_50': 0.216}
    (tmp_path / 'metrics.json').write_text(json.dumps(metrics))
    (tmp_path / 'stage_seconds.txt').write_text('finetune 509\ntest 11\n')
    (tmp_path / 'predictions').mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):
        Image.fromarray(rng.integers(0, 255, (256, 512, 3), dtype=np.uint8)).save(
            tmp_path / 'predictions' / f'{k}.jpg')
    main(['report', str(tmp_path), '--data', 'balloon'])
    summary = capsys.readouterr().out
    assert 'LaplacianFormer-T from random weights, Mask R-CNN (real photos)' in summary
    assert ' 1. pretrain   none: the detector starts from random weights' in summary
    assert ' 2. train      Mask R-CNN, balloon ' in summary and '2 epochs, 20 iterations' in summary
    assert 'WARNING' not in summary and 'top-1' not in summary
    assert '    bbox          0.102    0.233' in summary
    assert 'total 8m 40s after set-up (finetune 8m 29s, test 0m 11s)' in summary
    with Image.open(tmp_path / 'curves.png') as curves:
        assert curves.width >= 700 and curves.height >= 500


# ------------------------------------------------------------------------------- the demo

# 30 classifier iterations (3 epochs of the 300 toy images), 30 detector iterations on 60 images
DEMO_OPTIONS = dict(
    PRETRAIN_OPTIONS='train_cfg.max_epochs=3 train_cfg.val_interval=3',
    FINETUNE_OPTIONS='train_cfg.max_epochs=1 train_dataloader.dataset.indices=60 '
                     'default_hooks.logger.interval=5 '
                     'val_dataloader.dataset.indices=6 test_dataloader.dataset.indices=6')
# Offline: every download goes through a proxy that refuses connections.
OFFLINE = dict(https_proxy='http://127.0.0.1:9', http_proxy='http://127.0.0.1:9', no_proxy='', NO_PROXY='')


# the tests read one demo run (a module fixture): one worker runs them all
pytestmark = pytest.mark.xdist_group('demo')


@pytest.fixture(scope='module')
def demo_run(tmp_path_factory):
    """The demo as a user without the real sets and without internet runs it (the default
    DEMO_DATA=auto): a copy of the repository's tools and configs with an empty data/, downloads
    refused. The real sets' demo (data/balloon, data/cifar10) takes ~20 min."""
    checkout = tmp_path_factory.mktemp('checkout')
    for folder in ('tools', 'configs'):
        shutil.copytree(osp.join(ROOT, folder), checkout / folder)
    work_dir = str(tmp_path_factory.mktemp('demo'))
    env = dict(os.environ, PY=sys.executable, WORK_DIR=work_dir, PYTHONUNBUFFERED='1',
               OMP_NUM_THREADS=TOOL_THREADS, **DEMO_OPTIONS, **OFFLINE)
    env.pop('DEMO_DATA', None)
    proc = subprocess.run(['bash', str(checkout / 'tools' / 'dev' / 'run_demo.sh')], cwd=checkout, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f'run_demo.sh exited with {proc.returncode}:\n{proc.stdout[-6000:]}')
    return work_dir, proc.stdout


@pytest.mark.slow
def test_demo_offline_without_the_real_sets_says_how_to_get_them_and_runs_the_toy_workflow(demo_run):
    _, output = demo_run
    assert 'error: cannot download https://download.openmmlab.com/mmyolo/data/balloon_dataset.zip' in output
    assert 'the real sets are not here and could not be downloaded' in output
    for text in ('--dataset-name balloon --save-dir data --max-size 256 --archive balloon_dataset.zip',
                 '--dataset-name cifar10 --save-dir data --archive', 'Running the toy workflow instead',
                 'the workflow in miniature on the bundled synthetic sets'):
        assert text in output, text


@pytest.mark.slow
def test_demo_trains_in_bf16_where_the_cpu_has_it(demo_run):
    """AMP=auto: tools/train.py --amp (the plugin's bf16 optim wrapper) wherever the CPU has bf16
    instructions, fp32 elsewhere."""
    import torch
    from mmlinattn.cpu_autocast import mixed_precision_is_native
    work_dir, output = demo_run
    amp = mixed_precision_is_native()
    assert ('[demo] mixed precision: on' if amp else '[demo] mixed precision: off') in output
    logs = ''.join(open(path).read() for path in glob.glob(osp.join(work_dir, 'finetune', '*', '*.log')))
    assert ('MixedPrecisionOptimWrapper: autocast to torch.bfloat16' in logs) == (
        amp and not torch.cuda.is_available())


def _losses(run_dir):
    path = sorted(glob.glob(osp.join(run_dir, '*', 'vis_data', 'scalars.json')))[-1]
    return [row['loss'] for row in map(json.loads, open(path)) if 'loss' in row]


def _checkpoint_state(path):
    from mmlinattn.checkpoint import load_checkpoint_file
    return load_checkpoint_file(path)['state_dict']


@pytest.mark.slow
def test_demo_losses_fall(demo_run):
    work_dir, _ = demo_run
    for stage in ('pretrain', 'finetune'):
        losses = _losses(osp.join(work_dir, stage))
        assert len(losses) >= 2 and losses[-1] < 0.8 * losses[0], (stage, losses)


@pytest.mark.slow
def test_demo_finetuning_starts_from_the_classifier_backbone(demo_run):
    """The detector the fine-tuning run built (its dumped config), initialised as the Runner does
    before iteration 0, holds the classifier's backbone weights; the stage outputs the classifier
    never had (norm0-2) keep their initialisation; training then moved the weights."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import mmlinattn  # noqa: F401
    from mmdet.registry import MODELS

    work_dir, output = demo_run
    classifier_path = open(osp.join(work_dir, 'pretrain', 'last_checkpoint')).read().strip()
    classifier = {k[len('backbone.'):]: v for k, v in _checkpoint_state(classifier_path).items()
                  if k.startswith('backbone.')}
    cfg = Config.fromfile(osp.join(work_dir, 'finetune', 'mask_rcnn_laplacian_tiny_toy_coco.py'))
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint=classifier_path,
                                               prefix='backbone.')
    init_default_scope('mmdet')
    detector = MODELS.build(cfg.model)
    detector.init_weights()
    at_start = detector.backbone.state_dict()
    assert set(at_start) - set(classifier) == {f'norm{i}.{p}' for i in range(3) for p in ('weight', 'bias')}
    for key, value in classifier.items():
        assert torch.equal(at_start[key], value), key
    assert f'LaplacianFormer: loaded {classifier_path}' in output

    trained_path = open(osp.join(work_dir, 'finetune', 'last_checkpoint')).read().strip()
    trained = _checkpoint_state(trained_path)
    moved = [k for k, v in classifier.items() if not torch.equal(trained[f'backbone.{k}'], v)]
    assert len(moved) > 0.9 * len(classifier)


def _assert_picture(path, min_size):
    image = Image.open(path)
    assert image.format == 'PNG', path
    assert image.width >= min_size[0] and image.height >= min_size[1], (path, image.size)
    pixels = np.asarray(image.convert('RGB'), dtype=np.float32)
    assert pixels.std() > 20, f'{path} is nearly flat'
    assert len(np.unique(pixels.reshape(-1, 3)[::7], axis=0)) > 200, f'{path} has almost no content'


@pytest.mark.slow
def test_demo_writes_metrics_pictures_and_summary(demo_run):
    work_dir, output = demo_run
    with open(osp.join(work_dir, 'metrics.json')) as f:
        metrics = json.load(f)
    for key in ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50'):
        assert 0.0 <= metrics[key] <= 1.0, key
    drawn = sorted(glob.glob(osp.join(work_dir, 'predictions', '*.jpg')))
    assert len(drawn) == 6
    for path in drawn:   # mmdet's visualiser: ground truth and prediction side by side
        with Image.open(path) as image:
            assert image.width >= 2 * 256 and image.height >= 256
    _assert_picture(osp.join(work_dir, 'curves.png'), (1000, 400))
    _assert_picture(osp.join(work_dir, 'predictions.png'), (1280, 3 * 200))
    summary = output[output.rindex('mmlinattn demo'):]
    assert 'backbone initialised from' in summary and 'WARNING' not in summary
    for text in ('bbox', 'segm', 'mAP_50', 'curves.png', 'predictions.png', 'total'):
        assert text in summary, text
    assert f"{metrics['coco/bbox_mAP_50']:7.3f}" in summary
