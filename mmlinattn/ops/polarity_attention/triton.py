"""Triton kernels of ``polarity_linear_attention``, forward and backward, registered as the
operators ``torch.ops.mmlinattn.polarity_linear_attention_triton_forward`` / ``..._backward``.

Same schemas, same saved tensors and the same algorithm as the compiled operators
(``ops/csrc/polarity_attention/polarity_attention.h``, ``docs/ops/polarity_linear_attention.md``).
Per batch and head, with ``phi(x) = [x+, x-]`` (one non-zero entry per channel), ``m = dv / 2``:

- key pass: ``S = sum_j phi(k_j)^T [v_j, 1]``  [2d, dv+1], per-chunk partials summed in order;
- state: ``M = [[A1 B2 zp zm], [B1 A2 zm zp]] / n``  [2d, dv+2] (rows r and r+d swapped for the
  opposite-sign columns), so that ``y = phi(q_i) M`` holds both streams and both normalisers;
- query pass: ``den = y[dv:dv+2] + eps``, ``out_i = [y[:m] / den_0, y[m:dv] / den_1]``;
- saved: ``state = M`` [B, h, 2d, dv+2] fp32 and ``den`` [B, h, N, 2] fp32, plus ``out``.

Backward: ``W = dL/dy = [g1/den_0, g2/den_1, -g1.out1/den_0, -g2.out2/den_1]``;
``dM = phi(q)^T W`` (query-chunk partials), ``dS`` its adjoint layout / n; ``dphi(q) = W M^T``
and ``dphi(k) = [v, 1] dS^T`` give ``dq``, ``dk`` and per-tile ``dpower`` partials through
``d|x|^p = p |x|^(p-1) sign(x) dx + |x|^p log|x| dp``; ``dv = phi(k) dS[:, :dv]``.

Numerics: q, k, v and grad_out are loaded in their dtype (fp32, fp16 or bf16) and converted to
fp32 in registers; the features ``|x|^p = exp2(p log2|x|)``, every product and every sum run in
fp32 (``tl.dot(..., input_precision="ieee")``: tf32's 10-bit mantissa would cost three digits of
the features, which the powers up to 5 amplify); out, dq, dk, dv are stored in the input dtype.
fp64 is not supported (:data:`TRITON_DTYPES`). Deterministic: each program writes only its own
tile; reductions across programs (over key / query chunks, over batches and token tiles for
dpower) go through partial buffers that ``torch.sum`` reduces in a fixed order; no atomics.
"""
from typing import Tuple

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..registration import define_triton
from .compiled import OPERATORS

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Tile sizes: tokens per program tile, head-dim channels per tile, state / value columns per tile.
TOKEN_TILE = 64
CHANNEL_TILE = 32
COLUMN_TILE = 64
# Token tiles per chunk of the outer-product reductions (key state, dM): each chunk of a
# (batch, head) is one program's partial sum, so long sequences still fill the grid.
CHUNK_TILES = 4
_TILES = dict(BLOCK_T=TOKEN_TILE, BLOCK_D=CHANNEL_TILE, BLOCK_C=COLUMN_TILE)


@triton.jit
def _token_tile(tokens, BLOCK_T: tl.constexpr):
    """This program's (batch*head) index, the global rows of its token tile and their mask, for
    a grid whose axis 0 is (batch*head) x token tiles."""
    tiles = tl.cdiv(tokens, BLOCK_T)
    bh = tl.program_id(0) // tiles
    t = (tl.program_id(0) % tiles) * BLOCK_T + tl.arange(0, BLOCK_T)
    return bh, bh.to(tl.int64) * tokens + t, t < tokens


@triton.jit
def _load_features(x_ptr, p_ptr, head, rows, t_mask, channels, c_mask, d):
    """x [T, D] (fp32), p [D] and a = |x|^p = exp2(p log2|x|) for the token rows and channels of
    one tile: a = 0 at x = 0 (p > 0) and at masked entries, NaN for a NaN x."""
    x = tl.load(x_ptr + rows[:, None] * d + channels[None, :],
                mask=t_mask[:, None] & c_mask[None, :], other=0.0).to(tl.float32)
    p = tl.load(p_ptr + head * d + channels, mask=c_mask, other=1.0).to(tl.float32)
    nonzero = x != 0
    a = tl.where(nonzero, tl.exp2(p[None, :] * tl.log2(tl.where(nonzero, tl.abs(x), 1.0))), 0.0)
    return x, p, a


