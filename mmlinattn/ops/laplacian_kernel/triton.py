"""Triton kernels of ``laplacian_kernel``, as operators ``torch.ops.mmlinattn.laplacian_kernel_
triton_forward`` / ``..._triton_backward`` (the C++ operators' schemas, fake kernels and autograd:
``compiled.py``). Imported by ``dispatch.py`` on first use, never by ``import mmlinattn``.

- Forward: one program per ``[TILE, TILE]`` output tile of one (batch, head); it loops over the
  head dim in chunks of ``TILE_D`` channels, ``acc += sum_c |q_ic - k_jc|`` on a
  ``[TILE, TILE, TILE_D]`` block, then ``out = exp(-acc / lam)``.
- Backward, two kernels, each program owning its output tile (no atomics, a fixed summation
  order, so two runs are bitwise equal): a ``[TILE, TILE_D]`` tile of dq loops over the keys,
  ``dq_ic = -sum_j g_ij sign(q_ic - k_jc)``; a tile of dk loops over the queries,
  ``dk_jc = sum_i g_ij sign(q_ic - k_jc)``, with ``g = grad_out * out / lam``.
- Inputs are loaded in their dtype (fp32, fp16, bf16) and converted to fp32, the accumulator;
  results are stored in the input dtype. fp64 is not declared (``dispatch.TRITON_KERNELS``) and
  runs elsewhere, with that reason: triton passes Python floats such as ``1 / lam`` as fp32
  scalars, so an fp64 kernel would not be fp64-accurate. ``sign(0) = 0``; ``sign(NaN) = NaN``, so
  a NaN spreads as in the reference's autograd.
- Under ``TRITON_INTERPRET=1`` (set before triton is imported) the kernels run on CPU tensors
  through triton's numpy interpreter, which has no bf16 arithmetic: the kernels convert every
  load to fp32 first, so they compute in fp32 there as on a GPU.
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton
from triton.runtime.interpreter import InterpretedFunction

from ..registration import define_triton
from ..validation import shape_str
from . import check_args
from .compiled import OPERATORS

TILE = 32  # query and key rows per program
TILE_D = 8  # channels per step of the head-dim loop

FORWARD, BACKWARD = 'laplacian_kernel_triton_forward', 'laplacian_kernel_triton_backward'


@triton.jit
def _forward_kernel(q_ptr, k_ptr, out_ptr, n, m, d, neg_inv_lam, TILE: tl.constexpr,
                    TILE_D: tl.constexpr):
    pid_n, pid_m, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_n * TILE + tl.arange(0, TILE)
    cols = pid_m * TILE + tl.arange(0, TILE)
    chans = tl.arange(0, TILE_D)
    q_base = q_ptr + bh.to(tl.int64) * n * d
    k_base = k_ptr + bh.to(tl.int64) * m * d
    acc = tl.zeros((TILE, TILE), dtype=tl.float32)
    for c0 in range(0, d, TILE_D):
        c = c0 + chans
        q = tl.load(q_base + rows[:, None] * d + c[None, :],
                    mask=(rows[:, None] < n) & (c[None, :] < d), other=0.0).to(tl.float32)
        k = tl.load(k_base + cols[:, None] * d + c[None, :],
                    mask=(cols[:, None] < m) & (c[None, :] < d), other=0.0).to(tl.float32)
        acc += tl.sum(tl.abs(q[:, None, :] - k[None, :, :]), axis=2)
    out = tl.exp(acc * neg_inv_lam)
    out_base = out_ptr + bh.to(tl.int64) * n * m
    tl.store(out_base + rows[:, None] * m + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < n) & (cols[None, :] < m))


@triton.jit
def _backward_kernel(grad_ptr, out_ptr, own_ptr, other_ptr, result_ptr, n, m, d, inv_lam,
                     direction, OWN_IS_QUERY: tl.constexpr, TILE: tl.constexpr,
                     TILE_D: tl.constexpr):
    """``result[r, c] = direction * sum_o g(r, o) * sign(q_c - k_c)``, for dq (own rows are the
    queries, o runs over the keys) or dk (own rows are the keys, o runs over the queries)."""
    pid_r, pid_c, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_own = n if OWN_IS_QUERY else m
    n_other = m if OWN_IS_QUERY else n
    rows = pid_r * TILE + tl.arange(0, TILE)
    chans = pid_c * TILE_D + tl.arange(0, TILE_D)
    own_mask = (rows[:, None] < n_own) & (chans[None, :] < d)
    own = tl.load(own_ptr + bh.to(tl.int64) * n_own * d + rows[:, None] * d + chans[None, :],
                  mask=own_mask, other=0.0).to(tl.float32)
    other_base = other_ptr + bh.to(tl.int64) * n_other * d
    nm_base = bh.to(tl.int64) * n * m
    acc = tl.zeros((TILE, TILE_D), dtype=tl.float32)
    for o0 in range(0, n_other, TILE):
        others = o0 + tl.arange(0, TILE)
        other = tl.load(other_base + others[:, None] * d + chans[None, :],
                        mask=(others[:, None] < n_other) & (chans[None, :] < d),
                        other=0.0).to(tl.float32)
        valid = (rows[:, None] < n_own) & (others[None, :] < n_other)
        if OWN_IS_QUERY:  # g[own row, other row] is out[i, j]: contiguous along the keys
            idx = rows[:, None] * m + others[None, :]
        else:
            idx = others[None, :] * m + rows[:, None]
        g = (tl.load(grad_ptr + nm_base + idx, mask=valid, other=0.0).to(tl.float32)
             * tl.load(out_ptr + nm_base + idx, mask=valid, other=0.0).to(tl.float32) * inv_lam)
        if OWN_IS_QUERY:
            diff = own[:, None, :] - other[None, :, :]
        else:
            diff = other[None, :, :] - own[:, None, :]
        sign = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
        sign = tl.where(diff != diff, diff, sign)  # NaN stays NaN
        term = tl.where(valid[:, :, None], g[:, :, None] * sign, 0.0)
        acc += tl.sum(term, axis=1)
    tl.store(result_ptr + bh.to(tl.int64) * n_own * d + rows[:, None] * d + chans[None, :],
             (acc * direction).to(result_ptr.dtype.element_ty), mask=own_mask)


def _check_same_dtype(**tensors) -> None:
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        raise ValueError(f'{", ".join(tensors)} must have one dtype, got '
                         f'{", ".join(str(t.dtype) for t in tensors.values())}')


def _forward(q: torch.Tensor, k: torch.Tensor, lam: float) -> torch.Tensor:
    check_args(q, k, lam)
    _check_same_dtype(q=q, k=k)
    q, k = q.contiguous(), k.contiguous()
    batch, heads, n, d = q.shape
    m = k.shape[2]
    out = q.new_empty((batch, heads, n, m))
    if out.numel() == 0:
        return out
    grid = (triton.cdiv(n, TILE), triton.cdiv(m, TILE), batch * heads)
    wrap_triton(_forward_kernel)[grid](q, k, out, n, m, d, -1.0 / lam, TILE=TILE, TILE_D=TILE_D)
    return out


def _backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, out: torch.Tensor,
              lam: float, need_dq: bool, need_dk: bool):
    check_args(q, k, lam)
    _check_same_dtype(grad_out=grad_out, q=q, k=k, out=out)
    expected = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    for name, t in (('grad_out', grad_out), ('out', out)):
        if tuple(t.shape) != expected:
            raise ValueError(f'{name} must have shape [{"x".join(map(str, expected))}] (q\'s '
                             f'[B, H, N] and k\'s M), got [{shape_str(t)}]')
    grad_out, q, k, out = grad_out.contiguous(), q.contiguous(), k.contiguous(), out.contiguous()
    batch, heads, n, d = q.shape
    m = k.shape[2]
    dq = torch.zeros_like(q) if need_dq else q.new_empty((0, ))
    dk = torch.zeros_like(k) if need_dk else k.new_empty((0, ))
    if grad_out.numel() == 0 or d == 0:
        return dq, dk
    for needed, own, other, result, rows, direction, own_is_query in (
            (need_dq, q, k, dq, n, -1.0, True), (need_dk, k, q, dk, m, 1.0, False)):
        if needed:
            grid = (triton.cdiv(rows, TILE), triton.cdiv(d, TILE_D), batch * heads)
            wrap_triton(_backward_kernel)[grid](grad_out, out, own, other, result, n, m, d,
                                                1.0 / lam, direction, OWN_IS_QUERY=own_is_query,
                                                TILE=TILE, TILE_D=TILE_D)
    return dq, dk


INTERPRETED = isinstance(_forward_kernel, InterpretedFunction)  # TRITON_INTERPRET=1 at import
forward, backward = define_triton(OPERATORS, FORWARD, _forward, BACKWARD, _backward)
