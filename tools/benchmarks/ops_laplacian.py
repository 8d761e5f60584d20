"""Benchmark of the LaplacianFormer ops (see common.py for the module contract).

laplacian_kernel at LaplacianFormer-tiny stage-1 shapes (B=2, H=2, D=32): a 224^2 image (N = 56^2
queries, M = 49 landmarks) and a 512^2 image (N = 128^2, M = 256), forward and forward+backward,
the compiled op against ``exp(-torch.cdist(q, k, p=1) / lam)`` with autograd (which is also the
reference implementation). Throughput counts element-ops, one |q_ic - k_jc| accumulation each:
B*H*N*M*D per forward, 3x that per forward+backward (forward, dq and dk passes), against the
~55 G element-ops/s arithmetic limit of the 2-core CPU this project was developed on.

newton_schulz_inverse (20 steps) at M = 49 and 256, batch 64, against torch.linalg.inv and
torch.linalg.pinv of the same P = a + eps*I, and the pure-PyTorch reference iteration.
"""
from typing import Dict, List

import torch

from benchmarks.common import Case, Measurement, Section
from mmlinattn.ops import laplacian_kernel, newton_schulz_inverse
from mmlinattn.ops.reference import laplacian_kernel_reference, newton_schulz_inverse_reference

LAM = 4.0
EPS = 1e-2
CPU_LIMIT_GOPS = 55.0
KERNEL_SHAPES = {'224^2 (N=56^2, M=49)': (2, 2, 56 * 56, 49, 32),
                 '512^2 (N=128^2, M=256)': (2, 2, 128 * 128, 256, 32)}
NS_SIZES = (49, 256)
NS_BATCH = 64
KERNEL_IMPLS = {'compiled': laplacian_kernel,
                'cdist+exp': lambda q, k, lam: torch.exp(torch.cdist(q, k, p=1) * (-1.0 / lam))}
NS_IMPLS = {
    'compiled': lambda a: newton_schulz_inverse(a, iters=20, eps=EPS),
    'reference': lambda a: newton_schulz_inverse_reference(a, 20, EPS),
    'linalg.inv': lambda a: torch.linalg.inv(a + EPS * torch.eye(a.shape[-1], device=a.device)),
    'linalg.pinv': lambda a: torch.linalg.pinv(a + EPS * torch.eye(a.shape[-1], device=a.device)),
}


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


def _ns_case(m, impl, device):
    op = NS_IMPLS[impl]

    def build(size=m):
        a = _landmark_gram(size, device)
        return lambda: op(a)

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
        for impl in NS_IMPLS:
            build, warm = _ns_case(m, impl, device)
            out.append(Case(f'newton_schulz M={m} {impl}', build, warm))
    return out


def summarise(results: Dict[str, Measurement], device: str) -> Section:
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
            if device == 'cpu':
                row['% of 55G fwd'] = 100 * row['G elem-op/s fwd'] / CPU_LIMIT_GOPS
                row['% of 55G fwd+bwd'] = 100 * row['G elem-op/s fwd+bwd'] / CPU_LIMIT_GOPS
            if impl == 'compiled':
                base_fwd, base_both = get('cdist+exp', 'fwd'), get('cdist+exp', 'fwd+bwd')
                row['speed-up fwd'] = base_fwd.time_ms / fwd.time_ms
                row['speed-up fwd+bwd'] = base_both.time_ms / both.time_ms
                row['peak fwd+bwd / cdist'] = both.peak_mb / max(base_both.peak_mb, 1e-9)
            rows.append(row)
    for m in NS_SIZES:
        compiled = results[f'newton_schulz M={m} compiled']
        for impl in NS_IMPLS:
            res = results[f'newton_schulz M={m} {impl}']
            rows.append({
                'op': 'newton_schulz (20 steps)' if impl in ('compiled', 'reference') else impl,
                'shape': f'batch {NS_BATCH}, M={m}', 'impl': impl, 'fwd ms': res.time_ms,
                'peak fwd MiB': res.peak_mb,
                'speed-up fwd': res.time_ms / compiled.time_ms if impl != 'compiled' else None,
            })
    columns = ['op', 'shape', 'impl', 'fwd ms', 'fwd+bwd ms', 'peak fwd MiB', 'peak fwd+bwd MiB',
               'G elem-op/s fwd', 'G elem-op/s fwd+bwd']
    if device == 'cpu':
        columns += ['% of 55G fwd', '% of 55G fwd+bwd']
    columns += ['speed-up fwd', 'speed-up fwd+bwd', 'peak fwd+bwd / cdist']
    notes = [
        'speed-up = time of the other implementation / time of the compiled op; for Newton-Schulz '
        'rows it is that row\'s time / the compiled Newton-Schulz time (> 1: compiled is faster).',
        'element-op = one |q_ic - k_jc| accumulation; fwd+bwd counts 3 B*H*N*M*D.',
        'cdist+exp with autograd is also the reference implementation of laplacian_kernel.',
    ]
    return Section(f'LaplacianFormer ops on {device}', columns, rows, notes)
