"""Solver benchmark: ``python tools/benchmark.py solver [--out F.json] [--plot F.png]``.

LaplacianFormer's landmark system ``P x = b`` with ``P = K(q~, q~) + eps*I`` [M, M] (SPD) and
``b = C^T [v, 1]``, solved three ways, as the attention's ``inverse`` option does:

- Newton–Schulz (the paper): ``V_0 = I / ||P||_inf``, ``V <- 2V - V P V``; reported: the residual
  ``||I - P V_k||_F / sqrt(M)`` after k steps (and, to compare like with like, the relative solve
  residual of ``x = V_k b``);
- conjugate gradients from ``x_0 = 0``, each column of b its own system; reported: the relative
  residual ``||b - P x_k|| / ||b||`` after k steps;
- a Cholesky solve, the reference point (one time, one residual).

The systems: synthetic ones, ``P = Q diag(lambda) Q^T`` with random orthogonal Q and eigenvalues
log-spaced from 1 to ``1 / cond`` (``--conditions``, 10 .. 1e6; eps = 0, b random normal); and the
ones a forward pass of LaplacianFormer-T produces (``--config``, random weights or
``--checkpoint``, a seeded random input or ``--img``): per Nyström stage, every layer's and head's
landmark Gram matrix with the layer's own eps and right-hand side, under the layer's kernel and,
for the Laplacian kernel, the other bandwidths of ``--lams`` (the same landmarks). The solvers run
in fp32 as in the model (the Newton–Schulz op, :func:`conjugate_gradient_solve`,
:func:`cholesky_solve_spd`); residuals are evaluated in fp64. Residuals are medians over the
matrices (and columns); time is the median of ``--repeats`` calls with k steps, in ms for the
whole batch. A PNG shows residual against iterations and against wall time.
"""
import argparse
import dataclasses
import functools
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .common import REPO_ROOT, Section, environment, publish

DEFAULT_CONFIG = os.path.join(REPO_ROOT, 'configs', 'laplacianformer_tiny_8xb128_in1k.py')
THRESHOLD = 1e-3  # the residual the "steps to" columns count up to


@dataclasses.dataclass
class SolverCase:
    name: str
    kind: str  # 'synthetic' | 'model'
    gram: torch.Tensor  # [B, M, M] fp32, without the shift
    rhs: torch.Tensor  # [B, M, k] fp32
    shift: float  # eps: the system is gram + shift * I

    def system(self) -> torch.Tensor:
        """``P = gram + shift*I`` in fp64."""
        eye = torch.eye(self.gram.shape[-1], dtype=torch.float64)
        return self.gram.double() + self.shift * eye

    def conditions(self) -> torch.Tensor:
        eig = torch.linalg.eigvalsh(self.system())
        return eig[:, -1] / eig[:, 0]


def synthetic_case(condition: float, size: int, batch: int, rhs_columns: int, seed: int) -> SolverCase:
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(batch, size, size, generator=gen, dtype=torch.float64))
    eigenvalues = torch.logspace(0, -torch.log10(torch.tensor(condition)).item(), size,
                                 dtype=torch.float64)
    gram = (basis * eigenvalues) @ basis.mT
    rhs = torch.randn(batch, size, rhs_columns, generator=gen, dtype=torch.float64)
    return SolverCase(f'synthetic cond {condition:.0e}', 'synthetic', gram.float(), rhs.float(), 0.0)


