"""Benchmark of the LaplacianFormer ops (see common.py for the module contract).

laplacian_kernel at LaplacianFormer-tiny stage-1 shapes (B=2, H=2, D=32): a 224^2 image (N = 56^2
queries, M = 49 landmarks) and a 512^2 image (N = 128^2, M = 256), forward and forward+backward,
the compiled op against ``exp(-torch.cdist(q, k, p=1) / lam)`` with autograd (which is also the
reference implementation). Throughput counts element-ops, one |q_ic - k_jc| term each:
B*H*N*M*D per forward, 3x that per forward+backward (the forward, dq and dk terms).

The CPU's limit for the kernel is measured, not assumed: ``cpu_limit.cpp`` (built with
``g++ -O3 -march=native -fopenmp`` and run on all threads) times the inner loops of the AVX-512
kernels on data that stays in L1, without output, exp or tails. Its forward rate is the limit of
the forward; the forward+backward limit is ``3 / (1/forward + 2/backward)`` element-ops per second.
Without g++ or AVX-512 the limit columns stay empty.

newton_schulz_inverse (at most 20 steps) at M = 49 and 256, batch 64: forward against
torch.linalg.inv and torch.linalg.pinv of the same P = a + eps*I, and forward+backward against the
pure-PyTorch reference iteration (autograd through its steps, the gradient both compute). Its
bound: the least flops of the steps the op takes on these matrices (:func:`newton_schulz_flops`:
each product step ``V + V R`` and ``R R`` as symmetric halves, M^3 flops each, the first ``V``
free; the closing ``2V - (V P) V`` 3 M^3), timed against the FMA peak that ``cpu_limit.cpp`` also
measures.
"""
import json
import os
import shutil
import subprocess
import tempfile
from typing import Dict, List, Optional

import torch

from .common import Case, Measurement, Section
from mmlinattn.ops import dispatch, laplacian_kernel, newton_schulz_inverse
from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference
from mmlinattn.ops.newton_schulz.reference import newton_schulz_inverse_reference

LAM = 4.0
EPS = 1e-2
KERNEL_SHAPES = {'224^2 (N=56^2, M=49)': (2, 2, 56 * 56, 49, 32),
                 '512^2 (N=128^2, M=256)': (2, 2, 128 * 128, 256, 32)}
NS_SIZES = (49, 256)
NS_BATCH = 64
NS_ITERS = 20


def _compiled(op):
    """``op`` under MMLINATTN_OPS=compiled: the C++ kernel, or an error saying why it cannot run."""

    def run(*args, **kwargs):
        with dispatch.forced('compiled'):
            return op(*args, **kwargs)

    return run


KERNEL_IMPLS = {'compiled': _compiled(laplacian_kernel),
                'cdist+exp': lambda q, k, lam: torch.exp(torch.cdist(q, k, p=1) * (-1.0 / lam))}
NS_FORWARD = {
    'compiled': _compiled(lambda a: newton_schulz_inverse(a, iters=NS_ITERS, eps=EPS)),
    'reference': lambda a: newton_schulz_inverse_reference(a, NS_ITERS, EPS),
    'linalg.inv': lambda a: torch.linalg.inv(a + EPS * torch.eye(a.shape[-1], device=a.device)),
    'linalg.pinv': lambda a: torch.linalg.pinv(a + EPS * torch.eye(a.shape[-1], device=a.device)),
}
NS_BACKWARD = ('compiled', 'reference')
LIMIT_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'cpu_limit.cpp')


def _kernel_case(shape, impl, backward, device):
    op = KERNEL_IMPLS[impl]

    def build(size=shape):
        b, h, n, m, d = size
        gen = torch.Generator().manual_seed(0)
        q = (torch.randn(b, h, n, d, generator=gen) * d**-0.5).to(device)
        k = (torch.randn(b, h, m, d, generator=gen) * d**-0.5).to(device)
        if not backward:
            return lambda: op(q, k, LAM)
        q.requires_grad_()
        k.requires_grad_()
        grad = torch.randn(b, h, n, m, generator=gen).to(device)
        return lambda: torch.autograd.grad(op(q, k, LAM), (q, k), grad)

    return build, lambda: build((1, 1, 8, 8, 4))


