"""Check every implementation of the ops on this machine against the fp64 reference.

    python -m mmlinattn.ops.selftest [--device cpu|cuda] [--quick]

Runs each implementation available on the device (the pure-PyTorch reference, the C++ kernels,
the Triton kernels; on the CPU, Triton only through the interpreter, ``TRITON_INTERPRET=1``) of
each op at a few shapes, tile edges included, forward and backward, and prints one table: the
largest error of the outputs and of the gradients, relative to the largest fp64 reference value,
against its tolerance, the forward+backward time relative to the reference in the same dtype, and
PASS or FAIL. Exits 1 on any FAIL. Implementations are pluggable: :func:`register` adds one.
"""
import argparse
import functools
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import dispatch
from .depthwise_conv import depthwise_conv2d
from .depthwise_conv.reference import depthwise_conv2d_reference
from .laplacian_kernel import laplacian_kernel
from .laplacian_kernel.reference import laplacian_kernel_reference
from .newton_schulz import newton_schulz_inverse
from .newton_schulz.reference import newton_schulz_inverse_reference
from .polarity_attention import polarity_linear_attention
from .polarity_attention.reference import polarity_linear_attention_reference
from .roi_align import roi_align
from .roi_align.reference import roi_align_reference

LAM, NS_ITERS, NS_EPS, POLA_EPS = 4.0, 20, 1e-2, 1e-6
# mmdet's box head: 7x7 bins on the stride-4 map, ceil(bin size) samples per bin side
ROI_ALIGN_ARGS = dict(output_size=(7, 7), spatial_scale=0.25, sampling_ratio=0, aligned=True)


@dataclass(frozen=True)
class Implementation:
    """One implementation of an op: ``available(device_type, dtype)`` is None or why it cannot
    run; ``run(*inputs)`` returns the op's output (differentiable)."""
    name: str
    available: Callable[[str, torch.dtype], Optional[str]]
    run: Callable


@dataclass(frozen=True)
class OpCase:
    """How to test an op: its fp64 reference, inputs per shape, shapes (quick ones first) and
    tolerances per dtype (forward, backward), relative to the largest reference value."""
    reference: Callable
    make_inputs: Callable[[Tuple[int, ...], torch.Generator], List[torch.Tensor]]
    shapes: Tuple[Tuple[int, ...], ...]
    quick: int  # the first ``quick`` shapes run with --quick
    tolerances: Dict[torch.dtype, Tuple[float, float]]
    implementations: List[Implementation] = field(default_factory=list)
    fixed_inputs: int = 0  # the last inputs get no gradient (roi_align's rois)


def dispatched(op: str, function: Callable, mode: str) -> Implementation:
    """The public op run under ``MMLINATTN_OPS=mode``, available where dispatch allows it."""

    def run(*inputs):
        with dispatch.forced(mode):
            return function(*inputs)

    return Implementation(mode, functools.partial(dispatch.unavailable, mode, op), run)


def _scaled(gen, shape, scale=1.0):
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def _laplacian_inputs(shape, gen):
    b, h, n, m, d = shape
    return [_scaled(gen, (b, h, n, d), d**-0.5), _scaled(gen, (b, h, m, d), d**-0.5)]


def _newton_schulz_inputs(shape, gen):
    b, m, d = shape
    x = _scaled(gen, (b, 1, m, d), d**-0.5)
    return [laplacian_kernel_reference(x, x, LAM)[:, 0]]  # an SPD Gram matrix, as in the model


def _polarity_inputs(shape, gen):
    b, h, n, n_keys, d, dv = shape
    power = 1 + 4 * torch.sigmoid(_scaled(gen, (h, d)))
    return [_scaled(gen, (b, h, n, d)), _scaled(gen, (b, h, n_keys, d)),
            _scaled(gen, (b, h, n_keys, dv)), power]


def _depthwise_inputs(shape, gen):
    b, c, height, width, k = shape
    return [_scaled(gen, (b, c, height, width)).contiguous(memory_format=torch.channels_last),
            _scaled(gen, (c, 1, k, k), 1 / k), _scaled(gen, (c, ))]


def _roi_align_inputs(shape, gen):
    """A map and rois in image pixels (1 / spatial_scale per map pixel), some of them reaching past
    the map's edges."""
    b, c, height, width, k = shape
    extent = torch.tensor([width, height], dtype=torch.float64) / ROI_ALIGN_ARGS['spatial_scale']
    corner = (torch.rand(k, 2, generator=gen, dtype=torch.float64) * 1.2 - 0.1) * extent
    size = torch.rand(k, 2, generator=gen, dtype=torch.float64) * 0.6 * extent + 1
    batch = torch.randint(b, (k, 1), generator=gen).double()
    return [_scaled(gen, (b, c, height, width)), torch.cat([batch, corner, corner + size], 1)]


