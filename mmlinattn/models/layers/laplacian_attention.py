"""LaplacianFormer's attention: normalised Laplacian-kernel attention, Nyström-approximated.

With ``K(a, b) = exp(-||a - b||_1 / lam)`` and a shared query/key projection ``q`` (so the landmark
Gram matrix is symmetric positive definite), a head computes

    C = K(q, q~)                [N, m]     q~: m landmarks pooled from q
    W = (K(q~, q~) + eps*I)^-1  [m, m]     Newton–Schulz, in fp32
    y = C (W (C^T v)) / C (W (C^T 1))      right to left: O(N m d), never [N, N]

With m = N landmarks equal to the tokens this is exactly ``D^-1 K(q, q) v`` (``D = diag(K 1)``);
``landmark_ratio=1`` computes that exact form directly.
"""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from mmlinattn.ops import check_finite_input, compute_dtype, laplacian_kernel, newton_schulz_inverse


def _normalise(num_den: torch.Tensor, den_eps: float) -> torch.Tensor:
    """[..., Dv + 1] holding the numerator and, last, the row sum -> numerator / clamp(row sum)."""
    num, den = num_den[..., :-1], num_den[..., -1:]
    return num / den.clamp(min=den_eps)


def _append_ones(v: torch.Tensor) -> torch.Tensor:
    """[..., N, Dv] -> [..., N, Dv + 1]: the extra column carries the normaliser through the products."""
    return torch.cat([v, v.new_ones(v.shape[:-1] + (1, ))], dim=-1)


def exact_laplacian_attention(q: torch.Tensor, v: torch.Tensor, lam: float = 4.0,
                              den_eps: float = 1e-6) -> torch.Tensor:
    """``y = D^-1 K v`` with ``K = K(q, q)`` and ``D = diag(K 1)``.

    q: [B, H, N, D], v: [B, H, N, Dv] -> [B, H, N, Dv]. Quadratic in N: for the stride-32 stage.
    """
    kernel = laplacian_kernel(q, q, lam)
    return _normalise(kernel @ _append_ones(v).to(kernel.dtype), den_eps)


def landmark_inverse_gram(landmarks: torch.Tensor, lam: float = 4.0, ns_iters: int = 20,
                          ns_eps: float = 1e-2) -> torch.Tensor:
    """``W = (K(q~, q~) + ns_eps*I)^-1`` by Newton–Schulz, always in fp32 (fp64 stays fp64).

    landmarks: [B, H, M, D] -> [B, H, M, M]. Autocast is disabled here: the iteration squares its
    error each step, and in bf16 it stalls at ~1e-2 or diverges on ill-conditioned Gram matrices.
    """
    dtype = compute_dtype(landmarks.dtype)
    with torch.autocast(device_type=landmarks.device.type, enabled=False):
        landmarks = landmarks.to(dtype)
        gram = laplacian_kernel(landmarks, landmarks, lam)
        return newton_schulz_inverse(gram, iters=ns_iters, eps=ns_eps)


def nystrom_laplacian_attention(q: torch.Tensor, landmarks: torch.Tensor, v: torch.Tensor,
                                lam: float = 4.0, ns_iters: int = 20, ns_eps: float = 1e-2,
                                den_eps: float = 1e-6) -> torch.Tensor:
    """``y = C (W (C^T v)) / clamp(C (W (C^T 1)), den_eps)``, ``C = K(q, q~)``, ``W`` as above.

    q: [B, H, N, D], landmarks q~: [B, H, M, D], v: [B, H, N, Dv] -> [B, H, N, Dv].
    Cost O(N M (D + Dv) + M^3 ns_iters); memory O(N M).
    """
    cross = laplacian_kernel(q, landmarks.to(q.dtype), lam)  # C: [B, H, N, M]
    inverse_gram = landmark_inverse_gram(landmarks, lam, ns_iters, ns_eps)  # W: [B, H, M, M]
    v_ones = _append_ones(v).to(cross.dtype)  # [B, H, N, Dv + 1]
    context = cross.transpose(-2, -1) @ v_ones  # C^T [v, 1]: [B, H, M, Dv + 1]
    context = inverse_gram.to(context.dtype) @ context  # W C^T [v, 1]
    return _normalise(cross @ context, den_eps)  # C W C^T [v, 1] -> [B, H, N, Dv]