@triton.jit
def _load_weights(w_ptr, den_ptr, den_grad_ptr, rows, t_mask, cols, dv, QUERY: tl.constexpr):
    """The [T, C] weights w_t[cols] that meet phi(x_t): [v_t, 1] on the key side, and on the query
    side of the backward dL/dy_t = [g[:m] / den_0, g[m:] / den_1, den_grad_0, den_grad_1]."""
    w = tl.load(w_ptr + rows[:, None] * dv + cols[None, :],
                mask=t_mask[:, None] & (cols < dv)[None, :], other=0.0).to(tl.float32)
    if QUERY:
        den_same = tl.load(den_ptr + rows * 2, mask=t_mask, other=1.0)
        den_opp = tl.load(den_ptr + rows * 2 + 1, mask=t_mask, other=1.0)
        w = w / tl.where((cols < dv // 2)[None, :], den_same[:, None], den_opp[:, None])
        grad_same = tl.load(den_grad_ptr + rows * 2, mask=t_mask, other=0.0)
        grad_opp = tl.load(den_grad_ptr + rows * 2 + 1, mask=t_mask, other=0.0)
        w = tl.where((cols == dv)[None, :], grad_same[:, None], w)
        w = tl.where((cols == dv + 1)[None, :], grad_opp[:, None], w)
    else:
        w = tl.where((cols == dv)[None, :] & t_mask[:, None], 1.0, w)
    return w


@triton.jit
def _outer_reduce_kernel(x_ptr, p_ptr, w_ptr, den_ptr, den_grad_ptr, partial_ptr, heads, tokens,
                         d, dv, cols, chunks, TILES_PER_CHUNK: tl.constexpr, QUERY: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """partial[bh, chunk, r, col] = sum_{t in chunk} phi_r(x_t) w_t[col]   ([2d, cols] per chunk).

    Grid (bh * chunks, channel tiles, column tiles); a program owns [BLOCK_D, BLOCK_C] of both
    polarities (rows c and c + d) and walks the token tiles of its chunk in order.
    """
    pid = tl.program_id(0)
    bh = pid // chunks
    chunk = pid % chunks
    channels = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_idx = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = channels < d
    first_row = bh.to(tl.int64) * tokens
    acc_pos = tl.zeros((BLOCK_D, BLOCK_C), dtype=tl.float32)
    acc_neg = tl.zeros((BLOCK_D, BLOCK_C), dtype=tl.float32)
    for i in range(0, TILES_PER_CHUNK):
        t = (chunk * TILES_PER_CHUNK + i) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_mask = t < tokens
        rows = first_row + t
        x, p, a = _load_features(x_ptr, p_ptr, bh % heads, rows, t_mask, channels, c_mask, d)
        w = _load_weights(w_ptr, den_ptr, den_grad_ptr, rows, t_mask, col_idx, dv, QUERY)
        acc_pos += tl.dot(tl.trans(tl.where(x < 0, 0.0, a)), w, input_precision='ieee')
        acc_neg += tl.dot(tl.trans(tl.where(x > 0, 0.0, a)), w, input_precision='ieee')
    out = partial_ptr + pid.to(tl.int64) * 2 * d * cols
    mask = c_mask[:, None] & (col_idx < cols)[None, :]
    offsets = channels[:, None] * cols + col_idx[None, :]
    tl.store(out + offsets, acc_pos, mask=mask)
    tl.store(out + d * cols + offsets, acc_neg, mask=mask)


@triton.jit
def _feature_matmul_kernel(x_ptr, p_ptr, mat_ptr, out_ptr, den_ptr, heads, tokens, d, dv,
                           mat_cols, eps, NORMALISE: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
                           SAVED_DEN: tl.constexpr = False):
    """y_t = phi(x_t) mat[:, :dv] for a tile of tokens and columns (mat: [2d, mat_cols] per bh).

    NORMALISE (query forward): den_t = phi(x_t) mat[:, dv:dv+2] + eps,
    out_t = [y[:m] / den_0, y[m:dv] / den_1]; otherwise out_t = y_t (dv of the key backward).
    SAVED_DEN (query backward): den is read from den_ptr, as the forward stored it.
    Grid (bh * token tiles, column tiles of dv); the channels are the loop.
    """
    bh, rows, t_mask = _token_tile(tokens, BLOCK_T)
    col_idx = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = col_idx < dv
    mat = mat_ptr + bh.to(tl.int64) * 2 * d * mat_cols
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    den_same = tl.zeros((BLOCK_T, ), dtype=tl.float32)
    den_opp = tl.zeros((BLOCK_T, ), dtype=tl.float32)
    for c0 in range(0, d, BLOCK_D):
        channels = c0 + tl.arange(0, BLOCK_D)
        c_mask = channels < d
        x, p, a = _load_features(x_ptr, p_ptr, bh % heads, rows, t_mask, channels, c_mask, d)
        pos = tl.where(x < 0, 0.0, a)
        neg = tl.where(x > 0, 0.0, a)
        mat_mask = c_mask[:, None] & col_mask[None, :]
        mat_pos = tl.load(mat + channels[:, None] * mat_cols + col_idx[None, :], mask=mat_mask,
                          other=0.0)
        mat_neg = tl.load(mat + (channels + d)[:, None] * mat_cols + col_idx[None, :],
                          mask=mat_mask, other=0.0)
        acc += tl.dot(pos, mat_pos, input_precision='ieee')
        acc += tl.dot(neg, mat_neg, input_precision='ieee')
        if NORMALISE:
            z_same_pos = tl.load(mat + channels * mat_cols + dv, mask=c_mask, other=0.0)
            z_same_neg = tl.load(mat + (channels + d) * mat_cols + dv, mask=c_mask, other=0.0)
            z_opp_pos = tl.load(mat + channels * mat_cols + dv + 1, mask=c_mask, other=0.0)
            z_opp_neg = tl.load(mat + (channels + d) * mat_cols + dv + 1, mask=c_mask, other=0.0)
            den_same += tl.sum(pos * z_same_pos[None, :] + neg * z_same_neg[None, :], axis=1)
            den_opp += tl.sum(pos * z_opp_pos[None, :] + neg * z_opp_neg[None, :], axis=1)
    if NORMALISE:
        if SAVED_DEN:
            den_same = tl.load(den_ptr + rows * 2, mask=t_mask, other=1.0)
            den_opp = tl.load(den_ptr + rows * 2 + 1, mask=t_mask, other=1.0)
        else:
            den_same += eps
            den_opp += eps
            first_col_tile = tl.program_id(1) == 0
            tl.store(den_ptr + rows * 2, den_same, mask=t_mask & first_col_tile)
            tl.store(den_ptr + rows * 2 + 1, den_opp, mask=t_mask & first_col_tile)
        acc = acc / tl.where((col_idx < dv // 2)[None, :], den_same[:, None], den_opp[:, None])
    tl.store(out_ptr + rows[:, None] * dv + col_idx[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=t_mask[:, None] & col_mask[None, :])


@triton.jit
def _den_grad_kernel(g_ptr, out_ptr, den_ptr, den_grad_ptr, rows_total, dv,
                     BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """den_grad_t = (-g[:m].out[:m] / den_0, -g[m:].out[m:] / den_1), for all B*h*N rows."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    r_mask = rows < rows_total
    same = tl.zeros((BLOCK_T, ), dtype=tl.float32)
    opp = tl.zeros((BLOCK_T, ), dtype=tl.float32)
    for c0 in range(0, dv, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        mask = r_mask[:, None] & (cols < dv)[None, :]
        offsets = rows[:, None] * dv + cols[None, :]
        prod = (tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32) *
                tl.load(out_ptr + offsets, mask=mask, other=0.0).to(tl.float32))
        in_same = (cols < dv // 2)[None, :]
        same += tl.sum(tl.where(in_same, prod, 0.0), axis=1)
        opp += tl.sum(tl.where(in_same, 0.0, prod), axis=1)
    den_same = tl.load(den_ptr + rows * 2, mask=r_mask, other=1.0)
    den_opp = tl.load(den_ptr + rows * 2 + 1, mask=r_mask, other=1.0)
    tl.store(den_grad_ptr + rows * 2, -same / den_same, mask=r_mask)
    tl.store(den_grad_ptr + rows * 2 + 1, -opp / den_opp, mask=r_mask)


@triton.jit
def _feature_grad_kernel(x_ptr, p_ptr, w_ptr, den_ptr, den_grad_ptr, mat_ptr, dx_ptr,
                         power_partial_ptr, heads, tokens, d, dv, cols, QUERY: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """da_tc = w_t . mat[row(c, x_tc)] (mat: [2d, cols] per bh), then
    dx_tc = sign(x) p_c |x|^(p_c-1) da_tc and power_partial[bh, tile, c] = sum_t da |x|^p log|x|.

    Grid (bh * token tiles, channel tiles); the columns are the loop. x = 0 gives 0 (as autograd).
    """
    bh, rows, t_mask = _token_tile(tokens, BLOCK_T)
    channels = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    c_mask = channels < d
    x, p, a = _load_features(x_ptr, p_ptr, bh % heads, rows, t_mask, channels, c_mask, d)
    mat = mat_ptr + bh.to(tl.int64) * 2 * d * cols
    grad_pos = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
    grad_neg = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
    for c0 in range(0, cols, BLOCK_C):
        col_idx = c0 + tl.arange(0, BLOCK_C)
        w = _load_weights(w_ptr, den_ptr, den_grad_ptr, rows, t_mask, col_idx, dv, QUERY)
        mat_mask = (col_idx < cols)[:, None] & c_mask[None, :]
        mat_pos_t = tl.load(mat + channels[None, :] * cols + col_idx[:, None], mask=mat_mask,
                            other=0.0)
        mat_neg_t = tl.load(mat + (channels + d)[None, :] * cols + col_idx[:, None],
                            mask=mat_mask, other=0.0)
        grad_pos += tl.dot(w, mat_pos_t, input_precision='ieee')
        grad_neg += tl.dot(w, mat_neg_t, input_precision='ieee')
    da = tl.where(x > 0, grad_pos, grad_neg)
    nonzero = x != 0
    ax = tl.where(nonzero, tl.abs(x), 1.0)
    dx = tl.where(nonzero, p[None, :] * (a / ax) * da, 0.0)
    dx = tl.where(x < 0, -dx, dx)
    tl.store(dx_ptr + rows[:, None] * d + channels[None, :], dx.to(dx_ptr.dtype.element_ty),
             mask=t_mask[:, None] & c_mask[None, :])
    dpower = tl.sum(tl.where(nonzero, da * a * tl.log(ax), 0.0), axis=0)
    tl.store(power_partial_ptr + tl.program_id(0).to(tl.int64) * d + channels, dpower, mask=c_mask)


def _num_chunks(tokens: int) -> int:
    """Chunks of CHUNK_TILES token tiles covering ``tokens`` (the outer-product reductions)."""
    return triton.cdiv(tokens, TOKEN_TILE * CHUNK_TILES)


def _swap_polarity(x: torch.Tensor, d: int) -> torch.Tensor:
    """Rows r <-> r + d of [bh, 2d, cols]."""
    return torch.cat([x[:, d:], x[:, :d]], dim=1)


def _query_state(key_state: torch.Tensor, n: int, d: int, dv: int) -> torch.Tensor:
    """M = [[A1 B2 zp zm], [B1 A2 zm zp]] / n  [bh, 2d, dv+2] from S = [[A zp], [B zm]]."""
    m, swapped = dv // 2, _swap_polarity(key_state, d)
    return torch.cat([key_state[..., :m], swapped[..., m:dv], key_state[..., dv:],
                      swapped[..., dv:]], dim=-1) / n


def _key_state_grad(state_grad: torch.Tensor, n: int, d: int, dv: int) -> torch.Tensor:
    """dS [bh, 2d, dv+1] from dM [bh, 2d, dv+2]: the adjoint of :func:`_query_state`."""
    m, swapped = dv // 2, _swap_polarity(state_grad, d)
    return torch.cat([state_grad[..., :m], swapped[..., m:dv],
                      state_grad[..., dv:dv + 1] + swapped[..., dv + 1:]], dim=-1) / n


def interpreted() -> bool:
    """Whether the kernels were defined under ``TRITON_INTERPRET=1`` (they then run on CPU
    tensors, in Triton's interpreter)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(_outer_reduce_kernel, InterpretedFunction)


def unsupported_reason(device_type: str, dtype: torch.dtype) -> str:
    """Why these kernels cannot run on tensors of ``device_type`` and ``dtype``; '' if they can."""
    if dtype not in TRITON_DTYPES:
        return ('the Triton polarity_linear_attention takes float32, float16 or bfloat16, got '
                f'{dtype}')
    if device_type != 'cuda' and not interpreted():
        return ('the Triton polarity_linear_attention runs on CUDA tensors (on CPU tensors only '
                f'with TRITON_INTERPRET=1 set before it is imported), got {device_type}')
    return ''


def _check_forward_args(q, k, v, power) -> None:
    for name, t in (('q', q), ('k', k), ('v', v)):
        if t.dim() != 4:
            raise ValueError(f'{name} must have 4 dimensions, got shape {list(t.shape)}')
    reason = unsupported_reason(q.device.type, q.dtype)
    if reason:
        raise ValueError(reason)
    for name, t in (('k', k), ('v', v), ('power', power)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f'{name} must have the dtype and device of q ({q.dtype} on '
                             f'{q.device}), got {t.dtype} on {t.device}')
    batch, heads, _, head_dim = q.shape
    if k.shape[:2] != (batch, heads) or v.shape[:2] != (batch, heads):
        raise ValueError(f'q, k, v must share batch and heads, got shapes {list(q.shape)}, '
                         f'{list(k.shape)}, {list(v.shape)}')
    if k.shape[3] != head_dim or head_dim < 1:
        raise ValueError(f'q and k must have the same head dim (>= 1), got {head_dim} and '
                         f'{k.shape[3]}')
    if k.shape[2] != v.shape[2] or k.shape[2] < 1:
        raise ValueError(f'k and v must have the same number of tokens (>= 1), got '
                         f'{k.shape[2]} and {v.shape[2]}')
    if v.shape[3] < 2 or v.shape[3] % 2:
        raise ValueError(f'v must have an even, non-zero last dim, got {v.shape[3]}')
    if tuple(power.shape) != (heads, head_dim):
        raise ValueError(f'power must have shape [{heads}, {head_dim}] (heads, head dim), got '
                         f'{list(power.shape)}')


def _check_backward_args(grad_out, q, k, v, power, out, state, den) -> None:
    _check_forward_args(q, k, v, power)
    batch, heads, num_queries, head_dim = q.shape
    value_dim = v.shape[3]
    expected = {
        'grad_out': (grad_out, q.dtype, (batch, heads, num_queries, value_dim)),
        'out': (out, q.dtype, (batch, heads, num_queries, value_dim)),
        'state': (state, torch.float32, (batch, heads, 2 * head_dim, value_dim + 2)),
        'den': (den, torch.float32, (batch, heads, num_queries, 2)),
    }
    for name, (t, dtype, shape) in expected.items():
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != q.device:
            raise ValueError(f'{name} must be {dtype} of shape {list(shape)} on {q.device}, got '
                             f'{t.dtype} of shape {list(t.shape)} on {t.device}')


def polarity_triton_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            power: torch.Tensor,
                            eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B,h,N,d], k [B,h,n,d], v [B,h,n,dv], power [h,d] -> out [B,h,N,dv] (q's dtype),
    state M [B,h,2d,dv+2] fp32, den [B,h,N,2] fp32 (see the module docstring)."""
    _check_forward_args(q, k, v, power)
    q, k, v, power = (t.contiguous() for t in (q, k, v, power))
    batch, heads, num_queries, d = q.shape
    n, dv = k.shape[2], v.shape[3]
    bh_count = batch * heads
    out = q.new_empty((batch, heads, num_queries, dv))
    den = q.new_empty((batch, heads, num_queries, 2), dtype=torch.float32)
    if bh_count == 0:
        return out, q.new_empty((batch, heads, 2 * d, dv + 2), dtype=torch.float32), den
    chunks = _num_chunks(n)
    partial = q.new_empty((bh_count, chunks, 2 * d, dv + 1), dtype=torch.float32)
    grid = (bh_count * chunks, triton.cdiv(d, CHANNEL_TILE), triton.cdiv(dv + 1, COLUMN_TILE))
    wrap_triton(_outer_reduce_kernel)[grid](
        k, power, v, v, v, partial, heads, n, d, dv, dv + 1, chunks,
        TILES_PER_CHUNK=CHUNK_TILES, QUERY=False, **_TILES)
    state = _query_state(partial.sum(dim=1), n, d, dv).reshape(batch, heads, 2 * d, dv + 2)
    if num_queries > 0:
        grid = (bh_count * triton.cdiv(num_queries, TOKEN_TILE), triton.cdiv(dv, COLUMN_TILE))
        wrap_triton(_feature_matmul_kernel)[grid](
            q, power, state, out, den, heads, num_queries, d, dv, dv + 2, eps, NORMALISE=True,
            **_TILES)
    return out, state, den


def polarity_triton_backward(
        grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        power: torch.Tensor, out: torch.Tensor, state: torch.Tensor,
        den: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> dq, dk, dv (the input dtype), dpower [h, d] fp32; the tensors of the forward as saved."""
    _check_backward_args(grad_out, q, k, v, power, out, state, den)
    grad_out, q, k, v, power, out, state, den = (
        t.contiguous() for t in (grad_out, q, k, v, power, out, state, den))
    batch, heads, num_queries, d = q.shape
    n, dv = k.shape[2], v.shape[3]
    bh_count = batch * heads
    dq, dk, dv_out = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if bh_count == 0:
        return dq, dk, dv_out, power.new_zeros((heads, d), dtype=torch.float32)
    query_tiles, key_tiles = triton.cdiv(num_queries, TOKEN_TILE), triton.cdiv(n, TOKEN_TILE)
    channel_tiles = triton.cdiv(d, CHANNEL_TILE)
    chunks = _num_chunks(num_queries)
    state_grad_partial = q.new_empty((bh_count, chunks, 2 * d, dv + 2), dtype=torch.float32)
    query_power_partial = q.new_empty((batch, heads, query_tiles, d), dtype=torch.float32)
    key_power_partial = q.new_empty((batch, heads, key_tiles, d), dtype=torch.float32)
    if num_queries > 0:
        den_grad = q.new_empty((batch, heads, num_queries, 2), dtype=torch.float32)
        rows = bh_count * num_queries
        if out.dtype != torch.float32:
            # The normaliser's gradient -g.out/den cancels against g.y/den (exactly where the
            # output does not depend on q): out rounded to half precision would leave that
            # rounding in dq, so it is recomputed in fp32 from the saved state and den.
            out = q.new_empty(out.shape, dtype=torch.float32)
            wrap_triton(_feature_matmul_kernel)[(bh_count * query_tiles,
                                                 triton.cdiv(dv, COLUMN_TILE))](
                q, power, state, out, den, heads, num_queries, d, dv, dv + 2, 0.0,
                NORMALISE=True, SAVED_DEN=True, **_TILES)
        wrap_triton(_den_grad_kernel)[(triton.cdiv(rows, TOKEN_TILE), )](
            grad_out, out, den, den_grad, rows, dv, BLOCK_T=TOKEN_TILE, BLOCK_C=COLUMN_TILE)
        grid = (bh_count * chunks, channel_tiles, triton.cdiv(dv + 2, COLUMN_TILE))
        wrap_triton(_outer_reduce_kernel)[grid](
            q, power, grad_out, den, den_grad, state_grad_partial, heads, num_queries, d, dv,
            dv + 2, chunks, TILES_PER_CHUNK=CHUNK_TILES, QUERY=True, **_TILES)
        wrap_triton(_feature_grad_kernel)[(bh_count * query_tiles, channel_tiles)](
            q, power, grad_out, den, den_grad, state, dq, query_power_partial, heads,
            num_queries, d, dv, dv + 2, QUERY=True, **_TILES)
    key_grad = _key_state_grad(state_grad_partial.sum(dim=1), n, d, dv)
    wrap_triton(_feature_grad_kernel)[(bh_count * key_tiles, channel_tiles)](
        k, power, v, v, v, key_grad, dk, key_power_partial, heads, n, d, dv, dv + 1,
        QUERY=False, **_TILES)
    wrap_triton(_feature_matmul_kernel)[(bh_count * key_tiles, triton.cdiv(dv, COLUMN_TILE))](
        k, power, key_grad, dv_out, key_grad, heads, n, d, dv, dv + 1, 0.0, NORMALISE=False,
        **_TILES)
    dpower = query_power_partial.sum(dim=(0, 2)) + key_power_partial.sum(dim=(0, 2))
    return dq, dk, dv_out, dpower


INTERPRETED = interpreted()
# The schemas, fake kernels and autograd formula are the C++ operators' (compiled.py): one per op.
polarity_linear_attention_triton_forward, polarity_linear_attention_triton_backward = define_triton(
    OPERATORS, 'polarity_linear_attention_triton_forward', polarity_triton_forward,
    'polarity_linear_attention_triton_backward', polarity_triton_backward)
