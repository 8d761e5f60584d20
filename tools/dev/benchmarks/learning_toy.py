"""Learning benchmark: ``python tools/benchmark.py learning-toy [--models ...] [--out F.json] [--plot F.png]``.

Trains ImageNet classifiers built from this project's configs (``MODELS``: LaplacianFormer-T with
the Laplacian kernel at lam 1/4/16 and with SOFT's Gaussian kernel; Pola-PVT-T as published, with
``polarity='same'`` and with ``power='fixed'``; mmdet's softmax PVT-T and Swin-T through the
registry) from scratch on the toy ImageNet-layout set (``data/toy/imagenet``, 10 classes), all under
one schedule and budget, and logs the curves. TOY-SET RESULTS: they show how fast each variant
learns this small synthetic task, nothing about ImageNet.

The schedule, the same for every model: ``--iters`` steps of ``--batch`` images at ``--img-size``
(mmpretrain's RandomResizedCrop + horizontal flip; validation: resize the short edge to 8/7 of
the size and centre-crop), the config's optimiser (AdamW, weight decay 0.05, no decay on norms,
biases, position embeddings and the Pola power/scale, gradient clipping at 5) at ``--lr`` with a
linear warm-up over ``--warmup`` steps and cosine decay to 0, the config's head and loss (label
smoothing 0.1) with the batch mixing (Mixup/CutMix) off, drop path off. Every
``--eval-interval`` steps and at the end: top-1 on the whole toy validation set. Each model starts
from ``torch.manual_seed(seed)`` (weights, data order, augmentation), ``--seeds`` lists the seeds.

Long runs can be split (``--models``) and the parts joined: ``--merge A.json B.json --out ALL.json
--plot ALL.png`` checks that the parts share the schedule and prints the joint table.
"""
import argparse
import copy
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from typing import Dict, List

import numpy as np
import torch
from torch import nn

from .common import REPO_ROOT, Section, environment, publish

CONFIGS = os.path.join(REPO_ROOT, 'configs')
LAPLACIAN = os.path.join(CONFIGS, 'laplacianformer_tiny_8xb128_in1k.py')
POLA_PVT = os.path.join(CONFIGS, 'pola_pvt_tiny_8xb128_in1k.py')
# name -> (config, backbone overrides, or a replacement backbone with its head width)
MODELS: Dict[str, dict] = {
    'LaplacianFormer-T (Laplacian, lam 4)': dict(config=LAPLACIAN, backbone=dict()),
    'LaplacianFormer-T lam 1': dict(config=LAPLACIAN, backbone=dict(attn_cfg=dict(lam=1.0))),
    'LaplacianFormer-T lam 16': dict(config=LAPLACIAN, backbone=dict(attn_cfg=dict(lam=16.0))),
    'LaplacianFormer-T Gaussian kernel': dict(config=LAPLACIAN, backbone=dict(attn_cfg=dict(kernel='gaussian'))),
    'Pola-PVT-T': dict(config=POLA_PVT, backbone=dict()),
    'Pola-PVT-T polarity=same': dict(config=POLA_PVT, backbone=dict(attn_cfg=dict(polarity='same'))),
    'Pola-PVT-T power=fixed': dict(config=POLA_PVT, backbone=dict(attn_cfg=dict(power='fixed'))),
    'PVT-T (mmdet, softmax)': dict(config=POLA_PVT, replace_backbone=dict(
        type='mmdet.PyramidVisionTransformer', num_layers=[2, 2, 2, 2], out_indices=(3, )),
        head_channels=512),
    'Swin-T (mmdet, softmax)': dict(config=POLA_PVT, replace_backbone=dict(
        type='mmdet.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
        window_size=7, out_indices=(3, )), head_channels=768),
}
SCHEDULE_KEYS = ('iters', 'batch', 'img_size', 'lr', 'warmup', 'eval_interval', 'toy_root')