_HALVES = {torch.float16: (4e-3, 1e-2), torch.bfloat16: (3e-2, 6e-2)}
CASES: Dict[str, OpCase] = {
    'laplacian_kernel': OpCase(
        reference=lambda q, k: laplacian_kernel_reference(q, k, LAM),
        make_inputs=_laplacian_inputs,
        # (B, H, N, M, D): 31 / 32 / 33 straddle the Triton tile, 9 and 17 the head-dim step.
        shapes=((1, 2, 33, 31, 9), (2, 1, 1, 32, 1), (1, 2, 64, 65, 17), (2, 3, 197, 49, 32)),
        quick=2, tolerances={torch.float32: (1e-5, 1e-5), **_HALVES}),
    'newton_schulz_inverse': OpCase(
        reference=lambda a: newton_schulz_inverse_reference(a, NS_ITERS, NS_EPS),
        make_inputs=_newton_schulz_inputs,
        shapes=((3, 16, 8), (2, 33, 16), (4, 64, 32)),
        quick=2, tolerances={torch.float32: (1e-4, 1e-3), torch.bfloat16: _HALVES[torch.bfloat16]}),
    'polarity_linear_attention': OpCase(
        reference=lambda q, k, v, p: polarity_linear_attention_reference(q, k, v, p, POLA_EPS),
        make_inputs=_polarity_inputs,
        shapes=((1, 2, 33, 31, 9, 8), (2, 1, 1, 32, 1, 2), (2, 2, 64, 65, 32, 32)),
        quick=2, tolerances={torch.float32: (1e-4, 1e-4), **_HALVES}),
    'depthwise_conv2d': OpCase(
        reference=depthwise_conv2d_reference,
        make_inputs=_depthwise_inputs,
        # (B, C, H, W, k): channel counts on both sides of the CPU kernel's 16-lane block, maps
        # smaller than the kernel, LaplacianFormer's 9x9 stage-1 branch.
        shapes=((2, 5, 7, 9, 3), (1, 35, 4, 6, 9), (2, 64, 24, 17, 9)),
        quick=2, tolerances={torch.float32: (1e-5, 1e-5), **_HALVES}),
    'roi_align': OpCase(
        reference=lambda x, rois: roi_align_reference(x, rois, **ROI_ALIGN_ARGS),
        make_inputs=_roi_align_inputs,
        # (B, C, H, W, K): channel counts on both sides of the backward's 16- and 64-channel blocks
        shapes=((1, 5, 9, 11, 6), (2, 70, 16, 13, 9), (2, 256, 32, 40, 32)),
        quick=2, tolerances={torch.float32: (1e-5, 1e-5), torch.bfloat16: _HALVES[torch.bfloat16]},
        fixed_inputs=1),
}
_PUBLIC = {
    'laplacian_kernel': lambda q, k: laplacian_kernel(q, k, LAM),
    'newton_schulz_inverse': lambda a: newton_schulz_inverse(a, NS_ITERS, NS_EPS),
    'polarity_linear_attention': lambda q, k, v, p: polarity_linear_attention(q, k, v, p,
                                                                              POLA_EPS),
    'depthwise_conv2d': depthwise_conv2d,
    'roi_align': lambda x, rois: roi_align(x, rois, **ROI_ALIGN_ARGS),
}
for _op, _case in CASES.items():
    _case.implementations.extend(dispatched(_op, _PUBLIC[_op], mode)
                                 for mode in ('reference', 'compiled', 'triton'))


def register(op: str, implementation: Implementation) -> None:
    """Add an implementation of ``op`` to the self-test (replacing one of the same name)."""
    implementations = CASES[op].implementations
    implementations[:] = [i for i in implementations if i.name != implementation.name]
    implementations.append(implementation)


def _forward_backward(function, inputs, fixed_inputs=0, grad_seed=0):
    """The output and the gradients of ``sum(output * g)`` (g fixed) for every input but the last
    ``fixed_inputs``."""
    split = len(inputs) - fixed_inputs
    leaves = [x.detach().requires_grad_() for x in inputs[:split]]
    out = function(*leaves, *inputs[split:])
    gen = torch.Generator().manual_seed(grad_seed)
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out)
    grads = torch.autograd.grad(out, leaves, grad)
    return out, grads


def _relative_error(actual, expected) -> float:
    scale = expected.abs().max().item() if expected.numel() else 0.0
    if not expected.numel():
        return 0.0
    return (actual.double() - expected).abs().max().item() / max(scale, 1e-30)


def _timed(function, inputs, fixed_inputs, device_type, repeats) -> float:
    """The best of ``repeats`` forward+backward times, after one warm-up run."""
    _forward_backward(function, inputs, fixed_inputs)
    best = float('inf')
    for _ in range(repeats):
        if device_type == 'cuda':
            torch.cuda.synchronize()
        start = time.perf_counter()
        _forward_backward(function, inputs, fixed_inputs)
        if device_type == 'cuda':
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


