"""Helpers for the end-to-end tests: run the tools in a subprocess from the repo root, as a user would,
on configs pointed at the toy data with a small input and a short iteration-based schedule."""
import contextlib
import copy
import functools
import glob
import json
import logging
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY_ROOT = os.path.join(ROOT, 'data', 'toy')
TOY_SET = {'mmdet': 'coco', 'mmseg': 'ade', 'mmpretrain': 'imagenet'}
# configs/<set>/: the CPU-sized configs of the real sets (tools/misc/download_dataset.py), each
# backbone of the learning benchmark on one task; their models are the top-level configs' with the
# task's heads, beside the libraries' own backbones.
REAL_SETS = ('balloon', 'camvid', 'cifar10', 'coco128')


def model_configs():
    """Every model config under configs/ (subfolders too): not the ``_base_/`` parts, not the
    mmdeploy deploy configs of ``configs/deploy/``."""
    configs_dir = os.path.join(ROOT, 'configs')
    return sorted(path for path in glob.glob(os.path.join(configs_dir, '**', '*.py'), recursive=True)
                  if not {'_base_', 'deploy'} & set(os.path.relpath(path, configs_dir).split(os.sep)))


def real_set_of(config_path: str):
    """The real set of a config under configs/<set>/, else None."""
    folder = os.path.relpath(config_path, os.path.join(ROOT, 'configs')).split(os.sep)[0]
    return folder if folder in REAL_SETS else None


# The shared data folder's copies of the official archives (its README: counts, licences, sha256).
SHARED_ARCHIVES = {'balloon': 'balloon_dataset.zip', 'coco128-seg': 'coco128-seg.zip',
                   'camvid': 'camvid_mini.zip', 'cifar10': 'cifar10_mini.zip',
                   'coco2017': 'coco2017_val_mini.zip', 'ade20k': 'ade20k_val_mini.zip',
                   'imagenet': 'imagenet_val_mini.zip'}


def shared_archive(file_name):
    """The path of ``file_name`` in MMLINATTN_SHARED_DATA, else ../shared/data next to the checkout
    or /work/shared/data; missing, the test fails under CI=true and is skipped elsewhere."""
    env = os.environ.get('MMLINATTN_SHARED_DATA')
    next_to_checkout = os.path.normpath(os.path.join(ROOT, '..', 'shared', 'data'))
    folders = [env] if env else [next_to_checkout, '/work/shared/data']
    for folder in folders:
        if os.path.isfile(os.path.join(folder, file_name)):
            return os.path.join(folder, file_name)
    message = f'{file_name} is in none of {folders} (MMLINATTN_SHARED_DATA names the folder holding it)'
    if os.environ.get('CI', '').lower() == 'true':
        pytest.fail(message)
    pytest.skip(message)


# toy_config edits for Mask R-CNN on toy images (a few shapes each) at 128 px: 128 sampled RoIs
# (of 512), 300 proposals (of 1000) and 20 detections (of 100) per image, since the mask head on
# every RoI dominates the cost; no score threshold, so that an early model's detections count.
SMALL_MASK_RCNN = {'model.train_cfg.rcnn.sampler.num': 128, 'model.test_cfg.rpn.max_per_img': 300,
                   'model.test_cfg.rcnn.max_per_img': 20, 'model.test_cfg.rcnn.score_thr': 0.0}


def load_config(path):
    """``Config.fromfile(path)``, parsed once per test process (resolving the libraries' ``pkg::``
    bases takes ~0.5 s a config and several test files walk all of them); a copy each call, so a
    test may change it."""
    return copy.deepcopy(_parsed_config(os.path.abspath(str(path))))


@functools.lru_cache(maxsize=None)
def _parsed_config(path):
    from mmengine.config import Config
    return Config.fromfile(path)


