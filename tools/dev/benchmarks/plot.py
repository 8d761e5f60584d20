"""Plot the backbone benchmark: latency and peak memory against the number of tokens, log-log.

    python tools/benchmark.py backbone ... --plot FIGURE.png     (run, then draw)
    python tools/benchmark.py plot RESULTS.json --out FIGURE.png  (draw a saved run)

Input: the JSON that ``tools/benchmark.py backbone --out`` writes (``common.write_json``): sections
whose rows hold ``backbone``, ``input`` (``'512^2'`` or ``'800x1333'``, or explicit ``height`` and
``width``) and the measured columns (``'fwd ms'``, ``'peak fwd MiB'``, ``'fwd+bwd ms'``, ...; a
missing cell is null). The x axis is the number of stride-4 tokens, ``ceil(H/4) * ceil(W/4)``
(the sequence length of the first stage, where the attention costs the most). One line per
backbone; the grey lines are slopes 1 (cost linear in the tokens) and 2 (quadratic), starting
from the median measurement at the fewest tokens, so a backbone's growth can be read against them.
"""
import argparse
import json
import math
import os
import re
import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple

TOKEN_STRIDE = 4
PANELS = (('{} ms', 'latency (ms)'), ('peak {} MiB', 'peak memory (MiB)'))
PHASES = ('fwd', 'fwd+bwd')
PHASE_TITLES = {'fwd': 'forward (eval, no grad)', 'fwd+bwd': 'forward + backward'}


def input_size(row: Dict) -> Tuple[int, int]:
    """(H, W) of a result row: its ``height``/``width``, or parsed from ``input``."""
    if 'height' in row and 'width' in row:
        return int(row['height']), int(row['width'])
    name = str(row.get('input', ''))
    square = re.fullmatch(r'(\d+)\^2', name)
    if square:
        return int(square.group(1)), int(square.group(1))
    rect = re.fullmatch(r'(\d+)x(\d+)', name)
    if rect:
        return int(rect.group(1)), int(rect.group(2))
    raise ValueError(f'cannot read an input size from row {row!r}: expected "input" like "512^2" '
                     'or "800x1333", or "height" and "width"')


def num_tokens(height: int, width: int, stride: int = TOKEN_STRIDE) -> int:
    return math.ceil(height / stride) * math.ceil(width / stride)


def series(rows: Sequence[Dict], column: str) -> Dict[str, List[Tuple[int, float]]]:
    """backbone -> [(tokens, value)] sorted by tokens, for the rows where ``column`` is a number."""
    out: Dict[str, List[Tuple[int, float]]] = {}
    for row in rows:
        value = row.get(column)
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            out.setdefault(row['backbone'], []).append((num_tokens(*input_size(row)), float(value)))
    return {name: sorted(points) for name, points in out.items()}


def _reference_slopes(ax, points: Sequence[Tuple[int, float]]) -> None:
    """Slopes 1 and 2 from the median value at the fewest tokens, over the tokens shown."""
    x0 = min(x for x, _ in points)
    y0 = statistics.median(y for x, y in points if x == x0)
    x1 = max(x for x, _ in points)
    if x1 <= x0:
        return
    for slope, style in ((1, '--'), (2, ':')):
        ax.plot([x0, x1], [y0, y0 * (x1 / x0)**slope],
                style,
                color='grey',
                linewidth=1.2,
                label=f'slope {slope} ({"linear" if slope == 1 else "quadratic"})')


