"""Benchmark of each op's implementations side by side, the data that decides the CUDA defaults
(see common.py for the module contract).

Every implementation that runs on the device, forced with ``MMLINATTN_OPS`` (the Triton kernels,
the C++ kernels, the pure-PyTorch reference), and the PyTorch baselines (``cdist`` + ``exp``,
``torch.linalg.inv``; the polarity reference is the composition of the official code), forward
and forward+backward, fp32:

- laplacian_kernel at the shapes of the LaplacianFormer authors' kernel benchmark (queries of a
  224^2 stage 1, N = 56^2, against M = 16, 32, 64, 128 landmarks; B = 2, H = 2, D = 32) and at
  LaplacianFormer-T's stage-1 shape (M = 49);
- newton_schulz_inverse (at most 20 steps) at M = 16, 32, 64, 128 (the authors' kernel handles
  M <= 128; the Triton kernel M <= 64, so it has no M = 128 case) and at stage 1 (M = 49), batch
  64 Laplacian-kernel Gram matrices;
- polarity_linear_attention at Pola-PVT-T's stage-1 shape (224^2: N = n = 56^2, d = dv = 64).

The summary ends with the decision rule of ``dispatch.CUDA_DEFAULT``: per op, the total
forward+backward time of the Triton and the C++ kernels over the shapes both take; the C++
kernel becomes the op's default only where it is faster and ``python -m mmlinattn.ops.selftest
--device cuda`` passes it.
"""
from typing import Callable, Dict, List

import torch

from .common import Case, Measurement, Section
from mmlinattn.ops import (dispatch, laplacian_kernel, newton_schulz_inverse,
                           polarity_linear_attention)
from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference

LAM, EPS, NS_ITERS, NS_BATCH = 4.0, 1e-2, 20, 64
KERNELS = ('triton', 'compiled', 'reference')  # MMLINATTN_OPS modes
# op -> label -> shape
SHAPES: Dict[str, Dict[str, tuple]] = {
    'laplacian_kernel': {
        **{f'N=56^2, M={m}': (2, 2, 56 * 56, m, 32) for m in (16, 32, 64, 128)},
        'stage 1 224^2 (N=56^2, M=49)': (2, 2, 56 * 56, 49, 32)},
    'newton_schulz_inverse': {
        **{f'batch {NS_BATCH}, M={m}': (NS_BATCH, m) for m in (16, 32, 64, 128)},
        f'stage 1 (batch {NS_BATCH}, M=49)': (NS_BATCH, 49)},
    'polarity_linear_attention': {
        'stage 1 224^2 (B=2, N=n=56^2, d=dv=64)': (2, 1, 56 * 56, 64, 64)},
}
BASELINES: Dict[str, Dict[str, Callable]] = {
    'laplacian_kernel': {
        'cdist+exp': lambda q, k: torch.exp(torch.cdist(q, k, p=1) * (-1.0 / LAM))},
    'newton_schulz_inverse': {
        'linalg.inv': lambda a: torch.linalg.inv(a + EPS * torch.eye(a.shape[-1],
                                                                     device=a.device))},
    'polarity_linear_attention': {},  # its reference is the official code's composition
}
FORWARD_ONLY = {'linalg.inv'}
PUBLIC = {
    'laplacian_kernel': lambda q, k: laplacian_kernel(q, k, LAM),
    'newton_schulz_inverse': lambda a: newton_schulz_inverse(a, NS_ITERS, EPS),
    'polarity_linear_attention': polarity_linear_attention,
}


def _inputs(op: str, shape: tuple, device: str) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    if op == 'laplacian_kernel':
        b, h, n, m, d = shape
        return [(torch.randn(b, h, rows, d, generator=gen) * d**-0.5).to(device)
                for rows in (n, m)]
    if op == 'newton_schulz_inverse':
        batch, m = shape
        x = torch.randn(batch, 1, m, 32, generator=gen) / 32**0.5
        return [laplacian_kernel_reference(x, x, LAM)[:, 0].to(device)]
    b, h, n, d, dv = shape
    power = 1 + 4 * torch.sigmoid(torch.randn(h, d, generator=gen))
    return [torch.randn(b, h, n, d, generator=gen).to(device),
            torch.randn(b, h, n, d, generator=gen).to(device),
            torch.randn(b, h, n, dv, generator=gen).to(device), power.to(device)]


def _runner(op: str, impl: str) -> Callable:
    if impl not in KERNELS:
        return BASELINES[op][impl]

    def run(*inputs):
        with dispatch.forced(impl):
            return PUBLIC[op](*inputs)

    return run