@dataclass
class Row:
    op: str
    implementation: str
    dtype: str
    forward: Optional[Tuple[float, float]] = None  # (error, tolerance)
    backward: Optional[Tuple[float, float]] = None
    time_ratio: Optional[float] = None
    note: str = ''

    @property
    def passed(self) -> Optional[bool]:
        if self.forward is None:
            return None
        return all(err <= tol for err, tol in (self.forward, self.backward))


def check(op: str, implementation: Implementation, dtype: torch.dtype, device: str,
          quick: bool) -> Row:
    """Errors of ``implementation`` against the fp64 reference over the op's shapes, and its
    forward+backward time relative to the reference's (same dtype, largest shape)."""
    case = CASES[op]
    row = Row(op, implementation.name, str(dtype).replace('torch.', ''))
    reason = implementation.available(torch.device(device).type, dtype)
    if reason:
        row.note = reason
        return row
    tol_fwd, tol_bwd = case.tolerances[dtype]
    err_fwd = err_bwd = 0.0
    shapes = case.shapes[:case.quick] if quick else case.shapes
    for index, shape in enumerate(shapes):
        gen = torch.Generator().manual_seed(index)
        inputs = [x.to(device=device, dtype=dtype) for x in case.make_inputs(shape, gen)]
        out, grads = _forward_backward(implementation.run, inputs, case.fixed_inputs)
        ref_out, ref_grads = _forward_backward(case.reference, [x.double() for x in inputs],
                                               case.fixed_inputs)
        err_fwd = max(err_fwd, _relative_error(out, ref_out))
        err_bwd = max([err_bwd] + [_relative_error(g, r) for g, r in zip(grads, ref_grads)])
    row.forward, row.backward = (err_fwd, tol_fwd), (err_bwd, tol_bwd)
    reference = next(i for i in case.implementations if i.name == 'reference')
    repeats = 1 if quick else 3
    row.time_ratio = 1.0 if implementation is reference else (
        _timed(implementation.run, inputs, case.fixed_inputs, device, repeats)
        / _timed(reference.run, inputs, case.fixed_inputs, device, repeats))
    return row


def format_table(rows: Sequence[Row]) -> str:
    header = ('op', 'implementation', 'dtype', 'fwd err / tol', 'bwd err / tol', 'time / ref',
              'result')
    lines = []
    for r in rows:
        if r.forward is None:
            lines.append((r.op, r.implementation, r.dtype, '-', '-', '-', 'SKIP'))
            continue
        lines.append((r.op, r.implementation, r.dtype, f'{r.forward[0]:.1e} / {r.forward[1]:.0e}',
                      f'{r.backward[0]:.1e} / {r.backward[1]:.0e}', f'{r.time_ratio:.2f}x',
                      'PASS' if r.passed else 'FAIL'))
    widths = [max(len(str(x)) for x in column) for column in zip(header, *lines)]
    text = [' | '.join(str(x).ljust(w) for x, w in zip(line, widths)) for line in [header] + lines]
    text.insert(1, '-+-'.join('-' * w for w in widths))
    notes = sorted({f'  SKIP {r.op} {r.implementation} {r.dtype}: {r.note}'
                    for r in rows if r.forward is None})
    return '\n'.join(text + (['', 'skipped (not available here):'] + notes if notes else []))


def dtypes_for(op: str, device_type: str) -> List[torch.dtype]:
    """The dtypes with tolerances: all of them on CUDA and where the interpreter runs the Triton
    kernels; fp32 and bf16 (the CPU's mixed precision) on the CPU otherwise."""
    declared = CASES[op].tolerances
    if device_type == 'cuda' or (dispatch.TRITON_KERNELS.get(op) and
                                 dispatch.triton_interpreted(op)):
        return list(declared)
    return [dtype for dtype in declared if dtype in (torch.float32, torch.bfloat16)]


def run(device: str, quick: bool) -> List[Row]:
    return [check(op, implementation, dtype, device, quick)
            for op, case in CASES.items()
            for dtype in dtypes_for(op, torch.device(device).type)
            for implementation in case.implementations]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m mmlinattn.ops.selftest', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        choices=('cpu', 'cuda'))
    parser.add_argument('--quick', action='store_true', help='the smallest shapes only')
    args = parser.parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        print('--device cuda: no CUDA device is available to torch', file=sys.stderr)
        return 2
    print(f'mmlinattn ops self-test on {args.device} (torch {torch.__version__}); '
          f'{dispatch.extension_status()}')
    rows = run(args.device, args.quick)
    print(format_table(rows))
    failed = [r for r in rows if r.passed is False]
    print(f'\n{len(failed)} FAIL' if failed else '\nall PASS')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
