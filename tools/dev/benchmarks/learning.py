"""Real-data learning benchmark: ``python tools/benchmark.py learning --task T [--seeds 0 1]
[--precisions fp32 bf16] [--cfg-options K=V ...] [--out F.json] [--plot F.png]``.

A task is one real set and its six configs (``TASKS``: ``configs/<set>/``, one per backbone:
LaplacianFormer-T, Pola-PVT-T, Pola-Swin-T and the libraries' PVT-T, Swin-T and ResNet), and on CIFAR-10
the papers' ablation switches (``ABLATIONS``: ``--cfg-options`` on the LaplacianFormer-T and
Pola-PVT-T configs). Every run is the config unchanged — its schedule, its start (random: no
weights are loaded) — through ``tools/train.py`` in a subprocess, seeded with ``randomness.seed``;
the config's last validation (the held-out split) is the metric. ``--precisions bf16`` trains the
same rows with ``tools/train.py --amp`` (bf16 autocast on the CPU, rows labelled ``, bf16``);
``--cfg-options`` go to every run (a shorter schedule for a speed-only table). From mmengine's
``vis_data/scalars.json`` of each run: the loss curve, the metric, and the speed — images/s from the
mean iteration ``time`` and the batch size, the data-loading share ``data_time / time`` — beside the
run's wall time (start-up and validation included). Rows are the mean over seeds with the spread
(min-max) of the metric; the table and JSON are written by ``common.publish`` as in the other
benchmarks, the runs (curves included) beside the table in the JSON.

The sets are prepared first with ``tools/misc/download_dataset.py`` (``--data-root`` points a task at
another copy, e.g. the full CIFAR-10 or CamVid instead of a mini set).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Sequence

from dev.demo_report import read_scalars

from .common import REPO_ROOT, Section, environment, publish

BACKBONES = ('LaplacianFormer-T', 'Pola-PVT-T', 'Pola-Swin-T', 'PVT-T', 'Swin-T')


def _configs(folder: str, pattern: str, resnet: str) -> Dict[str, str]:
    names = ('laplacian_tiny', 'pola_pvt_tiny', 'pola_swin_tiny', 'pvt_tiny', 'swin_tiny')
    paths = {label: pattern.format(name) for label, name in zip(BACKBONES, names)}
    paths[resnet] = pattern.format(resnet.lower().replace('-', ''))
    return {label: os.path.join('configs', folder, path) for label, path in paths.items()}


def _cifar_configs() -> Dict[str, str]:
    configs = _configs('cifar10', '{}_1xb32_cifar10.py', 'ResNet-18')
    configs['LaplacianFormer-T'] = 'configs/cifar10/laplacianformer_tiny_1xb32_cifar10.py'
    return configs


# task -> configs by row label, the metric keys of the validation (first: the table's), the data folder
TASKS = {
    'balloon': dict(runs=_configs('balloon', 'mask_rcnn_{}_balloon.py', 'R-50'),
                    metrics=('coco/segm_mAP', 'coco/bbox_mAP', 'coco/segm_mAP_50', 'coco/bbox_mAP_50'),
                    data='data/balloon', split='val (13 photos)'),
    'coco128': dict(runs=_configs('coco128', 'mask_rcnn_{}_coco128.py', 'R-50'),
                    metrics=('coco/bbox_mAP', 'coco/segm_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP_50'),
                    data='data/coco128', split='the 128 training images'),
    'camvid': dict(runs=_configs('camvid', 'fpn_{}_camvid.py', 'R-50'),
                   metrics=('mIoU', 'aAcc', 'mAcc'), data='data/camvid', split='val'),
    'cifar10': dict(runs=_cifar_configs(), metrics=('accuracy/top1', ),
                    data='data/cifar10', split='2000 test images'),
}
# The papers' ablation switches, as rows of the CIFAR-10 table (same schedule, same seeds): the
# Laplacian kernel against SOFT's Gaussian one, Newton-Schulz against the exact inverse, polarity on
# (the plain rows) against off.
_LAPLACIAN = TASKS['cifar10']['runs']['LaplacianFormer-T']
_POLA = TASKS['cifar10']['runs']['Pola-PVT-T']
ABLATIONS = {
    'LaplacianFormer-T, Gaussian kernel': (_LAPLACIAN, 'model.backbone.attn_cfg.kernel=gaussian'),
    'LaplacianFormer-T, exact inverse': (_LAPLACIAN, 'model.backbone.attn_cfg.inverse=exact'),
    'Pola-PVT-T, polarity off (same-sign only)': (_POLA, 'model.backbone.attn_cfg.polarity=same'),
}
TASKS['cifar10']['runs'].update(ABLATIONS)


# --precisions entry -> tools/train.py flags (bf16: the plugin's mixed-precision optim wrapper, bf16
# autocast on the CPU, fp16 with loss scaling on CUDA).
PRECISION_FLAGS = {'fp32': [], 'bf16': ['--amp']}


def _run_spec(spec):
    return (spec, None) if isinstance(spec, str) else spec


def run_record(work_dir: str) -> dict:
    """The training log of one run (its latest ``scalars.json``): loss curve, mean iteration time,
    data-loading share and the last validation."""
    train, vals = read_scalars(work_dir)
    if not train or not vals:
        raise RuntimeError(f'{work_dir}: no training records or no validation record')
    steady = train[1:] or train  # the first window holds the start-up (worker spawn, first batches)
    iter_s = statistics.mean(r['time'] for r in steady)
    return dict(curve=[(r['step'], r['loss']) for r in train], iter_s=iter_s,
                data_share=statistics.mean(r['data_time'] for r in steady) / iter_s, val=vals[-1])


def train_once(config: str, option, seed: int, work_dir: str, data_root, precision: str = 'fp32',
               extra_options: Sequence[str] = ()) -> dict:
    """``tools/train.py config`` in a subprocess (with ``--amp`` for ``precision='bf16'``: bf16
    autocast on the CPU); the run's record."""
    from mmengine.config import Config
    cfg = Config.fromfile(os.path.join(REPO_ROOT, config))
    options = [f'randomness.seed={seed}'] + ([option] if option else []) + list(extra_options)
    if data_root:
        options += _data_root_options(cfg, data_root)
    command = [sys.executable, 'tools/train.py', config, '--work-dir', work_dir,
               *PRECISION_FLAGS[precision], '--cfg-options', *options]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f'{" ".join(command)} failed:\n{proc.stderr[-4000:]}')
    record = run_record(work_dir)
    record.update(wall_s=wall, images_per_s=cfg.train_dataloader.batch_size / record.pop('iter_s'))
    return record