def model_cases(config: str, checkpoint: Optional[str], img: Optional[str], img_size: int,
                lams: Sequence[float], seed: int) -> List[SolverCase]:
    """Per Nyström stage and bandwidth: the landmark systems of every layer and head."""
    from analysis import record_attentions
    from analysis.model_loading import build_backbone, load_config, load_image, normalisation
    from mmlinattn.models.layers.laplacian_attention import landmark_gram
    from mmlinattn.ops import laplacian_kernel

    cfg = load_config(config)
    torch.manual_seed(seed)
    backbone = build_backbone(cfg, checkpoint)
    if img is None:
        image = torch.randn(1, 3, img_size, img_size, generator=torch.Generator().manual_seed(seed))
    else:
        image = load_image(img, (img_size, img_size), *normalisation(cfg))[1]
    by_stage: Dict[str, List[torch.Tensor]] = {}
    rhs_by_stage: Dict[str, List[torch.Tensor]] = {}
    shifts: Dict[str, float] = {}
    for record in record_attentions(backbone, image):
        module = record.module
        with torch.no_grad():
            q, landmarks, v = module.attention_inputs(record.x, record.hw_shape)
        if landmarks is None:  # exact attention: no landmark system
            continue
        kernels: Dict[str, Callable] = {f'{module.kernel} (model)': module.kernel_matrix}
        if module.kernel == 'laplacian':
            kernels = {f'lam {lam:g}' + (' (model)' if lam == module.lam else ''):
                       (module.kernel_matrix if lam == module.lam else
                        functools.partial(laplacian_kernel, lam=lam)) for lam in lams}
        for label, kernel in kernels.items():
            key = f'stage {record.stage + 1}, {label}'
            with torch.no_grad():
                gram = landmark_gram(landmarks, kernel)  # [B, h, m, m]
                cross = kernel(q.float(), landmarks.float())  # [B, h, N, m]
                values = torch.cat([v.float(), torch.ones_like(v[..., :1]).float()], dim=-1)
                rhs = cross.transpose(-2, -1) @ values  # C^T [v, 1]
            by_stage.setdefault(key, []).append(gram.flatten(0, 1))
            rhs_by_stage.setdefault(key, []).append(rhs.flatten(0, 1))
            shifts[key] = module.landmark_shift
    return [SolverCase(f'LaplacianFormer-T {key}', 'model', torch.cat(by_stage[key]),
                       torch.cat(rhs_by_stage[key]), shifts[key]) for key in by_stage]


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _relative_residual(system: torch.Tensor, rhs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``||b - P x|| / ||b||`` per column, fp64: [B, M, M], [B, M, k], [B, M, k] -> [B * k]."""
    rhs = rhs.double()
    return ((rhs - system @ x.double()).norm(dim=-2) / rhs.norm(dim=-2)).flatten()


def measure(case: SolverCase, max_iters: int, repeats: int) -> dict:
    from mmlinattn.models.layers.laplacian_attention import (cholesky_solve_spd,
                                                             conjugate_gradient_solve)
    from mmlinattn.ops import newton_schulz_inverse
    system = case.system()
    eye = torch.eye(system.shape[-1], dtype=torch.float64)
    size = system.shape[-1]
    curves = {name: [] for name in ('ns_residual', 'ns_solve_residual', 'ns_ms', 'cg_residual', 'cg_ms')}
    with torch.no_grad():
        for k in range(1, max_iters + 1):
            def ns_solve(k=k):
                inverse = newton_schulz_inverse(case.gram, iters=k, eps=case.shift)
                return inverse, inverse @ case.rhs

            def cg_solve(k=k):
                return conjugate_gradient_solve(case.gram, case.rhs, k, case.shift)

            inverse, ns_x = ns_solve()
            residual = torch.linalg.matrix_norm(eye - system @ inverse.double()) / size**0.5
            curves['ns_residual'].append(residual.median().item())
            curves['ns_solve_residual'].append(_relative_residual(system, case.rhs, ns_x).median().item())
            curves['ns_ms'].append(_median_ms(ns_solve, repeats))
            curves['cg_residual'].append(
                _relative_residual(system, case.rhs, cg_solve()).median().item())
            curves['cg_ms'].append(_median_ms(cg_solve, repeats))
        cholesky = lambda: cholesky_solve_spd(case.gram, case.rhs, case.shift)  # noqa: E731
        cholesky_residual = _relative_residual(system, case.rhs, cholesky()).median().item()
        cholesky_ms = _median_ms(cholesky, repeats)
    conditions = case.conditions()
    return dict(name=case.name, kind=case.kind, size=size, batch=case.gram.shape[0],
                rhs_columns=case.rhs.shape[-1], shift=case.shift,
                condition_median=conditions.median().item(), condition_max=conditions.max().item(),
                iters=list(range(1, max_iters + 1)), **curves, cholesky_residual=cholesky_residual,
                cholesky_ms=cholesky_ms)


def _steps_to(values: Sequence[float], threshold: float = THRESHOLD):
    return next((k for k, value in enumerate(values, 1) if value <= threshold), None)


def summarise(results: List[dict], max_iters: int) -> Section:
    rows = []
    for r in results:
        rows.append({
            'system': r['name'], 'M': r['size'], 'matrices': r['batch'],
            'cond (median)': r['condition_median'], 'cond (max)': r['condition_max'],
            f'NS steps to {THRESHOLD:g}': _steps_to(r['ns_residual']),
            f'NS residual @{max_iters}': r['ns_residual'][-1], 'NS best': min(r['ns_residual']),
            f'NS solve res @{max_iters}': r['ns_solve_residual'][-1],
            f'CG steps to {THRESHOLD:g}': _steps_to(r['cg_residual']),
            f'CG residual @{max_iters}': r['cg_residual'][-1], 'CG best': min(r['cg_residual']),
            f'NS ms @{max_iters}': r['ns_ms'][-1], f'CG ms @{max_iters}': r['cg_ms'][-1],
            'Cholesky res': r['cholesky_residual'], 'Cholesky ms': r['cholesky_ms'],
        })
    notes = [f'NS residual = median ||I - P V_k||_F / sqrt(M); NS solve res and CG residual = median '
             f'||b - P x_k|| / ||b|| over matrices and columns; "steps to {THRESHOLD:g}": the first k '
             'with that median residual ("-": not within the run); "best": the smallest over the '
             'steps; fp32 solvers, fp64 residuals; ms for the whole batch (median of --repeats '
             'calls). Synthetic systems: eps = 0; model systems: the layer\'s eps (1e-2).']
    return Section('Landmark solvers', list(rows[0]) if rows else [], rows, notes)


def plot(results: List[dict], path: str, title: str) -> None:
    """Residual against iterations and against wall time, one row per kind of system. The time
    axis uses the running maximum of the measured times (k + 1 steps cannot take less than k;
    the measured medians jitter by a few percent on a shared machine)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np
    kinds = [kind for kind in ('synthetic', 'model') if any(r['kind'] == kind for r in results)]
    fig, axes = plt.subplots(len(kinds), 2, figsize=(13, 5.2 * len(kinds)), squeeze=False)
    for row, kind in enumerate(kinds):
        cases = [r for r in results if r['kind'] == kind]
        cmap = plt.get_cmap('viridis' if kind == 'synthetic' else 'tab10')
        colours = [cmap(i / max(len(cases) - 1, 1) if kind == 'synthetic' else i % 10)
                   for i in range(len(cases))]
        for col, x_key in enumerate(('iters', 'ms')):
            ax = axes[row][col]
            for r, colour in zip(cases, colours):
                label = f'{r["name"]} (cond {r["condition_median"]:.1e})'
                ns_x = r['iters'] if x_key == 'iters' else np.maximum.accumulate(r['ns_ms'])
                cg_x = r['iters'] if x_key == 'iters' else np.maximum.accumulate(r['cg_ms'])
                ax.plot(ns_x, r['ns_residual'], '-', color=colour, label=label)
                ax.plot(cg_x, r['cg_residual'], '--', color=colour)
            ax.set_yscale('log')
            if x_key == 'ms':
                ax.set_xscale('log')
            ax.set_xlabel('iterations' if x_key == 'iters' else 'wall time for the batch (ms)')
            ax.set_ylabel('NS (solid): ||I-PV||_F/sqrt(M);  CG (dashed): ||b-Px||/||b||', fontsize=8)
            ax.set_title(f'{kind} systems: residual against '
                         f'{"iterations" if x_key == "iters" else "wall time"}', fontsize=9)
            ax.grid(True, which='both', linewidth=0.3, alpha=0.5)
        axes[row][1].legend(fontsize=6, loc='upper left', bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches='tight')
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--conditions', type=float, nargs='*', default=[1e1, 1e2, 1e3, 1e4, 1e5, 1e6],
                        help='condition numbers of the synthetic systems (none: skip them)')
    parser.add_argument('--size', type=int, default=49, help='M of the synthetic systems (49: 7x7)')
    parser.add_argument('--batch', type=int, default=32, help='synthetic systems per condition number')
    parser.add_argument('--rhs-columns', type=int, default=33,
                        help='right-hand sides per synthetic system (33: [v, 1] of a 32-dim head)')
    parser.add_argument('--config', default=DEFAULT_CONFIG,
                        help='the LaplacianFormer config of the model systems (none: skip them)')
    parser.add_argument('--checkpoint', help='weights for the model (default: random initialisation)')
    parser.add_argument('--img', help='input image (default: a seeded random tensor)')
    parser.add_argument('--img-size', type=int, default=224)
    parser.add_argument('--lams', type=float, nargs='+', default=[1.0, 4.0, 16.0],
                        help='Laplacian bandwidths of the model systems (same landmarks)')
    parser.add_argument('--max-iters', type=int, default=50)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, help='torch CPU threads (default: torch\'s)')
    parser.add_argument('--smoke', action='store_true',
                        help='a seconds-long run: M=12, 2 conditions, 4 steps, 64^2 model input')
    parser.add_argument('--out', help='write the results as JSON to this file')
    parser.add_argument('--plot', metavar='FILE.png', help='draw residual against iterations and time')


