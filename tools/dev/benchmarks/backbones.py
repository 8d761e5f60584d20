"""Backbone benchmark: ``python tools/benchmark.py backbone [--sizes ...] [--models ...]``.

Forward (eval, no grad) and forward+backward (train mode, gradients of every parameter) latency
and peak memory of each backbone of ``BACKBONES`` at each input of ``SIZES``, batch 1, random
weights, no drop-path. The ratio columns divide each time by the same model's time at 512^2: at
1024^2 (4x the pixels) a cost linear in the pixels gives about 4.

Time: after a warm-up of the same backbone on a 64x64 input, one full-size call; if it took less
than ``--long-call-s`` it counts as a warm-up and the median of ``--repeats`` more calls is
reported, otherwise that single call is (a second full-size run at 1024^2 would cost minutes).
Besides the wall time, the process CPU time of the same calls is reported (all threads): on a
machine shared with other jobs it varies far less than the wall time.
Peak memory: as for the op benchmarks (``common.py``): CUDA allocator peak, or on the CPU the
resident-set high-water mark of one call in a fresh process.

``--compile`` also measures each case under ``torch.compile(model, fullgraph=True)`` (inductor,
static shapes: one compilation per backbone, size and phase, not timed: the first full-size call
compiles, the median of ``--repeats`` further calls is reported) and adds ``compiled ... ms``
columns and eager / compiled ratios. ``--compile dynamic`` measures instead the forward of the
graph that ``dynamic=True`` compiles (one graph for every input size; this project's backbones,
with the inductor options of their class attribute ``dynamic_compile_options``; training graphs
still compile per size with torch 2.14, so the backward is not measured), in ``dynamic fwd ms`` columns. Compiled cases report
no peak memory (the child process would compile again).

``--amp`` (CUDA only) runs every case under ``torch.autocast('cuda', dtype=torch.float16)``, as
mmengine's AMP optimizer wrapper trains.
"""
import argparse
import dataclasses
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from .common import (Case, Measurement, Section, cpu_peak_mb, cuda_peak_mb, environment,
                               publish)

BATCH = 1
SIZES = {'224^2': (224, 224), '512^2': (512, 512), '800x1333': (800, 1333),
         '1024^2': (1024, 1024)}
RATIO_BASE = '512^2'


def laplacianformer_tiny(**kwargs) -> nn.Module:
    from mmlinattn.models.backbones import LaplacianFormer
    return LaplacianFormer(arch='tiny', drop_path_rate=0.0, **kwargs)


def pola_pvt_tiny() -> nn.Module:
    from mmlinattn.models.backbones import PolaPVT
    return PolaPVT(arch='tiny', drop_path_rate=0.0)


def pola_swin_tiny() -> nn.Module:
    from mmlinattn.models.backbones import PolaSwin
    return PolaSwin(arch='tiny', drop_path_rate=0.0)


def pvt_tiny() -> nn.Module:
    from mmdet.models.backbones import PyramidVisionTransformer
    return PyramidVisionTransformer(num_layers=[2, 2, 2, 2])  # PVT-Tiny; other defaults = PVT


def swin_tiny() -> nn.Module:
    from mmdet.models.backbones import SwinTransformer
    return SwinTransformer(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                           window_size=7, drop_path_rate=0.0)


# name -> factory of a randomly initialised backbone returning its multi-scale features.
BACKBONES: Dict[str, Callable[[], nn.Module]] = {
    'LaplacianFormer-T': laplacianformer_tiny,
    'LaplacianFormer-T paper-literal m':
        lambda: laplacianformer_tiny(attn_cfg=dict(max_landmark_grid=None)),
    'Pola-PVT-T': pola_pvt_tiny,
    'Pola-Swin-T': pola_swin_tiny,
    'PVT-T (mmdet)': pvt_tiny,
    'Swin-T (mmdet)': swin_tiny,
}
PHASES = ('fwd', 'fwd+bwd')
OURS = [name for name in BACKBONES if not name.endswith('(mmdet)')]
COMPILE_MODES = {'static': 'compiled', 'dynamic': 'dynamic'}  # --compile mode -> phase prefix
COMPILED_PHASES = {'static': PHASES, 'dynamic': ('fwd', )}  # dynamic: training graphs recompile


@dataclasses.dataclass
class BackboneMeasurement(Measurement):
    cpu_ms: float = float('nan')  # process CPU time of the call, all threads


def _callable(model_name: str, size, phase: str, device: str,
              compile_mode: Optional[str] = None, amp: bool = False) -> Callable[[], object]:
    torch.manual_seed(0)
    model = BACKBONES[model_name]().to(device)
    if compile_mode == 'dynamic':
        run = torch.compile(model, fullgraph=True, dynamic=True,
                            options=model.dynamic_compile_options)
    elif compile_mode == 'static':
        run = torch.compile(model, fullgraph=True, dynamic=False)
    else:
        run = model
    if amp:
        run = _autocast(run, device)
    images = torch.randn(BATCH, 3, *size, device=device)
    if phase == 'fwd':
        model.eval()

        def forward():
            with torch.no_grad():
                return run(images)

        return forward
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]

    def forward_backward():
        loss = sum(out.float().mean() for out in run(images))
        return torch.autograd.grad(loss, params, allow_unused=True)

    return forward_backward