def _data_root_options(cfg, data_root: str) -> List[str]:
    """``--cfg-options`` that move a config's datasets (and its COCO evaluator) to ``data_root``."""
    root = data_root.rstrip('/') + '/'
    options = [f'{loader}.dataset.data_root={root}' for loader in ('train_dataloader', 'val_dataloader')]
    ann_file = cfg.get('val_evaluator', {}).get('ann_file')
    if ann_file:
        options.append(f'val_evaluator.ann_file={root}{ann_file[len(cfg.data_root):]}')
    return options


def summarise(runs: List[dict], metrics: Sequence[str], split: str) -> Section:
    """One row per model: the first metric's mean and min-max over its seeds, the other metrics'
    means, the last logged training loss (the fit, where the metric is at its floor), mean wall time,
    images/s and data_time share."""
    metric = metrics[0]
    rows = []
    for label in dict.fromkeys(run['model'] for run in runs):
        mine = [run for run in runs if run['model'] == label]
        values = [run['val'][metric] for run in mine]
        row = {'model': label, 'seeds': ' '.join(str(run['seed']) for run in mine),
               f'{metric} (mean)': statistics.mean(values), 'min': min(values), 'max': max(values)}
        row.update({f'{other} (mean)': statistics.mean(run['val'][other] for run in mine)
                    for other in metrics[1:]})
        row.update({'last train loss': statistics.mean(run['curve'][-1][1] for run in mine),
                    'wall min / run': statistics.mean(run['wall_s'] for run in mine) / 60,
                    'train images/s': statistics.mean(run['images_per_s'] for run in mine),
                    'data_time %': 100 * statistics.mean(run['data_share'] for run in mine)})
        rows.append(row)
    notes = [f'{metric} on {split}, the last validation of each run; every run from a random start.',
             'last train loss: the mean loss of the last logging window, averaged over seeds.',
             'wall time includes start-up and validation; images/s from the mean logged iteration time '
             '(the first logging window left out) and the batch size; data_time % = data_time / time.']
    return Section(f'Learning on real images: {metric}', list(rows[0]), rows, notes)


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {}
    for run in result['runs']:
        colour = colours.setdefault(run['model'], f'C{len(colours)}')
        steps, losses = zip(*run['curve'])
        ax.plot(steps, losses, color=colour, alpha=0.8,
                label=run['model'] if run['seed'] == result['seeds'][0] else None)
    ax.set_xlabel('iteration')
    ax.set_ylabel('training loss (logged window mean)')
    ax.set_title(f"{result['task']}: training loss, {len(result['seeds'])} seeds per model")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f'figure written to {path}')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--task', required=True, choices=sorted(TASKS))
    parser.add_argument('--models', nargs='+', help='row labels to run (default: all of the task)')
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1])
    parser.add_argument('--data-root', help="the set's folder, if not the configs' data/<set>")
    parser.add_argument('--precisions', nargs='+', choices=list(PRECISION_FLAGS), default=['fp32'],
                        help='train every row in each (bf16: tools/train.py --amp); rows of a '
                        'precision other than fp32 are labelled with it')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='added to every run, e.g. train_cfg.max_epochs=1 for a speed-only table')
    parser.add_argument('--work-dir', default='work_dirs/benchmark_learning')
    parser.add_argument('--out', help='JSON file for the runs and the table')
    parser.add_argument('--plot', help='PNG file for the loss curves')