def main(args: argparse.Namespace) -> int:
    if args.smoke:
        args.conditions, args.size, args.batch, args.rhs_columns = [1e1, 1e3], 12, 4, 3
        args.max_iters, args.repeats, args.img_size, args.lams = 4, 1, 64, [4.0]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.max_iters < 1:
        print('--max-iters must be at least 1', file=sys.stderr)
        return 2
    meta = dict(environment(), device='cpu', max_iters=args.max_iters, repeats=args.repeats,
                seed=args.seed, checkpoint=args.checkpoint, img=args.img, img_size=args.img_size)
    print('# solver benchmark: ' + ', '.join(f'{k}={v}' for k, v in meta.items()))
    cases = [synthetic_case(c, args.size, args.batch, args.rhs_columns, args.seed + i)
             for i, c in enumerate(args.conditions)]
    if args.config and args.config != 'none':
        cases += model_cases(args.config, args.checkpoint, args.img, args.img_size, args.lams,
                             args.seed)
    results = []
    for case in cases:
        results.append(measure(case, args.max_iters, args.repeats))
        print(f'  {case.name}: {tuple(case.gram.shape)}, NS residual {results[-1]["ns_residual"][-1]:.2e}, '
              f'CG residual {results[-1]["cg_residual"][-1]:.2e}')
    section = summarise(results, args.max_iters)
    publish([section], args.out, dict(meta, results=results))
    if args.plot:
        weights = 'checkpoint' if args.checkpoint else 'random weights'
        plot(results, args.plot, f'Landmark solvers, fp32 (model systems: LaplacianFormer-T, '
             f'{weights}, {args.img_size}^2 input; torch threads {torch.get_num_threads()})')
        print(f'figure written to {args.plot}')
    return 0