def run_checked(args, cwd, env, timeout=1800) -> str:
    """Run a command; its output (stdout and stderr), or the test fails showing its tail."""
    proc = subprocess.run(args, cwd=cwd, env=env, timeout=timeout, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        pytest.fail(f'{" ".join(map(str, args))} exited with {proc.returncode}:\n{proc.stdout[-6000:]}')
    return proc.stdout


# torch's (and onnxruntime's) threads for the tools the tests run: the test run's (one per pytest-xdist
# worker under tools/dev/run_tests.sh), else 2
TOOL_THREADS = os.environ.get('OMP_NUM_THREADS', '2')


def amp_args():
    """``['--amp']`` for a training run that should be fast where mixed precision is native
    (:func:`mmlinattn.cpu_autocast.mixed_precision_is_native`), as the main job decides; ``[]``
    (fp32) on a CPU that would emulate bf16."""
    from mmlinattn.cpu_autocast import mixed_precision_is_native
    return ['--amp'] if mixed_precision_is_native() else []


def run(args, timeout=1800, expect_ok=True, env=None, interpreter=(sys.executable, )):
    """Run ``python *args`` (or ``interpreter *args``) in the repo root; return the completed process
    (stdout+stderr in .output)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS=TOOL_THREADS)
    full_env.update(env or {})
    proc = subprocess.run([*interpreter, *map(str, args)], cwd=ROOT, env=full_env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.output = proc.stdout
    if expect_ok and proc.returncode != 0:
        pytest.fail(f'{" ".join(map(str, args))} exited with {proc.returncode}:\n{proc.output[-6000:]}')
    return proc


def run_distributed(script, *args, processes=2):
    """``bash tools/<script> ...`` (dist_train.sh CONFIG N ..., dist_test.sh CONFIG CKPT N ...) with
    ``processes`` CPU processes of one thread each, on a free port."""
    env = dict(PYTHON=sys.executable, PORT=str(free_port()), OMP_NUM_THREADS='1')
    return run([f'tools/{script}', *args], env=env, interpreter=('bash', ))


def require_toy_data(*sets):
    """Generate the toy sets if absent (the test command does this before pytest)."""
    missing = [s for s in sets if not os.path.isdir(os.path.join(TOY_ROOT, s))]
    if missing:
        run(['tools/dev/make_toy_data.py', '--out', TOY_ROOT, '--what', *missing])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _innermost(dataset):
    while isinstance(dataset.get('dataset'), dict):
        dataset = dataset['dataset']
    return dataset


def _shrunk(size, side):
    """A pipeline size (int or (w, h)) scaled so that its smaller side is ``side``: (2048, 512) ->
    (4 side, side), 224 -> side."""
    if isinstance(size, (list, tuple)):
        return type(size)(round(v * side / min(size)) for v in size)
    return side


def toy_config(config, out_path, side, iters, eval_images=None, batch_size=2, lr=None, **edits):
    """Write ``config`` as a standalone file for a short CPU run on the toy set, for tools/train.py,
    tools/test.py and the libraries' own scripts; returns its path.

    The model is the config's. The data: the toy set (as ``--toy-data``) with every pipeline size
    (``scale``, ``crop_size``, the mmseg data preprocessor's ``size``) scaled to a smaller side of
    ``side`` px; ``eval_images`` validation/test images (all when None), one worker-free loader per split.
    The schedule: ``iters`` iterations of ``batch_size`` images at a constant learning rate (``lr``,
    or the config's without its warm-up), seeded, logged every iteration, validated and saved at
    the end. ``edits`` are merged last (``Config.merge_from_dict`` keys)."""
    from mmengine.config import Config
    from _toy_overlay import use_toy_data
    cfg = Config.fromfile(os.path.join(ROOT, config))
    scope = cfg.default_scope
    require_toy_data(TOY_SET[scope])
    use_toy_data(cfg, os.path.join(ROOT, 'configs'))
    for split in ('train', 'val', 'test'):
        loader = cfg[f'{split}_dataloader']
        loader.update(num_workers=0, persistent_workers=False)
        dataset = _innermost(loader.dataset)
        dataset.data_root = os.path.join(ROOT, dataset.data_root)
        for transform in dataset.pipeline:
            for key in ('scale', 'crop_size'):
                if key in transform:
                    transform[key] = _shrunk(transform[key], side)
        if split != 'train' and eval_images is not None:
            loader.dataset.indices = eval_images
    for evaluator in (cfg.val_evaluator, cfg.test_evaluator):
        for metric in (evaluator if isinstance(evaluator, list) else [evaluator]):
            if 'ann_file' in metric:
                metric.ann_file = os.path.join(ROOT, metric.ann_file)
    for preprocessor in (cfg.get('data_preprocessor'), cfg.model.get('data_preprocessor')):
        if preprocessor and preprocessor.get('size'):
            preprocessor.size = _shrunk(preprocessor.size, side)
    cfg.train_dataloader.batch_size = batch_size
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=iters)
    cfg.param_scheduler = None  # a constant learning rate: no warm-up over the few iterations
    if lr is not None:
        cfg.optim_wrapper.optimizer.lr = lr
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=iters, by_epoch=False)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.log_processor = dict(by_epoch=False)
    cfg.randomness = dict(seed=0)
    cfg.merge_from_dict(edits)
    cfg.dump(str(out_path))
    return str(out_path)


def scalars(work_dir):
    """The records of mmengine's local visualisation backend (``<work_dir>/<time>/vis_data/
    scalars.json``): the training records (with ``loss``) and the validation ones, by step."""
    files = sorted(glob.glob(os.path.join(str(work_dir), '*', 'vis_data', 'scalars.json')))
    assert files, f'no scalars.json under {work_dir}'
    with open(files[-1]) as f:
        records = [json.loads(line) for line in f if line.strip()]
    train = [r for r in records if 'loss' in r]
    evaluation = [r for r in records if 'loss' not in r and 'lr' not in r]
    return train, evaluation


def evaluate(config, checkpoint, work_dir, *extra, processes=1):
    """``tools/test.py`` (``tools/dist_test.sh`` for several processes) on ``checkpoint``: its output
    and the metrics it wrote with --out-json."""
    out_json = os.path.join(str(work_dir), 'metrics.json')
    options = ['--work-dir', work_dir, '--out-json', out_json, *extra]
    if processes == 1:
        proc = run(['tools/test.py', config, checkpoint, *options])
    else:
        proc = run_distributed('dist_test.sh', config, checkpoint, processes, *options)
    with open(out_json) as f:
        return proc.output, json.load(f)


@contextlib.contextmanager
def mmengine_log():
    """The messages logged through mmengine's current logger inside the block."""
    from mmengine.logging import MMLogger
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