class TupleOutputs(nn.Module):
    """mmdet's backbones return a list; mmpretrain's necks take a tuple."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone

    def forward(self, x):
        return tuple(self.backbone(x))


def build_classifier(entry: dict, num_classes: int):
    """The mmpretrain classifier of ``entry`` (see ``MODELS``), its data preprocessor and the config."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    import mmdet.models  # noqa: F401  (registers mmdet's backbones for the 'mmdet.' types)
    import mmlinattn  # noqa: F401
    from mmpretrain.registry import MODELS as PRETRAIN_MODELS

    cfg = Config.fromfile(entry['config'])
    init_default_scope('mmpretrain')
    model_cfg = copy.deepcopy(cfg.model)
    if 'replace_backbone' in entry:
        model_cfg.backbone = dict(entry['replace_backbone'])
        model_cfg.head.in_channels = entry['head_channels']
    else:
        model_cfg.backbone.update(entry['backbone'])
    model_cfg.backbone['drop_path_rate'] = 0.0
    model_cfg.head.num_classes = num_classes
    model_cfg.pop('train_cfg', None)  # no Mixup/CutMix: one budget, plain batches
    model_cfg.data_preprocessor = dict(cfg.data_preprocessor, num_classes=num_classes)
    model = PRETRAIN_MODELS.build(model_cfg)
    model.init_weights()
    if 'replace_backbone' in entry:
        model.backbone = TupleOutputs(model.backbone)
    return model, cfg


def _datasets(toy_root: str, img_size: int):
    from mmpretrain.registry import DATASETS
    train_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='RandomResizedCrop', scale=img_size, backend='pillow', interpolation='bicubic'),
        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='PackInputs'),
    ]
    val_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='ResizeEdge', scale=img_size * 8 // 7, edge='short', backend='pillow',
             interpolation='bicubic'),
        dict(type='CenterCrop', crop_size=img_size),
        dict(type='PackInputs'),
    ]
    common = dict(type='ImageNet', data_root=toy_root)
    train = DATASETS.build(dict(common, split='train', ann_file='meta/train.txt', data_prefix='train',
                                pipeline=train_pipeline))
    val = DATASETS.build(dict(common, split='val', ann_file='meta/val.txt', data_prefix='val',
                              pipeline=val_pipeline))
    return train, val


def _batches(dataset, batch: int, generator: torch.Generator):
    """Endless shuffled batches (reshuffled every pass, the last partial batch dropped)."""
    from mmengine.dataset import pseudo_collate
    while True:
        order = torch.randperm(len(dataset), generator=generator).tolist()
        for start in range(0, len(order) - batch + 1, batch):
            yield pseudo_collate([dataset[i] for i in order[start:start + batch]])


def evaluate(model, dataset, batch: int = 50) -> float:
    """Top-1 accuracy (%) on the whole dataset."""
    from mmengine.dataset import pseudo_collate
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(dataset), batch):
            data = pseudo_collate([dataset[i] for i in range(start, min(start + batch, len(dataset)))])
            data = model.data_preprocessor(data, training=False)
            for sample in model(**data, mode='predict'):
                correct += int(sample.pred_label.item() == sample.gt_label.item())
    model.train()
    return 100.0 * correct / len(dataset)


def _lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))


