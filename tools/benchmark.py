"""Benchmarks: ``python tools/benchmark.py ops [--device cpu|cuda] [--repeats N] [--out F.json]``.

Subcommands:
- ``ops``: every op benchmark listed in ``OP_BENCHMARKS`` (modules under ``tools/benchmarks/``;
  the contract is in ``tools/benchmarks/common.py``): time, peak memory, ratios against the plain
  PyTorch formulation. Prints a table per module and writes JSON with ``--out``.

A backbone benchmark (throughput, latency and peak memory against resolution) plugs in as one more
entry of ``SUBCOMMANDS``: ``name: (add_arguments(parser), main(args) -> exit code)``.
``backbone --plot F.png`` also draws latency and peak memory against the number of tokens
(``benchmarks/plot.py``); ``plot RESULTS.json --out F.png`` redraws it from a saved run.
"""
import argparse
import os
import sys

TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(TOOLS_DIR), TOOLS_DIR):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402

from benchmarks import backbones, learning, plot, solver  # noqa: E402
from benchmarks.common import environment, publish, run_module  # noqa: E402

OP_BENCHMARKS = [
    'benchmarks.ops_laplacian',
    'benchmarks.ops_polarity',
    'benchmarks.ops_implementations',
]


def add_ops_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        choices=['cpu', 'cuda'], help='default: cuda when available')
    parser.add_argument('--repeats', type=int, default=5,
                        help='timed calls per case (median reported), after one warm-up call')
    parser.add_argument('--only', nargs='+', metavar='MODULE',
                        help='run only these modules of OP_BENCHMARKS, e.g. ops_laplacian')
    parser.add_argument('--out', help='write the results as JSON to this file')


def run_ops(args: argparse.Namespace) -> int:
    if args.device == 'cuda' and not torch.cuda.is_available():
        print('--device cuda: no CUDA device is available', file=sys.stderr)
        return 2
    modules = OP_BENCHMARKS
    if args.only:
        modules = [m for m in OP_BENCHMARKS if m.rsplit('.', 1)[-1] in args.only]
        if not modules:
            print(f'--only {args.only}: none of {OP_BENCHMARKS}', file=sys.stderr)
            return 2
    meta = dict(environment(), device=args.device, repeats=args.repeats)
    print(f'# ops benchmark on {args.device}: ' + ', '.join(f'{k}={v}' for k, v in meta.items()))
    sections = []
    for name in modules:
        print(f'{name}:')
        sections.append(run_module(name, args.device, args.repeats))
    publish(sections, args.out, meta)
    return 0


SUBCOMMANDS = {
    'ops': (add_ops_arguments, run_ops),
    'backbone': plot.with_plot_option(backbones.add_arguments, backbones.main),  # + --plot F.png
    'plot': (plot.add_arguments, plot.main),  # redraw the --plot figure from a saved JSON
    'solver': (solver.add_arguments, solver.main),  # landmark-system solvers: NS, CG, Cholesky
    'learning': (learning.add_arguments, learning.main),  # toy-set training curves, side by side
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    for name, (add_arguments, _) in SUBCOMMANDS.items():
        add_arguments(sub.add_parser(name, help=f'{name} benchmark'))
    args = parser.parse_args(argv)
    return SUBCOMMANDS[args.command][1](args)


if __name__ == '__main__':
    sys.exit(main())
