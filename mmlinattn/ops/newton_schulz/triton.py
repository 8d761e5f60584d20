"""Triton kernels of ``newton_schulz_inverse``: forward and backward, one program per matrix.

The function is the product form with its per-matrix stop, exactly as the reference computes it
(``docs/ops/newton_schulz.md``)::

    P = a + eps*I,  s = ||P||_inf,  V_0 = I / s,  R_0 = I - P / s
    t = 0 .. iters-2 while not ||R_t||_inf <= u:   V <- V + V R,  R <- R R     (k steps taken)
    V = 2 V_k - (V_k P) V_k;  residual = ||I - P V||_F / sqrt(M)

- **Blocks.** A program owns one matrix and holds P, V and R as ``[BLOCK, BLOCK]`` tiles,
  ``BLOCK = max(16, next power of two >= M)``; rows and columns past M are zero and the identity
  is the identity of the first M rows, so the padding stays zero through every product and
  changes no sum. The stop is the program's own decision (no host sync). M is capped at
  :data:`MAX_M` (64: at BLOCK 128 the products' operands overflow shared memory); larger
  matrices are for the other implementations (:func:`unsupported_reason`).
- **Precision.** Every product is ``tl.dot(..., input_precision="ieee")``, full fp32 (tf32 would
  change how the iteration converges), accumulated in fp32. The kernels compute in the dtypes of
  :data:`TRITON_DTYPES`, fp32 only: callers cast fp16 / bf16 inputs to fp32 (the compute dtype,
  ``validation.compute_dtype``), and fp64 runs the compiled or reference implementation.
- **Backward.** The exact gradient of the computed V as a function of ``a``: the recurrence of
  ``newton_schulz.h`` (through every step taken, the closing step, and the start ``I / s``, ties
  of the row maximum sharing its gradient), with ``T = V_k P`` standing for ``P V_k`` as in the
  C++ kernels. The forward saves only ``a``; the backward's program recomputes the iterates and
  writes ``V_t, R_t`` of the steps it takes to a scratch buffer
  ``[B, iters-1, 2, M, M]`` (the batched-matmul backward keeps the same history), then runs the
  reverse recurrence from it. No atomics: each program writes only its own matrix, so two runs
  are bitwise equal.

The functions launch their kernels through ``torch.library.wrap_triton``; the operators
``torch.ops.mmlinattn.newton_schulz_inverse_triton`` / ``..._backward`` (same schemas as the C++
operators, with fake kernels and autograd) are registered at the bottom. Whether the kernels are
interpreted (``TRITON_INTERPRET=1``, CPU tensors) is decided when this module is imported.
"""
import math
from typing import Tuple

import torch
import triton
import triton.language as tl

from triton.runtime.interpreter import InterpretedFunction

from ..dispatch import TRITON_KERNELS
from ..registration import define_triton
from ..validation import check_non_negative_finite, check_positive_int, shape_str
from .compiled import OPERATORS

_KERNEL = TRITON_KERNELS['newton_schulz_inverse']
TRITON_DTYPES, MAX_M = _KERNEL.dtypes, _KERNEL.max_size
# fp32 unit roundoff, the stop threshold of ||R_t||_inf.
_UNIT_ROUNDOFF = torch.finfo(torch.float32).eps / 2


def block_size(m: int) -> int:
    """The padded tile of an M x M matrix: a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(m))


def _num_warps(block: int) -> int:
    # the backward holds about six BLOCK x BLOCK fp32 tiles; more warps keep them in registers
    return 4 if block <= 32 else 8


def unsupported_reason(a: torch.Tensor) -> str:
    """Why these kernels cannot take ``a`` [B, M, M] (dtype or size), or '' when they can."""
    if a.dtype not in TRITON_DTYPES:
        return (f"newton_schulz_inverse's Triton kernel computes in float32, got {a.dtype} "
                '(cast half inputs to float32; float64 runs the compiled or reference '
                'implementation)')
    if not _KERNEL.takes_size(a.shape[-1]):
        return f"newton_schulz_inverse's Triton kernel handles M <= {MAX_M}, got M={a.shape[-1]}"
    return ''


def _check_args(a, iters, eps) -> None:
    if not isinstance(a, torch.Tensor):
        raise ValueError(f'a must be a torch.Tensor, got {type(a).__name__}')
    if a.dim() != 3 or a.shape[1] != a.shape[2]:
        raise ValueError(f'a must be a batch of square matrices [B, M, M], got shape '
                         f'[{shape_str(a)}]')
    check_positive_int('iters', iters)
    check_non_negative_finite('eps', eps)
    reason = unsupported_reason(a)
    if reason:
        raise ValueError(reason)


# ---- kernels --------------------------------------------------------------------------------


@triton.jit
def _load(ptr, M, BLOCK: tl.constexpr, TRANSPOSE: tl.constexpr = False):
    """The M x M matrix at ptr (row-major) as a zero-padded [BLOCK, BLOCK] tile (or its
    transpose)."""
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    offsets = cols * M + rows if TRANSPOSE else rows * M + cols
    return tl.load(ptr + offsets, mask=(rows < M) & (cols < M), other=0.0)


@triton.jit
def _store(ptr, x, M, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    tl.store(ptr + rows * M + cols, x, mask=(rows < M) & (cols < M))


@triton.jit
def _identity(M, BLOCK: tl.constexpr):
    """The identity of the first M rows, zero in the padding."""
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    return ((rows == cols) & (rows < M)).to(tl.float32)


@triton.jit
def _shifted(a_ptr, M, eps, BLOCK: tl.constexpr):
    """P = a + eps*I."""
    return _load(a_ptr, M, BLOCK) + eps * _identity(M, BLOCK)


@triton.jit
def _row_sums_and_norm(p):
    """sum_j |P_ij| per row and s = their maximum, NaN when a row sum is (as torch's amax; their
    sum is NaN then); the padded rows' zero sums never attain it."""
    row_sums = tl.sum(tl.abs(p), axis=1)
    has_nan = tl.max((row_sums != row_sums).to(tl.int32), axis=0) > 0
    return row_sums, tl.where(has_nan, tl.sum(row_sums, axis=0), tl.max(row_sums, axis=0))