def _average_pool_matrix(size: torch.Tensor, limit: int, dtype: torch.dtype) -> torch.Tensor:
    """[out, size] with ``out = min(size, limit)``: row i averages the inputs
    ``floor(i*size/out) .. ceil((i+1)*size/out) - 1``, the windows of ``adaptive_avg_pool``
    (the identity when size <= limit)."""
    out = torch.clamp(size, max=limit)
    rows = torch.arange(out, device=size.device)[:, None]
    cols = torch.arange(size, device=size.device)[None, :]
    start = torch.div(rows * size, out, rounding_mode='floor')
    end = torch.div((rows + 1) * size + out - 1, out, rounding_mode='floor')
    window = ((cols >= start) & (cols < end)).to(dtype)
    return window / window.sum(-1, keepdim=True)


def capped_avg_pool2d_exportable(x: torch.Tensor, max_grid: Tuple[int, int]) -> torch.Tensor:
    """``adaptive_avg_pool2d(x, (min(H, gh), min(W, gw)))`` for x [..., H, W] as two matrix
    products whose sizes follow H and W, so an ONNX graph traced at one size stays right at any
    other (``adaptive_avg_pool2d`` to a fixed grid has no ONNX translation for dynamic sizes, and
    the "is the cap reached" branch would be frozen at the traced size). Used while exporting."""
    shape = torch._shape_as_tensor(x)
    rows = _average_pool_matrix(shape[-2], max_grid[0], x.dtype)
    cols = _average_pool_matrix(shape[-1], max_grid[1], x.dtype)
    return rows @ x @ cols.transpose(0, 1)