def _case(op: str, shape: tuple, impl: str, backward: bool, device: str):
    run = _runner(op, impl)

    def build(size=shape):
        inputs = _inputs(op, size, device)
        if not backward:
            return lambda: run(*inputs)
        for t in inputs:
            t.requires_grad_()
        out = run(*inputs)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
        return lambda: torch.autograd.grad(run(*inputs), inputs, grad)

    tiny = {'laplacian_kernel': (1, 1, 8, 8, 4), 'newton_schulz_inverse': (2, 4),
            'polarity_linear_attention': (1, 1, 8, 4, 4)}[op]
    return build, lambda: build(tiny)


def implementations(op: str, device: str) -> List[str]:
    """The kernels that run on ``device`` and the op's baselines."""
    return ([k for k in KERNELS
             if dispatch.unavailable(k, op, torch.device(device).type, torch.float32) is None]
            + list(BASELINES[op]))


def takes(op: str, impl: str, shape: tuple) -> bool:
    """Whether ``impl`` takes ``shape``: the Triton kernel's ``max_size`` caps the matrix size."""
    kernel = dispatch.TRITON_KERNELS.get(op) if impl == 'triton' else None
    return kernel is None or kernel.takes_size(shape[-1])


def case_name(op: str, label: str, impl: str, phase: str) -> str:
    return f'{op} | {label} | {impl} | {phase}'


def cases(device: str) -> List[Case]:
    out = []
    for op, shapes in SHAPES.items():
        for impl in implementations(op, device):
            for label, shape in shapes.items():
                if not takes(op, impl, shape):
                    continue
                for backward in (False, ) if impl in FORWARD_ONLY else (False, True):
                    build, warm = _case(op, shape, impl, backward, device)
                    phase = 'fwd+bwd' if backward else 'fwd'
                    out.append(Case(case_name(op, label, impl, phase), build, warm))
    return out


def decision(results: Dict[str, Measurement], op: str) -> str:
    """The line that decides ``op``'s CUDA default from the fwd+bwd times measured at the shapes
    that both kernels take."""
    labels = [label for label, shape in SHAPES[op].items()
              if all(takes(op, kernel, shape) for kernel in ('triton', 'compiled'))]
    totals = {}
    for kernel in ('triton', 'compiled'):
        times = [results.get(case_name(op, label, kernel, 'fwd+bwd')) for label in labels]
        if all(times):
            totals[kernel] = sum(t.time_ms for t in times)
    default = dispatch.CUDA_DEFAULT[op]
    if len(totals) < 2:
        missing = [k for k in ('triton', 'compiled') if k not in totals]
        return (f'{op}: default {default}; not decided here ({", ".join(missing)} did not run on '
                'this device)')
    faster = min(totals, key=totals.get)
    verdict = ('keep' if faster == default else
               f'switch to {faster} if the self-test passes it (CUDA_DEFAULT in dispatch.py)')
    return (f'{op}: fwd+bwd over {len(labels)} shapes: triton {totals["triton"]:.2f} ms, '
            f'compiled {totals["compiled"]:.2f} ms; faster: {faster}; default {default}: '
            f'{verdict}')


def summarise(results: Dict[str, Measurement], device: str) -> Section:
    rows = []
    for op, shapes in SHAPES.items():
        impls = list(dict.fromkeys(name.split(' | ')[2] for name in results
                                   if name.startswith(op + ' | ')))
        for label in shapes:
            ref = {phase: results.get(case_name(op, label, 'reference', phase))
                   for phase in ('fwd', 'fwd+bwd')}
            for impl in impls:
                got = {phase: results.get(case_name(op, label, impl, phase))
                       for phase in ('fwd', 'fwd+bwd')}
                row = {'op': op, 'shape': label, 'impl': impl}
                for phase, res in got.items():
                    row[f'{phase} ms'] = res.time_ms if res else None
                    row[f'peak {phase} MiB'] = res.peak_mb if res else None
                    row[f'reference / this {phase}'] = (ref[phase].time_ms / res.time_ms
                                                        if res and ref[phase] else None)
                rows.append(row)
    columns = ['op', 'shape', 'impl', 'fwd ms', 'fwd+bwd ms', 'peak fwd MiB', 'peak fwd+bwd MiB',
               'reference / this fwd', 'reference / this fwd+bwd']
    notes = ['reference / this > 1: faster than the pure-PyTorch reference; fp32 inputs.',
             'Default rule (dispatch.CUDA_DEFAULT): the C++ CUDA kernels become an op\'s default '
             'only once a GPU run shows them correct (python -m mmlinattn.ops.selftest --device '
             'cuda) and faster; the measured winner becomes the default per op.']
    notes += ['decides: ' + decision(results, op) for op in SHAPES]
    return Section(f'Op implementations on {device} (Triton, C++, reference, PyTorch baselines)',
                   columns, rows, notes)