def _autocast(run: Callable, device: str) -> Callable:
    def autocast_run(images):
        with torch.autocast(device, dtype=torch.float16):
            return run(images)

    return autocast_run


def case_name(model_name: str, size_name: str, phase: str) -> str:
    return f'{model_name} | {size_name} | {phase}'


def cases(device: str, compile_mode: Optional[str] = None, amp: bool = False) -> List[Case]:
    """Every (backbone, size, phase); the warm-up is the same backbone at 64x64. ``compile_mode``
    'static': the same under torch.compile, phases named ``compiled fwd`` / ``compiled fwd+bwd``;
    'dynamic': the forward of this project's backbones compiled with ``dynamic=True`` and their
    ``dynamic_compile_options``, phase ``dynamic fwd``."""
    prefix = f'{COMPILE_MODES[compile_mode]} ' if compile_mode else ''
    models = OURS if compile_mode == 'dynamic' else list(BACKBONES)
    phases = COMPILED_PHASES[compile_mode] if compile_mode else PHASES
    return [
        Case(case_name(model, size_name, prefix + phase),
             build=lambda m=model, s=size, p=phase: _callable(m, s, p, device, compile_mode, amp),
             warm_up=lambda m=model, p=phase: _callable(m, (64, 64), p, device, amp=amp))
        for model in models for size_name, size in SIZES.items() for phase in phases
    ]


def _compile_mode(name: str) -> Optional[str]:
    """The compile mode of a case name, None for eager."""
    phase = name.split(' | ')[-1]
    return next((mode for mode, prefix in COMPILE_MODES.items() if phase.startswith(prefix + ' ')),
                None)


def _sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def _timed_ms(fn: Callable[[], object], device: str) -> Tuple[float, float]:
    """(wall ms, process CPU ms) of one call."""
    _sync(device)
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3, (time.process_time() - start_cpu) * 1e3


def measure(case: Case, device: str, repeats: int, long_call_s: float) -> BackboneMeasurement:
    case.warm_up()()
    fn = case.build()
    compiled = _compile_mode(case.name) is not None
    times = [_timed_ms(fn, device)]
    if compiled or times[0][0] < long_call_s * 1e3:  # a compiled case's first call compiles
        times = [_timed_ms(fn, device) for _ in range(repeats)]
    wall_ms = statistics.median(t[0] for t in times)
    cpu_ms = statistics.median(t[1] for t in times)
    if compiled:
        return BackboneMeasurement(wall_ms, None, cpu_ms=cpu_ms)
    if device.startswith('cuda'):
        return BackboneMeasurement(wall_ms, cuda_peak_mb(fn), cpu_ms=cpu_ms)
    del fn  # the child process rebuilds the backbone; free ours first
    child = cpu_peak_mb(__name__, case.name)
    return BackboneMeasurement(wall_ms, child['peak_mb'], child['exact'], cpu_ms=cpu_ms)


