"""Attention maps, attention entropy and q–k distances of a LaplacianFormer or PolaFormer.

    python tools/visualize_attention.py CONFIG [CHECKPOINT] [--img IMG] [--out DIR]
        [--points X,Y ...] [--shape H W] [--block B] [--max-heads N] [--max-queries Q]

Writes to DIR (default ``work_dirs/attention/<config name>``), for one block per stage (``--block``,
default the last one) of every stage with a linear attention:

- ``attention_stage{i}.png``: for each query point (``--points``, fractions of the image width and
  height) and head, the weights the layer gives every key, over the image. LaplacianFormer: the
  Nyström attention row ``A_i = C_i W C^T / (C_i W C^T 1)``; PolaFormer: the same-sign and the
  opposite-sign rows, each normalised as the attention normalises it (formulas in
  ``tools/analysis/attention_stats.py``). Colours run from each panel's smallest to its largest
  weight; ``peak x n`` is the largest weight times the number of keys (1 = uniform).
- ``entropy.png``: per stage and head, how far the mean row entropy H (nats) lies below the uniform
  row's ``ln n`` (n keys), for each stream and for softmax attention over the same q and k (log
  scale, floored at 1e-6; larger = more concentrated attention). Softmax scaling:
  LaplacianFormer ``q'.k' / sqrt(d)`` with the raw projection ``q' = W_q x`` as query and key
  (the layer's q is ``q' / sqrt(d)``); PolaFormer ``q.k / sqrt(d)`` of the q and k its polarity
  op receives.
- ``distances.png``: per stage, histograms of the q–k L1 and squared-L2 distances (keys = the
  queries for LaplacianFormer, self-pairs left out) with the Laplacian ``exp(-l1 / lam)`` and
  Gaussian ``exp(-l2^2 / (2 sigma^2))`` kernels; ``lam`` is the model's (LaplacianFormer) or the
  median L1 distance (PolaFormer), ``sigma`` matches the two kernels at the median distances.
- ``stats.json``: the numbers behind the figures.

Without CHECKPOINT the backbone keeps its random initialisation (seeded by ``--seed``).
Entropies and distances use at most ``--max-queries`` queries spread evenly over the tokens. The
default image is the first of the toy COCO validation set (written by ``tools/dev/make_toy_data.py``
if absent, in a checkout). Pola-Swin's window-attention stages (3 and 4) are softmax attention and
are not drawn.
"""
import argparse
import json
import math
import os
import os.path as osp
import subprocess
import sys
from typing import Dict, List, Sequence, Tuple

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from analysis import (AttentionRecord, LayerStatistics, attention_streams,  # noqa: E402
                      layer_statistics, one_block_per_stage, record_attentions, token_index)
from analysis.model_loading import build_backbone, load_config, load_image, normalisation  # noqa: E402

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOY_VAL_DIR = osp.join(REPO_ROOT, 'data', 'toy', 'coco', 'val2017')
MAKE_TOY_DATA = osp.join(REPO_ROOT, 'tools', 'dev', 'make_toy_data.py')
DEFAULT_POINTS = ((0.5, 0.5), (0.25, 0.3), (0.75, 0.75))
STREAM_LABELS = {
    'laplacian': 'Nyström Laplacian',
    'same': 'same-sign',
    'opposite': 'opposite-sign',
    'softmax': 'softmax'
}
PANEL_INCHES = 2.0
MIN_WIDTH_INCHES = 5.0  # room for the title
ENTROPY_FLOOR = 1e-6


def default_image() -> str:
    """The first image of the toy COCO validation set, generated if absent."""
    if not osp.isdir(TOY_VAL_DIR) or not os.listdir(TOY_VAL_DIR):
        if not osp.isfile(MAKE_TOY_DATA):
            raise SystemExit(f'error: no --img given and no toy image in {TOY_VAL_DIR}; the toy data '
                             'generator (tools/dev/make_toy_data.py) is in the repository, not in the '
                             'installed package: pass --img IMG')
        subprocess.run([sys.executable, MAKE_TOY_DATA, '--out', osp.join(REPO_ROOT, 'data', 'toy'),
                        '--what', 'coco'], check=True)
    return osp.join(TOY_VAL_DIR, sorted(os.listdir(TOY_VAL_DIR))[0])