def plot_backbone_results(payload: Dict, path: str, title: Optional[str] = None) -> List[str]:
    """Draw the (phase x latency/memory) panels of the payload into ``path``; returns the titles
    of the panels that hold data (a phase with no number at all gets no column)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows = [
        row for section in payload.get('sections', []) for row in section.get('rows', [])
        if 'backbone' in row
    ]
    if not rows:
        raise ValueError('the JSON holds no backbone rows (sections[].rows[] with "backbone")')
    phases = [p for p in PHASES if any(series(rows, column.format(p)) for column, _ in PANELS)]
    if not phases:
        raise ValueError(
            f'no measured column among {[c.format(p) for c, _ in PANELS for p in PHASES]}')
    fig, axes = plt.subplots(len(PANELS),
                             len(phases),
                             squeeze=False,
                             figsize=(5.2 * len(phases), 4.0 * len(PANELS) + 0.4))
    backbones = list(dict.fromkeys(row['backbone'] for row in rows))
    colours = {name: f'C{i % 10}' for i, name in enumerate(backbones)}
    drawn = []
    for col, phase in enumerate(phases):
        for row_index, (column, ylabel) in enumerate(PANELS):
            ax = axes[row_index][col]
            data = series(rows, column.format(phase))
            if not data:
                ax.text(0.5,
                        0.5,
                        f'{column.format(phase)}: not measured',
                        ha='center',
                        transform=ax.transAxes)
                ax.set_axis_off()
                continue
            for name in backbones:
                if name in data:
                    xs, ys = zip(*data[name])
                    ax.plot(xs, ys, marker='o', color=colours[name], label=name)
            _reference_slopes(ax, [p for points in data.values() for p in points])
            ax.set_xscale('log')
            ax.set_yscale('log')
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(f'tokens at stride {TOKEN_STRIDE}  (ceil(H/4) * ceil(W/4))', fontsize=8)
            ax.set_ylabel(ylabel, fontsize=9)
            panel_title = f'{PHASE_TITLES[phase]}: {ylabel.split(" (")[0]}'
            ax.set_title(panel_title, fontsize=9)
            ax.grid(True, which='both', linewidth=0.3, alpha=0.5)
            ax.legend(fontsize=7)
            drawn.append(panel_title)
    meta = ', '.join(f'{k}={payload[k]}' for k in ('device', 'gpu', 'torch', 'threads')
                     if k in payload)
    sizes = sorted({(num_tokens(*input_size(row)), str(row.get('input', ''))) for row in rows})
    size_note = ', '.join(f'{name}: {tokens}' for tokens, name in sizes)
    fig.suptitle(title or f'Backbone benchmark ({meta})\ntokens per input: {size_note}',
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def plot_json(json_path: str, png_path: str, title: Optional[str] = None) -> List[str]:
    with open(json_path) as f:
        return plot_backbone_results(json.load(f), png_path, title)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``plot`` subcommand: redraw a figure from a saved backbone benchmark JSON."""
    parser.add_argument('json', help='the file written by `tools/benchmark.py backbone --out`')
    parser.add_argument('--out', required=True, metavar='FILE.png', help='the figure to write')
    parser.add_argument('--title', help='figure title (default: the run\'s device and versions)')


def main(args: argparse.Namespace) -> int:
    panels = plot_json(args.json, args.out, args.title)
    print(f'figure written to {args.out} ({len(panels)} panels)')
    return 0


def with_plot_option(add_arguments: Callable, run: Callable) -> Tuple[Callable, Callable]:
    """A benchmark subcommand ``(add_arguments, main)`` whose ``--out`` JSON holds backbone rows,
    extended by ``--plot FILE.png``: after a successful run the figure is drawn from that JSON
    (written to FILE.json beside the figure when ``--out`` is not given)."""

    def add_with_plot(parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)
        parser.add_argument('--plot', metavar='FILE.png',
                            help='also draw latency and peak memory against the number of tokens '
                            '(log-log, slope-1 and slope-2 references) into this PNG')

    def run_and_plot(args: argparse.Namespace) -> int:
        if args.plot and not args.out:
            args.out = os.path.splitext(args.plot)[0] + '.json'
        code = run(args)
        if code == 0 and args.plot:
            plot_json(args.out, args.plot)
            print(f'figure written to {args.plot}')
        return code

    return add_with_plot, run_and_plot