def summarise(results: Dict[str, BackboneMeasurement], device: str, amp: bool = False) -> Section:
    rows = []
    models = list(dict.fromkeys(name.split(' | ')[0] for name in results))
    for model in models:
        base = {phase: results.get(case_name(model, RATIO_BASE, phase)) for phase in PHASES}
        for size_name in SIZES:
            got = {phase: results.get(case_name(model, size_name, phase)) for phase in PHASES}
            if not any(got.values()):
                continue
            row = {'backbone': model, 'input': size_name}
            for phase in PHASES:
                res = got[phase]
                row[f'{phase} ms'] = res.time_ms if res else None
                row[f'{phase} CPU ms'] = res.cpu_ms if res else None
                row[f'peak {phase} MiB'] = res.peak_mb if res else None
                row[f'{phase} / {RATIO_BASE}'] = (res.time_ms / base[phase].time_ms
                                                 if res and base[phase] else None)
                row[f'{phase} CPU / {RATIO_BASE}'] = (res.cpu_ms / base[phase].cpu_ms
                                                     if res and base[phase] else None)
                for prefix in COMPILE_MODES.values():
                    compiled = results.get(case_name(model, size_name, f'{prefix} {phase}'))
                    if compiled:
                        row[f'{prefix} {phase} ms'] = compiled.time_ms
                        row[f'{phase} eager / {prefix}'] = (res.time_ms / compiled.time_ms
                                                            if res else None)
            rows.append(row)
    columns = ['backbone', 'input']
    for template in ('{} ms', '{} CPU ms', 'peak {} MiB', '{} / ' + RATIO_BASE,
                     '{} CPU / ' + RATIO_BASE):
        columns += [template.format(phase) for phase in PHASES]
    modes = {_compile_mode(name) for name in results}
    for mode, prefix in COMPILE_MODES.items():
        if mode in modes:
            for template in (prefix + ' {} ms', '{} eager / ' + prefix):
                columns += [template.format(phase) for phase in COMPILED_PHASES[mode]]
    notes = [f'batch {BATCH}, random weights; time = median of --repeats calls after a full-size '
             'warm-up call, or that first call alone when it took longer than --long-call-s; '
             f'"/ {RATIO_BASE}" = time / the same backbone\'s time at {RATIO_BASE} '
             '(1024^2 has 4x the pixels: linear cost gives ~4).',
             'LaplacianFormer-T: the default max_landmark_grid=7 (m <= 49 landmarks per head); '
             'paper-literal m: max_landmark_grid=None, m = H*W/s^2 (grows with the input, '
             'Newton-Schulz costs 2*m^3 per step).']
    if 'static' in modes:
        notes.append('compiled: torch.compile(model, fullgraph=True, dynamic=False), inductor; '
                     'the compilation is not timed; eager / compiled > 1: compiled is faster.')
    if 'dynamic' in modes:
        from mmlinattn.models.backbones import LaplacianFormer, PolaPVT, PolaSwin
        notes.append('dynamic: torch.compile(model, fullgraph=True, dynamic=True, options=...), '
                     'one graph for every input size, forward only; options by backbone class: '
                     + '; '.join(f'{cls.__name__} {cls.dynamic_compile_options}'
                                 for cls in (LaplacianFormer, PolaPVT, PolaSwin)) + '.')
    if not all(r.peak_exact for r in results.values()):
        notes.append('CPU peak memory is a lower bound here: the kernel refused to reset the '
                     'high-water mark (/proc/self/clear_refs).')
    return Section(f'Backbones on {device}' + (' (AMP, fp16 autocast)' if amp else ''), columns,
                   rows, notes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        choices=['cpu', 'cuda'], help='default: cuda when available')
    parser.add_argument('--repeats', type=int, default=3,
                        help='timed calls per case (median reported) after a full-size warm-up call')
    parser.add_argument('--long-call-s', type=float, default=20.0,
                        help='a first full-size call longer than this is reported alone, '
                        'without warm-up or repeats')
    parser.add_argument('--models', nargs='+', choices=list(BACKBONES), metavar='NAME',
                        help=f'subset of {list(BACKBONES)}')
    parser.add_argument('--sizes', nargs='+', choices=list(SIZES), help=f'subset of {list(SIZES)}')
    parser.add_argument('--threads', type=int,
                        help='torch CPU threads (default: torch\'s); 1 is steadiest on a shared machine')
    parser.add_argument('--compile', nargs='?', const='static', choices=list(COMPILE_MODES),
                        help='also measure each case under torch.compile(fullgraph=True): static '
                        '(the default) compiles per size, forward and forward+backward; dynamic '
                        'compiles with dynamic=True, forward only')
    parser.add_argument('--amp', action='store_true',
                        help='run under torch.autocast(\'cuda\', dtype=torch.float16) (CUDA only)')
    parser.add_argument('--out', help='write the results as JSON to this file')


def main(args: argparse.Namespace) -> int:
    if args.device == 'cuda' and not torch.cuda.is_available():
        print('--device cuda: no CUDA device is available', file=sys.stderr)
        return 2
    if args.amp and args.device != 'cuda':
        print('--amp: CUDA only', file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ['OMP_NUM_THREADS'] = str(args.threads)  # the peak-memory child processes
    models, sizes = args.models or list(BACKBONES), args.sizes or list(SIZES)
    meta = dict(environment(), device=args.device, repeats=args.repeats,
                long_call_s=args.long_call_s, batch=BATCH, amp=args.amp)
    print(f'# backbone benchmark on {args.device}: ' + ', '.join(f'{k}={v}' for k, v in meta.items()))
    results: Dict[str, BackboneMeasurement] = {}
    all_cases = cases(args.device, amp=args.amp) + (cases(args.device, args.compile, args.amp)
                                                    if args.compile else [])
    for case in all_cases:
        model, size_name, _ = case.name.split(' | ')
        if model in models and size_name in sizes:
            results[case.name] = measure(case, args.device, args.repeats, args.long_call_s)
            res = results[case.name]
            peak = '-' if res.peak_mb is None else f'{res.peak_mb:.0f}'
            print(f'  {case.name}: {res.time_ms:.1f} ms (CPU {res.cpu_ms:.1f} ms), '
                  f'peak {peak} MiB', flush=True)
    section = summarise(results, args.device, args.amp)
    publish([section], args.out, meta)
    return 0
