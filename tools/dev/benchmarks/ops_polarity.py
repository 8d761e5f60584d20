"""Benchmark of polarity_linear_attention (see common.py for the module contract).

The fused op against the PyTorch composition of the official code (relu, power, the three [.., 2d]
concatenations, mean, two matmul chains; ``polarity_linear_attention_reference``, autograd for
the backward), forward and forward+backward, at Pola-PVT-T stage-1 shapes: dim 64, one head
(d = dv = 64), no spatial reduction, so N = n = (H/4)*(W/4) tokens; B = 2 images of 224^2
(N = 56^2) and 512^2 (N = 128^2). Powers p = 1 + 4 sigmoid(theta), theta ~ N(0, 1).
"""
from typing import Dict, List

import torch

from .common import Case, Measurement, Section
from mmlinattn.ops import polarity_linear_attention
from mmlinattn.ops.dispatch import choose, forced
from mmlinattn.ops.polarity_attention.reference import polarity_linear_attention_reference

# label -> (B, heads, N = n, head dim d, value dim dv)
SHAPES = {'224^2 (B=2, N=n=56^2, d=dv=64)': (2, 1, 56 * 56, 64, 64),
          '512^2 (B=2, N=n=128^2, d=dv=64)': (2, 1, 128 * 128, 64, 64)}


def _compiled(*args):
    with forced('compiled'):
        return polarity_linear_attention(*args)


IMPLS = {'fused': _compiled, 'composition': polarity_linear_attention_reference}


def _case(shape, impl, backward, device):
    op = IMPLS[impl]

    def build(size=shape):
        b, h, n, d, dv = size
        gen = torch.Generator().manual_seed(0)
        q, k = (torch.randn(b, h, n, d, generator=gen).to(device) for _ in range(2))
        v = torch.randn(b, h, n, dv, generator=gen).to(device)
        power = (1 + 4 * torch.sigmoid(torch.randn(h, d, generator=gen))).to(device)
        if impl == 'fused':
            with forced('compiled'):  # raises with the reason when the C++ kernel cannot run
                choose('polarity_linear_attention', q.device.type, q.dtype)
        inputs = (q, k, v, power)
        if not backward:
            return lambda: op(*inputs)
        for t in inputs:
            t.requires_grad_()
        grad = torch.randn(b, h, n, dv, generator=gen).to(device)
        return lambda: torch.autograd.grad(op(*inputs), inputs, grad)

    return build, lambda: build((1, 1, 8, 4, 4))


def cases(device: str) -> List[Case]:
    out = []
    for label, shape in SHAPES.items():
        for impl in IMPLS:
            for backward in (False, True):
                build, warm = _case(shape, impl, backward, device)
                phase = 'fwd+bwd' if backward else 'fwd'
                out.append(Case(f'polarity {label} {impl} {phase}', build, warm))
    return out


def summarise(results: Dict[str, Measurement], device: str) -> Section:
    rows = []
    for label in SHAPES:
        get = lambda impl, phase: results[f'polarity {label} {impl} {phase}']
        base_fwd, base_both = get('composition', 'fwd'), get('composition', 'fwd+bwd')
        for impl in IMPLS:
            fwd, both = get(impl, 'fwd'), get(impl, 'fwd+bwd')
            rows.append({
                'shape': label, 'impl': impl,
                'fwd ms': fwd.time_ms, 'fwd+bwd ms': both.time_ms,
                'peak fwd MiB': fwd.peak_mb, 'peak fwd+bwd MiB': both.peak_mb,
                'speed-up fwd': base_fwd.time_ms / fwd.time_ms,
                'speed-up fwd+bwd': base_both.time_ms / both.time_ms,
                'peak / composition fwd': fwd.peak_mb / max(base_fwd.peak_mb, 1e-9),
                'peak / composition fwd+bwd': both.peak_mb / max(base_both.peak_mb, 1e-9),
            })
    columns = ['shape', 'impl', 'fwd ms', 'fwd+bwd ms', 'peak fwd MiB', 'peak fwd+bwd MiB',
               'speed-up fwd', 'speed-up fwd+bwd', 'peak / composition fwd',
               'peak / composition fwd+bwd']
    notes = [
        'speed-up = composition time / this row\'s time (> 1: faster than the composition); '
        'peak / composition < 0.5 meets the "at most half the memory" goal.',
        'fwd+bwd = forward, then autograd.grad for q, k, v and the power, with a random dL/dout.',
        'The composition (relu, pow, cat, matmul with autograd) is also the reference '
        'implementation and the fallback when the extension is not built.',
    ]
    return Section(f'polarity_linear_attention on {device} (Pola-PVT-T stage 1)', columns, rows,
                   notes)
