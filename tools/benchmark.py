"""Benchmarks: ``python tools/benchmark.py ops|backbone|precision|solver|learning|learning-toy|deploy|plot ... [--out F.json]``.

The entry point only; the cases live in ``tools/dev/benchmarks/``, which runs from a checkout (the
installed package ships this script, not the cases). Results: ``docs/benchmarks.md``.

Subcommands (one entry of ``SUBCOMMANDS`` each: ``name: (add_arguments(parser), main(args) -> exit code)``):
- ``ops``: every op benchmark listed in ``OP_BENCHMARKS`` (the module contract is in
  ``tools/dev/benchmarks/common.py``): time, peak memory, ratios against the plain PyTorch
  formulation. Prints a table per module and writes JSON with ``--out``.
- ``backbone``: latency and peak memory against resolution, eager and compiled; ``--plot F.png``
  draws them against the number of tokens, ``plot RESULTS.json --out F.png`` redraws a saved run.
- ``precision``: backbone forward + backward in fp32 and bf16 autocast, against the matmul peak.
- ``solver``: the landmark-system solvers (Newton-Schulz, conjugate gradients, Cholesky).
- ``learning``: the real sets' configs of every backbone trained side by side (metric, speed, curves).
- ``learning-toy``: toy-set training curves of model variants, side by side.
- ``deploy``: per-image latency of the mmdeploy onnxruntime models against PyTorch, ours and baselines.
"""
import argparse
import sys

import torch

try:  # tools/dev/benchmarks: in a checkout, beside this script's folder (which Python puts on sys.path)
    from dev.benchmarks import backbones, deploy_latency, learning, learning_toy, plot, precision, solver
    from dev.benchmarks.common import environment, publish, run_module
except ModuleNotFoundError as err:
    if err.name not in ('dev', 'dev.benchmarks'):
        raise
    raise SystemExit('tools/benchmark.py runs from a checkout of mmlinattn: its cases live in '
                     'tools/dev/benchmarks/, which the installed package does not ship. Run '
                     '`python tools/benchmark.py ...` in the repository.') from err

OP_BENCHMARKS = [
    'dev.benchmarks.ops_laplacian',
    'dev.benchmarks.ops_polarity',
    'dev.benchmarks.ops_implementations',
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
    'precision': (precision.add_arguments, precision.main),  # fp32 / bf16, share of the matmul peak
    'solver': (solver.add_arguments, solver.main),  # landmark-system solvers: NS, CG, Cholesky
    'learning': (learning.add_arguments, learning.main),  # real sets, every backbone, side by side
    'learning-toy': (learning_toy.add_arguments, learning_toy.main),  # toy-set training curves
    'deploy': (deploy_latency.add_arguments, deploy_latency.main),  # mmdeploy's onnxruntime vs PyTorch
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