def main(args) -> int:
    task = TASKS[args.task]
    data_root = args.data_root or task['data']
    if not os.path.isdir(os.path.join(REPO_ROOT, data_root)) and not os.path.isdir(data_root):
        raise SystemExit(f'{data_root} not found: prepare it with tools/misc/download_dataset.py')
    labels = args.models or list(task['runs'])
    unknown = sorted(set(labels) - set(task['runs']))
    if unknown:
        raise SystemExit(f'--models: {unknown} are not rows of {args.task}: {list(task["runs"])}')
    metric = task['metrics'][0]
    runs, start = [], time.perf_counter()
    for label, precision in ((label, p) for label in labels for p in args.precisions):
        config, option = _run_spec(task['runs'][label])
        row = label if precision == 'fp32' else f'{label}, {precision}'
        for seed in args.seeds:
            slug = (f"{os.path.basename(config)[:-3]}{'-' + option.split('=')[-1] if option else ''}"
                    f"-{precision}-seed{seed}")
            record = train_once(config, option, seed, os.path.join(args.work_dir, args.task, slug),
                                args.data_root, precision, args.cfg_options)
            record.update(model=row, config=config, cfg_option=option, seed=seed, precision=precision)
            runs.append(record)
            print(f"{row} seed {seed}: {metric} {record['val'][metric]:.3f}, "
                  f"{record['wall_s'] / 60:.1f} min, {record['images_per_s']:.1f} images/s, "
                  f"data_time {100 * record['data_share']:.0f}%", flush=True)
    total_min = (time.perf_counter() - start) / 60
    print(f"\n{args.task}: {total_min:.0f} min in all")
    result = dict(task=args.task, metric=metric, split=task['split'], data_root=data_root, seeds=args.seeds,
                  precisions=args.precisions, cfg_options=args.cfg_options, total_min=total_min,
                  environment=environment(), runs=runs)
    publish([summarise(runs, task['metrics'], task['split'])], args.out, result)
    if args.plot:
        plot(result, args.plot)
    return 0