@triton.jit
def _keeps_going(r, u):
    """not ||R||_inf <= u: false once the residual is below the unit roundoff, true for NaN."""
    row_sums = tl.sum(tl.abs(r), axis=1)
    return tl.max(((row_sums > u) | (row_sums != row_sums)).to(tl.int32), axis=0) > 0


@triton.jit
def _product_step(v, r):
    """V + V R."""
    return v + tl.dot(v, r, input_precision="ieee")


@triton.jit
def _square(r):
    return tl.dot(r, r, input_precision="ieee")


@triton.jit
def _start(a_ptr, M, eps, BLOCK: tl.constexpr):
    """I, P = a + eps*I, 1/s with s = ||P||_inf, V_0 = I/s and R_0 = I - P/s."""
    eye = _identity(M, BLOCK)
    p = _shifted(a_ptr, M, eps, BLOCK)
    _, s = _row_sums_and_norm(p)
    inv = 1 / s
    return eye, p, inv, eye * inv, eye - p * inv


@triton.jit
def _product_steps(v, r, u, n_products, history, M, BLOCK: tl.constexpr,
                   KEEP_HISTORY: tl.constexpr):
    """Up to ``n_products`` steps V <- V + V R, R <- R R, stopping once ||R||_inf <= u; with
    KEEP_HISTORY, V_t and R_t of step t are written to history + (2t, 2t+1) * M*M. Returns the
    last V and the number of steps taken."""
    k = 0
    going = _keeps_going(r, u) & (k < n_products)
    while going:
        if KEEP_HISTORY:
            _store(history + (2 * k) * M * M, v, M, BLOCK)
            _store(history + (2 * k + 1) * M * M, r, M, BLOCK)
        v = _product_step(v, r)
        k += 1
        going = k < n_products
        if going:
            r = _square(r)
            going = _keeps_going(r, u)
    return v, k