def parse_point(text: str) -> Tuple[float, float]:
    try:
        x, y = (float(v) for v in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(f'a point is X,Y (fractions of the width and height), '
                                         f'got {text!r}') from None
    if not (0 <= x <= 1 and 0 <= y <= 1):
        raise argparse.ArgumentTypeError(f'point coordinates must be in [0, 1], got {text!r}')
    return x, y


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?', help='weights (default: random initialisation)')
    parser.add_argument('--img', help='input image (default: the first toy COCO val image)')
    parser.add_argument('--out', help='output folder (default: work_dirs/attention/<config name>)')
    parser.add_argument('--points',
                        nargs='+',
                        type=parse_point,
                        default=list(DEFAULT_POINTS),
                        metavar='X,Y',
                        help='query points as fractions of the image width and '
                        'height (default: %(default)s)')
    parser.add_argument('--shape',
                        nargs=2,
                        type=int,
                        default=(224, 224),
                        metavar=('H', 'W'),
                        help='the image is resized to this (default: 224 224)')
    parser.add_argument('--block',
                        type=int,
                        default=-1,
                        help='which block of each stage (Python index, default -1: the last)')
    parser.add_argument('--max-heads',
                        type=int,
                        default=4,
                        help='heads drawn per stage in the attention maps (default: 4)')
    parser.add_argument('--max-queries',
                        type=int,
                        default=1024,
                        help='queries per layer for entropies and distances (default: 1024)')
    parser.add_argument('--seed',
                        type=int,
                        default=0,
                        help='seed of the random weights, without CHECKPOINT (default: 0)')
    return parser.parse_args(argv)


def _point_label(point: Tuple[float, float]) -> str:
    return f'({point[0]:.2f}, {point[1]:.2f})'


def plot_attention_maps(record: AttentionRecord, image: np.ndarray, points: Sequence[Tuple[float,
                                                                                           float]],
                        max_heads: int, title: str, path: str) -> None:
    """Rows: query points; columns: heads (x streams). Each panel overlays one attention row."""
    query_index = torch.tensor([token_index(p, record.hw_shape) for p in points])
    streams, _, _, _, key_grid = attention_streams(record, query_index)
    num_heads = min(next(iter(streams.values())).shape[1], max_heads)
    columns = [(head, name) for head in range(num_heads) for name in streams]
    fig, axes = plt.subplots(len(points),
                             len(columns),
                             squeeze=False,
                             figsize=(max(PANEL_INCHES * len(columns), MIN_WIDTH_INCHES),
                                      PANEL_INCHES * len(points) + 1.0))
    height, width = image.shape[:2]
    for row, point in enumerate(points):
        for col, (head, name) in enumerate(columns):
            ax = axes[row][col]
            weights = streams[name][0, head, row].reshape(key_grid).cpu().numpy()
            ax.imshow(image)
            ax.imshow(weights,
                      extent=(0, width, height, 0),
                      cmap='inferno',
                      alpha=0.6,
                      interpolation='nearest')
            ax.text(0.02,
                    0.02,
                    f'peak x n = {weights.max() * weights.size:.3g}',
                    fontsize=6,
                    color='white',
                    transform=ax.transAxes,
                    bbox=dict(facecolor='black', alpha=0.5, pad=1, linewidth=0))
            ax.plot(point[0] * width,
                    point[1] * height,
                    marker='*',
                    markersize=11,
                    color='cyan',
                    markeredgecolor='black')
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                label = f'head {head}' if len(
                    streams) == 1 else f'head {head} {STREAM_LABELS[name]}'
                ax.set_title(label, fontsize=8)
            if col == 0:
                ax.set_ylabel(f'query {_point_label(point)}', fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_entropy(stats: List[Tuple[AttentionRecord, LayerStatistics]], title: str,
                 path: str) -> None:
    """Per stage: bars of ``ln n - mean row entropy`` per head and stream, softmax included."""
    fig, axes = plt.subplots(1, len(stats), squeeze=False, figsize=(3.6 * len(stats), 3.6))
    for ax, (record, stat) in zip(axes[0], stats):
        names = list(stat.entropy)
        num_heads = len(stat.entropy[names[0]])
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            deficit = np.maximum(
                math.log(stat.num_keys) - np.asarray(stat.entropy[name]), ENTROPY_FLOOR)
            ax.bar(np.arange(num_heads) + (i - (len(names) - 1) / 2) * width,
                   deficit,
                   width,
                   label=STREAM_LABELS[name])
        ax.set_yscale('log')
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(
            f'stage {record.stage + 1}: {record.hw_shape[0]}x{record.hw_shape[1]} tokens, '
            f'n={stat.num_keys}',
            fontsize=8)
        ax.set_xlabel('head')
        ax.set_xticks(range(num_heads))
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel('ln n - mean row entropy (nats)')
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _histogram_with_kernel(ax, values: np.ndarray, kernel, median: float, xlabel: str,
                           kernel_label: str) -> None:
    ax.hist(values, bins=60, density=True, color='tab:blue', alpha=0.7)
    ax.axvline(median, color='tab:blue', linestyle=':', linewidth=1)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel('density', fontsize=8)
    ax.tick_params(labelsize=7)
    twin = ax.twinx()
    grid = np.linspace(0, values.max() * 1.05, 200)
    twin.plot(grid, kernel(grid), color='tab:red', linewidth=1.5, label=kernel_label)
    twin.set_ylim(0, 1.05)
    twin.set_ylabel('kernel value', fontsize=8, color='tab:red')
    twin.tick_params(labelsize=7)
    twin.legend(fontsize=7, loc='upper right')


def plot_distances(stats: List[Tuple[AttentionRecord, LayerStatistics]], title: str,
                   path: str) -> None:
    """Per stage: L1 distances with the Laplacian kernel, squared L2 with the Gaussian kernel."""
    fig, axes = plt.subplots(len(stats), 2, squeeze=False, figsize=(8.0, 2.6 * len(stats) + 0.6))
    for row, (record, stat) in enumerate(stats):
        l1, sq_l2 = stat.l1.numpy(), stat.sq_l2.numpy()
        lam, sigma = stat.scales['lam'], stat.scales['sigma']
        lam_source = 'model' if stat.kind == 'laplacian' else 'median L1'
        _histogram_with_kernel(axes[row][0], l1, lambda t: np.exp(-t / lam),
                               stat.scales['median_l1'], f'stage {record.stage + 1}: ||q - k||_1',
                               f'exp(-d/λ), λ={lam:.3g} ({lam_source})')
        _histogram_with_kernel(axes[row][1], sq_l2, lambda t: np.exp(-t / (2 * sigma**2)),
                               stat.scales['median_sq_l2'],
                               f'stage {record.stage + 1}: ||q - k||_2^2',
                               f'exp(-d/2σ²), σ={sigma:.3g} (matched)')
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def stats_json(record: AttentionRecord, stat: LayerStatistics) -> Dict:
    return dict(stage=record.stage + 1,
                layer=record.name,
                kind=stat.kind,
                hw_shape=list(record.hw_shape),
                num_keys=stat.num_keys,
                mean_row_entropy_nats=stat.entropy,
                uniform_entropy_nats=math.log(stat.num_keys),
                negative_weight_share=stat.negative_mass,
                kernel_scales=stat.scales,
                softmax_scale_on_q_dot_k=stat.softmax_scale)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = load_config(args.config)
    name = osp.splitext(osp.basename(args.config))[0]
    out_dir = args.out or osp.join('work_dirs', 'attention', name)
    os.makedirs(out_dir, exist_ok=True)
    img_path = args.img or default_image()

    torch.manual_seed(args.seed)
    backbone = build_backbone(cfg, args.checkpoint)
    image, inputs = load_image(img_path, tuple(args.shape), *normalisation(cfg))
    records = one_block_per_stage(record_attentions(backbone, inputs), args.block)
    weights = osp.basename(args.checkpoint) if args.checkpoint else 'random weights'
    header = f'{name}\n{weights}, {osp.basename(img_path)} at {args.shape[0]}x{args.shape[1]}'

    written, stats = [], []
    for record in records:
        path = osp.join(out_dir, f'attention_stage{record.stage + 1}.png')
        plot_attention_maps(
            record, image, args.points, args.max_heads,
            f'{header}\nstage {record.stage + 1} ({record.name}): attention rows of the query '
            'points\ncolour: row min .. row max', path)
        written.append(path)
        stats.append((record, layer_statistics(record, args.max_queries)))

    path = osp.join(out_dir, 'entropy.png')
    plot_entropy(
        stats, f'{header}\nentropy below uniform per head (0 = uniform), vs softmax over the '
        'same q, k', path)
    written.append(path)
    path = osp.join(out_dir, 'distances.png')
    plot_distances(stats, f'{header}\nq–k distances and the kernels at their scales', path)
    written.append(path)
    path = osp.join(out_dir, 'stats.json')
    with open(path, 'w') as f:
        json.dump(dict(config=args.config,
                       checkpoint=args.checkpoint,
                       image=img_path,
                       shape=list(args.shape),
                       points=[list(p) for p in args.points],
                       max_queries=args.max_queries,
                       layers=[stats_json(r, s) for r, s in stats]),
                  f,
                  indent=2)
    written.append(path)
    for stat_record, stat in stats:
        entropies = ', '.join(f'{STREAM_LABELS[k]} {np.mean(v):.3f}'
                              for k, v in stat.entropy.items())
        print(f'stage {stat_record.stage + 1} ({stat_record.name}): mean entropy {entropies} '
              f'(uniform {math.log(stat.num_keys):.3f}); lam {stat.scales["lam"]:.3g}, '
              f'sigma {stat.scales["sigma"]:.3g}')
    print('wrote ' + ', '.join(written))
    return 0


if __name__ == '__main__':
    sys.exit(main())