class LaplacianAttention(nn.Module):
    """Multi-head Laplacian-kernel attention with Nyström landmarks and a local depthwise branch.

    Per head (head dim ``d = embed_dims / num_heads``, stride ``s = landmark_ratio``):

    - ``q = W_q x * d^-1/2`` is both query and key; ``v = W_v x``.
    - landmarks ``q~ = GELU(LN(Conv2d(d, d, s, stride=s)(q as [B*h, d, H, W])))``, q zero-padded on
      the bottom/right to a multiple of s, so ``m = ceil(H/s) * ceil(W/s)``; the conv is shared
      by the heads. ``max_landmark_grid=(gh, gw)`` average-pools the conv output to at most
      ``gh x gw`` before the LN (``m <= gh*gw``): without it m grows with the image (``H*W/s^2``,
      1050 per head at 800x1333) and the Newton–Schulz step (``2 m^3`` per iteration) dominates;
      with the 224^2 grid (7x7) as cap, the 224^2 model is unchanged and the cost stays linear.
    - ``y = nystrom_laplacian_attention(q, q~, v)``; for ``s = 1`` the exact ``D^-1 K(q, q) v``.
    - ``out = W_o (y + DWConv_k(v))``, the local branch a depthwise k x k conv on v as an image.

    Args:
        embed_dims: channels C.
        num_heads: heads h, dividing C.
        landmark_ratio: s >= 1, the landmark pooling stride; 1 selects exact attention.
        lam: the kernel bandwidth.
        local_kernel_size: k of the depthwise local branch (odd); 0 disables it.
        qv_bias: bias of the q and v projections.
        proj_drop: dropout after the output projection.
        ns_iters, ns_eps: Newton–Schulz steps and diagonal shift of the Gram inverse.
        den_eps: lower clamp of the row normaliser.
        max_landmark_grid: None (m = ceil(H/s) * ceil(W/s)) or an int / (gh, gw) cap on the
            landmark grid.

    Shapes: ``forward(x [B, N, C], hw_shape=(H, W))`` with ``N = H*W`` -> [B, N, C].
    """

    def __init__(self, embed_dims: int, num_heads: int, landmark_ratio: int, lam: float = 4.0,
                 local_kernel_size: int = 3, qv_bias: bool = True, proj_drop: float = 0.0,
                 ns_iters: int = 20, ns_eps: float = 1e-2, den_eps: float = 1e-6,
                 max_landmark_grid: Optional[Union[int, Tuple[int, int]]] = None):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims must be divisible by num_heads, got {embed_dims} and '
                             f'{num_heads}')
        if (isinstance(landmark_ratio, bool) or not isinstance(landmark_ratio, int)
                or landmark_ratio < 1):
            raise ValueError(f'landmark_ratio must be a positive integer, got {landmark_ratio!r}')
        if not lam > 0:
            raise ValueError(f'lam must be positive, got {lam!r}')
        if local_kernel_size < 0 or (local_kernel_size and local_kernel_size % 2 == 0):
            raise ValueError(f'local_kernel_size must be odd (or 0 for none), got {local_kernel_size}')
        if isinstance(max_landmark_grid, int):
            max_landmark_grid = (max_landmark_grid, max_landmark_grid)
        if max_landmark_grid is not None and (len(max_landmark_grid) != 2
                                              or min(max_landmark_grid) < 1):
            raise ValueError(f'max_landmark_grid must be None, a positive int or (gh, gw), got '
                             f'{max_landmark_grid!r}')
        self.max_landmark_grid = None if max_landmark_grid is None else tuple(max_landmark_grid)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.landmark_ratio = landmark_ratio
        self.lam = float(lam)
        self.ns_iters = ns_iters
        self.ns_eps = ns_eps
        self.den_eps = den_eps
        self.scale = self.head_dims**-0.5

        self.q = nn.Linear(embed_dims, embed_dims, bias=qv_bias)
        self.v = nn.Linear(embed_dims, embed_dims, bias=qv_bias)
        if landmark_ratio > 1:
            self.landmark_conv = nn.Conv2d(self.head_dims, self.head_dims, kernel_size=landmark_ratio,
                                           stride=landmark_ratio, bias=False)
            self.landmark_norm = nn.LayerNorm(self.head_dims)
            self.landmark_act = nn.GELU()
        self.local_conv = (nn.Conv2d(embed_dims, embed_dims, local_kernel_size,
                                     padding=local_kernel_size // 2, groups=embed_dims)
                           if local_kernel_size else None)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        return (f'num_heads={self.num_heads}, landmark_ratio={self.landmark_ratio}, lam={self.lam}, '
                f'ns_iters={self.ns_iters}, ns_eps={self.ns_eps}, '
                f'max_landmark_grid={self.max_landmark_grid}')

    def landmarks(self, q: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """q: [B, h, N, d] -> q~: [B, h, m, d], ``m = ceil(H/s) * ceil(W/s)`` (capped, see above)."""
        batch, heads, _, head_dims = q.shape
        height, width = hw_shape
        s = self.landmark_ratio
        grid = q.reshape(batch * heads, height, width, head_dims).permute(0, 3, 1, 2)
        grid = F.pad(grid, (0, (-width) % s, 0, (-height) % s))
        pooled = self.landmark_conv(grid)  # [B*h, d, ceil(H/s), ceil(W/s)]
        if self.max_landmark_grid is not None and torch.onnx.is_in_onnx_export():
            pooled = capped_avg_pool2d_exportable(pooled, self.max_landmark_grid)
        elif self.max_landmark_grid is not None:
            cap = tuple(min(size, limit)
                        for size, limit in zip(pooled.shape[2:], self.max_landmark_grid))
            if cap != tuple(pooled.shape[2:]):
                pooled = F.adaptive_avg_pool2d(pooled, cap)
        # [B*h, m, d]: a view when pooled is channels-last, as the conv of the q view makes it
        pooled = pooled.permute(0, 2, 3, 1).reshape(batch * heads, -1, head_dims)
        pooled = self.landmark_act(self.landmark_norm(pooled))
        return pooled.reshape(batch, heads, -1, head_dims)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        batch, num_tokens, channels = x.shape
        height, width = hw_shape
        if num_tokens != height * width or channels != self.embed_dims:
            raise ValueError(f'x must be [B, H*W, {self.embed_dims}] for hw_shape {tuple(hw_shape)}, '
                             f'got {list(x.shape)}')
        check_finite_input(self, x)  # only with MMLINATTN_CHECK_FINITE=1

        def split_heads(t):  # [B, N, C] -> [B, h, N, d], a view
            return t.reshape(batch, num_tokens, self.num_heads, self.head_dims).transpose(1, 2)

        # q = W_q x * d^-1/2, the scale folded into the projection and q made contiguous once: the
        # kernels, the landmark conv (which sees a view of it) and the backward need no more copies.
        q_bias = None if self.q.bias is None else self.q.bias * self.scale
        q = split_heads(F.linear(x, self.q.weight * self.scale, q_bias)).contiguous()
        v_tokens = self.v(x)
        v = split_heads(v_tokens)
        if self.landmark_ratio == 1:
            y = exact_laplacian_attention(q, v, self.lam, self.den_eps)
        else:
            y = nystrom_laplacian_attention(q, self.landmarks(q, hw_shape), v, self.lam,
                                            self.ns_iters, self.ns_eps, self.den_eps)
        y = y.transpose(1, 2).reshape(batch, num_tokens, channels).to(v_tokens.dtype)
        if self.local_conv is not None:  # on v as a channels-last image: views, no copies
            v_image = v_tokens.reshape(batch, height, width, channels).permute(0, 3, 1, 2)
            local = self.local_conv(v_image).permute(0, 2, 3, 1)
            y = y + local.reshape(batch, num_tokens, channels)
        return self.proj_drop(self.proj(y))