def train_one(name: str, seed: int, args: argparse.Namespace, log=print) -> dict:
    from mmengine.optim import build_optim_wrapper
    torch.manual_seed(seed)
    np.random.seed(seed)  # mmpretrain's transforms draw from numpy's and Python's generators
    random.seed(seed)
    train_set, val_set = _datasets(args.toy_root, args.img_size)
    num_classes = 1 + int(max(train_set.get_gt_labels()))
    model, cfg = build_classifier(MODELS[name], num_classes)
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    optim_cfg.optimizer.lr = args.lr
    optim_wrapper = build_optim_wrapper(model, optim_cfg)
    base_lrs = [group['lr'] for group in optim_wrapper.optimizer.param_groups]
    batches = _batches(train_set, args.batch, torch.Generator().manual_seed(seed))
    losses, evals, step_s = [], [], []
    model.train()
    start = time.perf_counter()
    for step in range(args.iters):
        factor = _lr_factor(step, args.warmup, args.iters)
        for group, base_lr in zip(optim_wrapper.optimizer.param_groups, base_lrs):
            group['lr'] = base_lr * factor
        tick = time.perf_counter()
        data = model.data_preprocessor(next(batches), training=True)
        loss_dict = model(**data, mode='loss')
        loss = sum(v for k, v in loss_dict.items() if 'loss' in k)
        optim_wrapper.update_params(loss)
        step_s.append(time.perf_counter() - tick)
        losses.append(float(loss.detach()))
        if (step + 1) % args.eval_interval == 0 or step + 1 == args.iters:
            evals.append(dict(iter=step + 1, top1=evaluate(model, val_set)))
            log(f'  {name} seed {seed}: iter {step + 1}/{args.iters}, loss {losses[-1]:.3f}, '
                f'val top-1 {evals[-1]["top1"]:.1f}%, {statistics.median(step_s):.2f} s/iter')
    return dict(name=name, seed=seed, config=os.path.relpath(MODELS[name]['config'], REPO_ROOT),
                overrides=MODELS[name].get('backbone', MODELS[name].get('replace_backbone')),
                params_m=sum(p.numel() for p in model.parameters()) / 1e6, loss=losses,
                evals=evals, final_top1=evals[-1]['top1'], best_top1=max(e['top1'] for e in evals),
                median_step_s=statistics.median(step_s), wall_s=time.perf_counter() - start)


def _mean(values: List[float]) -> float:
    return sum(values) / len(values)