def _landmark_gram(m, device):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(NS_BATCH, 1, m, 32, generator=gen) / 32**0.5
    return laplacian_kernel_reference(x, x, LAM)[:, 0].to(device)


def _ns_case(m, impl, backward, device):
    op = NS_FORWARD[impl]

    def build(size=m):
        a = _landmark_gram(size, device)
        if not backward:
            return lambda: op(a)
        a.requires_grad_()
        grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(1)).to(device)
        return lambda: torch.autograd.grad(op(a), a, grad)

    return build, lambda: build(4)


def cases(device: str) -> List[Case]:
    out = []
    for label, shape in KERNEL_SHAPES.items():
        for impl in KERNEL_IMPLS:
            for backward in (False, True):
                build, warm = _kernel_case(shape, impl, backward, device)
                phase = 'fwd+bwd' if backward else 'fwd'
                out.append(Case(f'laplacian {label} {impl} {phase}', build, warm))
    for m in NS_SIZES:
        for impl in NS_FORWARD:
            for backward in (False, True) if impl in NS_BACKWARD else (False, ):
                build, warm = _ns_case(m, impl, backward, device)
                phase = 'fwd+bwd' if backward else 'fwd'
                out.append(Case(f'newton_schulz M={m} {impl} {phase}', build, warm))
    return out