@triton.jit
def _newton_schulz_forward_kernel(a_ptr, v_ptr, residual_ptr, M, eps, n_products, u, sqrt_m,
                                  WITH_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    matrix = tl.program_id(0).to(tl.int64) * M * M
    eye, p, inv, v, r = _start(a_ptr + matrix, M, eps, BLOCK)
    v, _ = _product_steps(v, r, u, n_products, v_ptr, M, BLOCK, KEEP_HISTORY=False)
    v = 2 * v - tl.dot(tl.dot(v, p, input_precision="ieee"), v, input_precision="ieee")
    _store(v_ptr + matrix, v, M, BLOCK)
    if WITH_RESIDUAL:
        e = eye - tl.dot(p, v, input_precision="ieee")
        norm = tl.sqrt(tl.sum(tl.sum(e * e, axis=1), axis=0))
        tl.store(residual_ptr + tl.program_id(0), norm / sqrt_m)


@triton.jit
def _newton_schulz_backward_kernel(grad_ptr, a_ptr, grad_a_ptr, history_ptr, M, eps, n_products,
                                   u, BLOCK: tl.constexpr):
    matrix = tl.program_id(0).to(tl.int64) * M * M
    # V_t, R_t of step t at history + (2t, 2t+1) * M*M, this matrix's n_products pairs
    history = history_ptr + tl.program_id(0).to(tl.int64) * n_products * 2 * M * M
    eye, p, inv, v, r = _start(a_ptr + matrix, M, eps, BLOCK)
    # the forward's steps, bit for bit (the same code), keeping what the reverse pass reads
    v, k = _product_steps(v, r, u, n_products, history, M, BLOCK, KEEP_HISTORY=True)
    # closing step V = 2 V_k - (V_k P) V_k: dP = -V_k^T G V_k^T, G_k = 2G - G T^T - P^T V_k^T G
    g = _load(grad_ptr + matrix, M, BLOCK)
    v_t = tl.trans(v)
    v_t_g = tl.dot(v_t, g, input_precision="ieee")
    dp = -tl.dot(v_t_g, v_t, input_precision="ieee")
    t_t = tl.trans(tl.dot(v, p, input_precision="ieee"))
    g = (2 * g - tl.dot(g, t_t, input_precision="ieee")) - tl.dot(tl.trans(p), v_t_g,
                                                                  input_precision="ieee")
    # dp waits in the output while the reverse steps hold G, D, V_t^T, R_t^T
    _store(grad_a_ptr + matrix, dp, M, BLOCK)
    # product steps t = k-1 .. 0: D_t = V_t^T G + D R_t^T + R_t^T D (D = dL/dR_{t+1}, zero at
    # t = k-1), G <- G + G R_t^T
    d = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    t = k - 1
    while t >= 0:
        v_t = _load(history + (2 * t) * M * M, M, BLOCK, TRANSPOSE=True)
        r_t = _load(history + (2 * t + 1) * M * M, M, BLOCK, TRANSPOSE=True)
        d_next = tl.dot(v_t, g, input_precision="ieee")
        if t < k - 1:
            d_next = d_next + tl.dot(d, r_t, input_precision="ieee")
            d_next = d_next + tl.dot(r_t, d, input_precision="ieee")
        g = g + tl.dot(g, r_t, input_precision="ieee")
        d = d_next
        t -= 1
    # start R_0 = I - P/s, V_0 = I/s: dP -= D_0 / s; dL/ds = (<D_0, P> - tr(G_0)) / s^2, shared
    # by the rows attaining s, times sign(P_ij)
    p = _shifted(a_ptr + matrix, M, eps, BLOCK)
    row_sums, s = _row_sums_and_norm(p)
    dp = _load(grad_a_ptr + matrix, M, BLOCK) - d * inv
    d_inv = (tl.sum(tl.sum(tl.where(eye != 0, g, 0.0), axis=1), axis=0)
             - tl.sum(tl.sum(d * p, axis=1), axis=0))
    ds = -d_inv / (s * s)
    rows = tl.arange(0, BLOCK)
    at_max = ((row_sums == s) & (rows < M)).to(tl.float32)
    share = ds * at_max / tl.sum(at_max, axis=0)
    sign = tl.where(p > 0, 1.0, tl.where(p < 0, -1.0, 0.0))
    _store(grad_a_ptr + matrix, dp + share[:, None] * sign, M, BLOCK)


# ---- launchers ------------------------------------------------------------------------------


def newton_schulz_triton_forward(a: torch.Tensor, iters: int, eps: float,
                                 with_residual: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """a [B, M, M] fp32 -> (V [B, M, M], residual [B] or [0] without ``with_residual``)."""
    _check_args(a, iters, eps)
    a = a.contiguous()
    batch, m = a.shape[0], int(a.shape[1])  # BLOCK is a compile-time constant: M is specialised
    v = torch.empty_like(a)
    residual = a.new_empty((batch if with_residual else 0, ))
    if a.numel() == 0:
        return v, residual.zero_()
    block = block_size(m)
    torch.library.wrap_triton(_newton_schulz_forward_kernel)[(batch, )](
        a, v, residual if with_residual else v, m, float(eps), iters - 1, _UNIT_ROUNDOFF,
        math.sqrt(m), WITH_RESIDUAL=with_residual, BLOCK=block, num_warps=_num_warps(block))
    return v, residual


def newton_schulz_triton_backward(grad_v: torch.Tensor, a: torch.Tensor, iters: int,
                                  eps: float) -> torch.Tensor:
    """dL/da [B, M, M] of V = newton_schulz_triton_forward(a, iters, eps) given dL/dV."""
    _check_args(a, iters, eps)
    if grad_v.shape != a.shape or grad_v.dtype != a.dtype or grad_v.device != a.device:
        raise ValueError(f'grad_v must match a (shape [{shape_str(a)}], {a.dtype}, {a.device}), '
                         f'got [{shape_str(grad_v)}], {grad_v.dtype}, {grad_v.device}')
    a, grad_v = a.contiguous(), grad_v.contiguous()
    batch, m = a.shape[0], int(a.shape[1])
    grad_a = torch.empty_like(a)
    if a.numel() == 0:
        return grad_a
    n_products = iters - 1
    history = a.new_empty((batch, max(n_products, 1), 2, m, m))
    block = block_size(m)
    torch.library.wrap_triton(_newton_schulz_backward_kernel)[(batch, )](
        grad_v, a, grad_a, history, m, float(eps), n_products, _UNIT_ROUNDOFF, BLOCK=block,
        num_warps=_num_warps(block))
    return grad_a


# ---- operators ------------------------------------------------------------------------------

INTERPRETED = isinstance(_newton_schulz_forward_kernel, InterpretedFunction)  # TRITON_INTERPRET=1
# The schemas, fake kernels and autograd formula are the C++ operators' (compiled.py): one per op.
newton_schulz_inverse_triton, newton_schulz_inverse_triton_backward = define_triton(
    OPERATORS, 'newton_schulz_inverse_triton', newton_schulz_triton_forward,
    'newton_schulz_inverse_triton_backward', newton_schulz_triton_backward)