def summarise(results: List[dict], schedule: dict) -> Section:
    """One row per model, averaged over its seeds."""
    rows = []
    window = max(1, min(10, schedule['iters'] // 5))
    for name in dict.fromkeys(r['name'] for r in results):
        runs = [r for r in results if r['name'] == name]
        eval_iters = [e['iter'] for e in runs[0]['evals']]
        row = {'model': name, 'params (M)': runs[0]['params_m'],
               'seeds': ' '.join(str(r['seed']) for r in runs),
               f'loss first {window}': _mean([_mean(r['loss'][:window]) for r in runs]),
               f'loss last {window}': _mean([_mean(r['loss'][-window:]) for r in runs])}
        for i, it in enumerate(eval_iters):
            row[f'top-1 @{it}'] = _mean([r['evals'][i]['top1'] for r in runs])
        row['s/iter'] = _mean([r['median_step_s'] for r in runs])
        rows.append(row)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    notes = ['TOY SET (synthetic, 10 classes, 300 train / 100 val images): not ImageNet results.',
             'schedule: ' + ', '.join(f'{k}={schedule[k]}' for k in SCHEDULE_KEYS if k in schedule),
             'top-1 in % on the toy validation set (mean over the seeds); loss = training loss '
             '(label-smoothed cross entropy), mean of the first / last steps; s/iter = median step '
             'time (machine load in the JSON).']
    return Section('Learning on the toy ImageNet set (from scratch)', columns, rows, notes)


def plot(results: List[dict], schedule: dict, path: str) -> None:
    """Per model, the mean over its seeds (training loss as a moving mean; validation top-1 with
    the seeds' range shaded)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    names = list(dict.fromkeys(r['name'] for r in results))
    colours = plt.get_cmap('tab10')(range(len(names)))
    styles = ['-', '--', ':', '-.']
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(14, 5))
    window = max(1, min(10, schedule['iters'] // 5))
    for i, (name, colour) in enumerate(zip(names, colours)):
        runs = [r for r in results if r['name'] == name]
        seeds = ' '.join(str(r['seed']) for r in runs)
        style = dict(color=colour, linestyle=styles[i % len(styles)], label=f'{name} (seeds {seeds})')
        loss = np.mean([np.convolve(r['loss'], np.ones(window) / window, mode='valid') for r in runs],
                       axis=0)
        ax_loss.plot(np.arange(window, window + len(loss)), loss, **style)
        iters = [e['iter'] for e in runs[0]['evals']]
        top1 = np.array([[e['top1'] for e in r['evals']] for r in runs])
        ax_acc.plot(iters, top1.mean(0), marker='o', markersize=3, **style)
        ax_acc.fill_between(iters, top1.min(0), top1.max(0), color=colour, alpha=0.12)
    ax_loss.set_xlabel('iteration')
    ax_loss.set_ylabel(f'training loss (moving mean over {window}, mean over the seeds)')
    ax_acc.set_xlabel('iteration')
    ax_acc.set_ylabel('toy validation top-1 (%): mean, seeds\' range shaded')
    for ax in (ax_loss, ax_acc):
        ax.grid(True, linewidth=0.3, alpha=0.5)
    ax_acc.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))
    fig.suptitle('TOY SET learning curves, from scratch (' + ', '.join(
        f'{k}={schedule[k]}' for k in ('iters', 'batch', 'img_size', 'lr')) + ')', fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches='tight')
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--models', nargs='+', choices=list(MODELS), metavar='NAME',
                        help=f'subset of {list(MODELS)} (default: all)')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0])
    parser.add_argument('--iters', type=int, default=200)
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--img-size', type=int, default=64)
    parser.add_argument('--lr', type=float, default=5e-4)
    parser.add_argument('--warmup', type=int, default=20)
    parser.add_argument('--eval-interval', type=int, default=25)
    parser.add_argument('--toy-root', default=os.path.join(REPO_ROOT, 'data', 'toy', 'imagenet'))
    parser.add_argument('--threads', type=int, help='torch CPU threads (default: torch\'s)')
    parser.add_argument('--smoke', action='store_true',
                        help='seconds per model: 2 models, 3 steps of 4 images at 32^2')
    parser.add_argument('--merge', nargs='+', metavar='JSON',
                        help='join saved runs (same schedule) instead of training')
    parser.add_argument('--out', help='write the results as JSON to this file')
    parser.add_argument('--plot', metavar='FILE.png', help='draw the loss and accuracy curves')


def _merge(paths: List[str]):
    results, schedule, meta = [], None, []
    for path in paths:
        with open(path) as f:
            payload = json.load(f)
        if schedule is not None and payload['schedule'] != schedule:
            raise ValueError(f'{path} was trained under another schedule: {payload["schedule"]} '
                             f'instead of {schedule}')
        schedule = payload['schedule']
        results += payload['results']
        meta.append({k: payload.get(k) for k in ('load_before', 'load_after', 'started', 'threads')})
    return results, schedule, meta


def main(args: argparse.Namespace) -> int:
    from mmengine.logging import MMLogger
    MMLogger.get_current_instance().setLevel(logging.WARNING)  # mmengine logs every param group
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.merge:
        try:
            results, schedule, parts = _merge(args.merge)
        except (OSError, ValueError, KeyError) as err:
            print(f'--merge: {err}', file=sys.stderr)
            return 2
        meta = dict(environment(), schedule=schedule, parts=parts, merged_from=args.merge)
    else:
        if args.smoke:
            args.models = args.models or ['LaplacianFormer-T (Laplacian, lam 4)', 'Pola-PVT-T power=fixed']
            args.iters, args.batch, args.img_size, args.warmup, args.eval_interval = 3, 4, 32, 1, 3
        if not os.path.isdir(args.toy_root):
            print(f'--toy-root {args.toy_root} does not exist (python tools/dev/make_toy_data.py '
                  '--what imagenet)', file=sys.stderr)
            return 2
        schedule = {k: getattr(args, k) for k in SCHEDULE_KEYS}
        schedule['toy_root'] = os.path.relpath(args.toy_root, REPO_ROOT)
        meta = dict(environment(), schedule=schedule, load_before=os.getloadavg(),
                    started=time.strftime('%Y-%m-%d %H:%M:%S'))
        print('# learning benchmark (TOY SET): ' + ', '.join(f'{k}={v}' for k, v in meta.items()))
        results = [train_one(name, seed, args) for name in (args.models or list(MODELS))
                   for seed in args.seeds]
        meta['load_after'] = os.getloadavg()
    section = summarise(results, schedule)
    publish([section], args.out, dict(meta, results=results))
    if args.plot:
        plot(results, schedule, args.plot)
        print(f'figure written to {args.plot}')
    return 0