def measured_cpu_limit() -> Optional[Dict[str, float]]:
    """G element-ops/s of the kernels' inner loops on all threads (see the module docstring)."""
    compiler = shutil.which('g++')
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        binary = os.path.join(tmp, 'cpu_limit')
        subprocess.run([compiler, '-O3', '-march=native', '-fopenmp', LIMIT_SOURCE, '-o', binary],
                       check=True, capture_output=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
        result = json.loads(subprocess.run([binary], check=True, capture_output=True, text=True,
                                           env=env).stdout)
    if 'error' in result:
        return None
    forward, backward = result['forward'] / 1e9, result['backward'] / 1e9
    return {'fwd': forward, 'bwd': backward, 'fwd+bwd': 3 / (1 / forward + 2 / backward),
            'fma GFLOP/s': result['fma_flops'] / 1e9, 'threads': result['threads']}


def newton_schulz_product_steps(a: torch.Tensor) -> torch.Tensor:
    """The product steps k [batch] that newton_schulz_inverse(a, NS_ITERS, EPS) takes in fp32: the
    stop rule of docs/ops/newton_schulz.md (||R_t||_inf <= u), counted with torch's products, so
    a count may differ by one where the kernel's rounding of R_t falls on the other side of u."""
    p = a.float() + EPS * torch.eye(a.shape[-1])
    r = torch.eye(a.shape[-1]) - p / p.abs().sum(-1).amax(-1)[:, None, None]
    running = torch.ones(a.shape[0], dtype=torch.bool)
    steps = torch.zeros(a.shape[0], dtype=torch.int64)
    for _ in range(NS_ITERS - 1):
        running &= ~(r.abs().sum(-1).amax(-1) <= torch.finfo(torch.float32).eps / 2)
        steps += running
        r = r @ r
    return steps


def newton_schulz_flops(m: int, k: torch.Tensor) -> float:
    """The least fp32 flops of newton_schulz_inverse on a batch of symmetric M x M matrices that
    take k [batch] product steps: per matrix, k product steps (R R, M^3 flops as a half, except in
    a last step at NS_ITERS - 1; V + V R, M^3, except the first), then the closing
    2V - (V P) V, 3 M^3."""
    squarings = k.clamp(max=NS_ITERS - 2)
    v_products = (k - 1).clamp(min=0)
    return float((squarings + v_products + 3).sum()) * m**3


def summarise(results: Dict[str, Measurement], device: str) -> Section:
    limit = measured_cpu_limit() if device == 'cpu' else None
    ns_steps = ({m: newton_schulz_product_steps(_landmark_gram(m, 'cpu')) for m in NS_SIZES}
                if limit else {})
    rows = []
    for label, (b, h, n, m, d) in KERNEL_SHAPES.items():
        elem_ops = b * h * n * m * d
        get = lambda impl, phase: results[f'laplacian {label} {impl} {phase}']
        for impl in KERNEL_IMPLS:
            fwd, both = get(impl, 'fwd'), get(impl, 'fwd+bwd')
            row = {
                'op': 'laplacian_kernel', 'shape': label, 'impl': impl,
                'fwd ms': fwd.time_ms, 'fwd+bwd ms': both.time_ms,
                'peak fwd MiB': fwd.peak_mb, 'peak fwd+bwd MiB': both.peak_mb,
                'G elem-op/s fwd': elem_ops / fwd.time_ms / 1e6,
                'G elem-op/s fwd+bwd': 3 * elem_ops / both.time_ms / 1e6,
            }
            if limit:
                row['% of limit fwd'] = 100 * row['G elem-op/s fwd'] / limit['fwd']
                row['% of limit fwd+bwd'] = 100 * row['G elem-op/s fwd+bwd'] / limit['fwd+bwd']
            if impl == 'compiled':
                base_fwd, base_both = get('cdist+exp', 'fwd'), get('cdist+exp', 'fwd+bwd')
                row['speed-up fwd'] = base_fwd.time_ms / fwd.time_ms
                row['speed-up fwd+bwd'] = base_both.time_ms / both.time_ms
                row['peak fwd+bwd / cdist'] = both.peak_mb / max(base_both.peak_mb, 1e-9)
            rows.append(row)
    for m in NS_SIZES:
        compiled = results[f'newton_schulz M={m} compiled fwd']
        compiled_both = results[f'newton_schulz M={m} compiled fwd+bwd']
        for impl in NS_FORWARD:
            res = results[f'newton_schulz M={m} {impl} fwd']
            both = results.get(f'newton_schulz M={m} {impl} fwd+bwd')
            bound = {}
            if limit and impl == 'compiled':
                bound_ms = newton_schulz_flops(m, ns_steps[m]) / limit['fma GFLOP/s'] / 1e6
                bound = {'bound fwd ms': bound_ms, '% of limit fwd': 100 * bound_ms / res.time_ms}
            rows.append({**bound,
                'op': f'newton_schulz (<= {NS_ITERS} steps)' if impl in NS_BACKWARD else impl,
                'shape': f'batch {NS_BATCH}, M={m}', 'impl': impl, 'fwd ms': res.time_ms,
                'fwd+bwd ms': both.time_ms if both else None, 'peak fwd MiB': res.peak_mb,
                'peak fwd+bwd MiB': both.peak_mb if both else None,
                'speed-up fwd': res.time_ms / compiled.time_ms if impl != 'compiled' else None,
                'speed-up fwd+bwd': (both.time_ms / compiled_both.time_ms
                                     if both and impl != 'compiled' else None),
            })
    columns = ['op', 'shape', 'impl', 'fwd ms', 'fwd+bwd ms', 'peak fwd MiB', 'peak fwd+bwd MiB',
               'G elem-op/s fwd', 'G elem-op/s fwd+bwd']
    if limit:
        columns += ['% of limit fwd', '% of limit fwd+bwd']
        columns += ['bound fwd ms']
    columns += ['speed-up fwd', 'speed-up fwd+bwd', 'peak fwd+bwd / cdist']
    notes = [
        'speed-up = time of the other implementation / time of the compiled op; for Newton-Schulz '
        'rows it is that row\'s time / the compiled Newton-Schulz time (> 1: compiled is faster).',
        'element-op = one |q_ic - k_jc| term; fwd+bwd counts 3 B*H*N*M*D.',
        'cdist+exp with autograd is also the reference implementation of laplacian_kernel.',
    ]
    if limit:
        notes.append(f'CPU limit (cpu_limit.cpp, {limit["threads"]} threads): forward '
                     f'{limit["fwd"]:.1f}, backward {limit["bwd"]:.1f}, forward+backward '
                     f'{limit["fwd+bwd"]:.1f} G element-ops/s; FMA peak '
                     f'{limit["fma GFLOP/s"]:.0f} GFLOP/s.')
        notes.append('Newton-Schulz bound = the flops of the steps taken (product steps: '
                     + ', '.join(f'{k.float().mean().item():.1f} on average at M={m}'
                                 for m, k in ns_steps.items())
                     + f', of {NS_ITERS - 1} allowed; 2 M^3 each as symmetric halves, then 3 M^3 '
                     f'for the closing step) x batch {NS_BATCH} at the FMA peak; its % of limit = '
                     'bound / measured time.')
    return Section(f'LaplacianFormer ops on {device}', columns, rows, notes)
