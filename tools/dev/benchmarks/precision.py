"""Precision benchmark: ``python tools/benchmark.py precision [--sizes ...] [--models ...]``.

Backbone forward + backward (train mode, the gradients of every parameter from the sum of the
outputs' means) in fp32 and under ``torch.autocast(device, dtype=torch.bfloat16)``, each
backbone in its faster memory format (the image and the weights contiguous or channels-last,
both measured, per precision), random weights, no drop-path.

- time: median of ``--repeats`` calls after one warm-up call of the same case;
- GFLOP: the matmul and convolution FLOPs of one forward + backward
  (``torch.utils.flop_counter.FlopCounterMode``; the element-wise work and the custom ops'
  kernels are not counted), so ``GFLOP/s`` and ``% of peak`` say how much of the time is spent
  on the matrix units' kind of work at their pace;
- peak: the bf16 (and fp32) GFLOP/s of one ``[4096, 1024] @ [1024, 1024]`` matmul, measured at the
  start of the same run;
- ``vs Swin-T``: Swin-T's time / this backbone's time in the same precision (> 1: faster).
"""
import argparse
import os
import sys
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import backbones
from .common import Section, environment, publish, time_call

# name -> (height, width, batch)
SIZES: Dict[str, Tuple[int, int, int]] = {'256^2 x2': (256, 256, 2), '512^2': (512, 512, 1),
                                          '800x1344': (800, 1344, 1)}
PRECISIONS = ('fp32', 'bf16')
FORMATS = {'contiguous': torch.contiguous_format, 'channels_last': torch.channels_last}
REFERENCE = 'Swin-T (mmdet)'


def resnet50() -> nn.Module:
    from mmdet.models.backbones import ResNet
    return ResNet(depth=50)


BACKBONES: Dict[str, Callable[[], nn.Module]] = {
    **{name: factory for name, factory in backbones.BACKBONES.items() if 'paper-literal' not in name},
    'ResNet-50 (mmdet)': resnet50,
}


def training_step(model_name: str, size: Tuple[int, int, int], precision: str, memory_format: str,
                  device: str) -> Callable[[], object]:
    """The timed call: one forward + backward of a fresh model on a random input."""
    torch.manual_seed(0)
    height, width, batch = size
    model = BACKBONES[model_name]().to(device, memory_format=FORMATS[memory_format])
    model.train()  # mmdet's Swin returns None from train()
    images = torch.randn(batch, 3, height, width, device=device)
    images = images.contiguous(memory_format=FORMATS[memory_format])
    params = [p for p in model.parameters() if p.requires_grad]

    def forward_backward():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == 'bf16'):
            outs = model(images)
        loss = sum(out.float().mean() for out in outs)
        return torch.autograd.grad(loss, params, allow_unused=True)

    return forward_backward


def matmul_peak_gflops(device: str, dtype: torch.dtype, repeats: int = 10) -> float:
    """GFLOP/s of ``[4096, 1024] @ [1024, 1024]`` in ``dtype``."""
    a = torch.randn(4096, 1024, device=device, dtype=dtype)
    b = torch.randn(1024, 1024, device=device, dtype=dtype)
    ms = time_call(lambda: a @ b, device, repeats)
    return 2 * 4096 * 1024 * 1024 / ms / 1e6


def counted_gflop(fn: Callable[[], object]) -> float:
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops() / 1e9


def measure(model_name: str, size_name: str, device: str, repeats: int,
            log=print) -> Dict[str, object]:
    """Both precisions in both memory formats; per precision the faster format is kept."""
    size = SIZES[size_name]
    row: Dict[str, object] = {'backbone': model_name, 'input': size_name}
    for precision in PRECISIONS:
        best: Optional[Tuple[float, str]] = None
        for memory_format in FORMATS:
            fn = training_step(model_name, size, precision, memory_format, device)
            ms = time_call(fn, device, repeats)
            log(f'  {model_name} | {size_name} | {precision} {memory_format}: {ms:.1f} ms',
                flush=True)
            if best is None or ms < best[0]:
                best = (ms, memory_format)
            del fn
        row[f'{precision} ms'], row[f'{precision} format'] = best
    fn = training_step(model_name, size, 'fp32', 'contiguous', device)
    row['GFLOP'] = counted_gflop(fn)
    row['bf16 gain'] = row['fp32 ms'] / row['bf16 ms']
    return row


def summarise(rows: List[Dict[str, object]], peaks: Dict[str, float]) -> Section:
    reference = {(r['input'], p): r[f'{p} ms'] for r in rows if r['backbone'] == REFERENCE
                 for p in PRECISIONS}
    for row in rows:
        row['bf16 GFLOP/s'] = row['GFLOP'] / row['bf16 ms'] * 1e3
        row['% of bf16 peak'] = 100 * row['bf16 GFLOP/s'] / peaks['bf16']
        for precision in PRECISIONS:
            ref = reference.get((row['input'], precision))
            row[f'vs Swin-T {precision}'] = ref / row[f'{precision} ms'] if ref else None
    columns = ['backbone', 'input', 'fp32 ms', 'bf16 ms', 'bf16 gain', 'vs Swin-T fp32',
               'vs Swin-T bf16', 'GFLOP', 'bf16 GFLOP/s', '% of bf16 peak', 'fp32 format',
               'bf16 format']
    notes = ['forward + backward, train mode, random weights; median of the timed calls after a '
             'warm-up; each precision in its faster memory format (the format columns).',
             f'matmul peak measured in this run ([4096, 1024] @ [1024, 1024]): bf16 '
             f'{peaks["bf16"]:.0f} GFLOP/s, fp32 {peaks["fp32"]:.0f} GFLOP/s '
             f'({peaks["bf16"] / peaks["fp32"]:.1f}x).',
             'GFLOP: matmul and convolution FLOPs of one forward + backward (FlopCounterMode); '
             'the Laplacian-kernel, polarity and Newton-Schulz ops and element-wise work are not '
             'counted.',
             f'vs Swin-T: {REFERENCE} time / this time, same input and precision (> 1: faster).']
    return Section('Backbones in fp32 and bf16 (forward + backward)', columns, rows, notes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--repeats', type=int, default=3, help='timed calls per case (median)')
    parser.add_argument('--models', nargs='+', choices=list(BACKBONES), metavar='NAME',
                        help=f'subset of {list(BACKBONES)}')
    parser.add_argument('--sizes', nargs='+', choices=list(SIZES), help=f'subset of {list(SIZES)}')
    parser.add_argument('--threads', type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument('--out', help='write the results as JSON to this file')


def main(args: argparse.Namespace) -> int:
    if args.device == 'cuda' and not torch.cuda.is_available():
        print('--device cuda: no CUDA device is available', file=sys.stderr)
        return 2
    if args.device == 'cpu':
        from mmlinattn.cpu_autocast import warn_if_cpu_lacks_bf16
        warn_if_cpu_lacks_bf16()
    if args.threads:
        torch.set_num_threads(args.threads)
    models, sizes = args.models or list(BACKBONES), args.sizes or list(SIZES)
    peaks = {'bf16': matmul_peak_gflops(args.device, torch.bfloat16),
             'fp32': matmul_peak_gflops(args.device, torch.float32)}
    meta = dict(environment(), device=args.device, repeats=args.repeats,
                matmul_peak_gflops=peaks, load_average=os.getloadavg())
    print(f'# precision benchmark on {args.device}: ' + ', '.join(f'{k}={v}' for k, v in meta.items()))
    rows = [measure(model, size, args.device, args.repeats) for size in sizes for model in models]
    publish([summarise(rows, peaks)], args.out, meta)
    return 0
