"""LaplacianFormer's attention: normalised kernel attention, Nyström-approximated
(docs/models/laplacianformer.md: the maths and shapes; docs/ablations.md: the switches).

With a kernel ``K`` and a shared query/key projection ``q`` (so the landmark Gram matrix is
symmetric positive definite), a head computes

    C = K(q, q~)                [N, m]     q~: m landmarks pooled from q
    W = K(q~, q~) + eps*I       [m, m]     the landmark system, in fp32
    y = C (W^-1 (C^T v)) / C (W^-1 (C^T 1))      right to left: O(N m d), never [N, N]

The paper's model: ``K(a, b) = exp(-||a - b||_1 / lam)`` (``kernel='laplacian'``) and ``W^-1`` by
Newton–Schulz (``inverse='newton_schulz'``). The ablations swap one part each:

- ``kernel='gaussian'``: SOFT's ``K(a, b) = exp(-||a - b||_2^2 / 2)`` with SOFT's query scaling
  ``d^-1/4`` (instead of ``d^-1/2``), computed by matmuls as ``|a|^2 + |b|^2 - 2 a.b``, clamped at 0.
- ``inverse='exact'``: a Cholesky solve of ``W x = C^T [v, 1]``; ``inverse='conjugate_gradient'``:
  ``cg_iters`` conjugate-gradient steps on it from x = 0, each column its own system.

With m = N landmarks equal to the tokens this is exactly ``D^-1 K(q, q) v`` (``D = diag(K 1)``);
``landmark_ratio=1`` computes that exact form directly.
"""
import functools
from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from mmlinattn.ops import compute_dtype, depthwise_conv2d, laplacian_kernel, newton_schulz_inverse
from mmlinattn.ops.torch_compat import is_exporting
from .padding import pad_if_needed, pad_to_multiple
from .patch_embed import patch_linear
from .token_input import check_token_input

KERNELS = ('laplacian', 'gaussian')
INVERSES = ('newton_schulz', 'exact', 'conjugate_gradient')
Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Solver = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _normalise(num_den: torch.Tensor, den_eps: float) -> torch.Tensor:
    """[..., Dv + 1] holding the numerator and, last, the row sum -> numerator / clamp(row sum)."""
    num, den = num_den[..., :-1], num_den[..., -1:]
    return num / den.clamp(min=den_eps)


def _append_ones(v: torch.Tensor) -> torch.Tensor:
    """[..., N, Dv] -> [..., N, Dv + 1]: the extra column carries the normaliser through the products."""
    return torch.cat([v, v.new_ones(v.shape[:-1] + (1, ))], dim=-1)


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """SOFT's kernel ``exp(-||a_i - b_j||_2^2 / 2)``: a [..., N, D], b [..., M, D] -> [..., N, M].

    The squared distance is ``|a_i|^2 + |b_j|^2 - 2 a_i.b_j`` (matmuls, no [.., N, M, D] tensor),
    clamped at 0 where rounding makes it negative.
    """
    sq_dist = (a.square().sum(-1, keepdim=True) + b.square().sum(-1).unsqueeze(-2)
               - 2 * a @ b.transpose(-2, -1))
    return torch.exp(-0.5 * sq_dist.clamp(min=0))


def conjugate_gradient_solve(matrix: torch.Tensor, rhs: torch.Tensor, iters: int,
                             shift: float = 0.0) -> torch.Tensor:
    """``iters`` conjugate-gradient steps on ``(matrix + shift*I) x = rhs`` from ``x_0 = 0``.

    matrix: SPD [..., m, m], rhs: [..., m, k] -> x [..., m, k]; every column is its own system
    (its own step sizes), all batched. With ``r = rhs - P x`` and ``p`` the search direction::

        alpha = r.r / p.Pp,  x += alpha p,  r -= alpha Pp,  p = r + (r'.r' / r.r) p

    Plain tensor operations, so autograd differentiates through the iterations. A converged
    column (``r = 0``) stays put: the denominators are clamped at the dtype's smallest normal.
    """
    tiny = torch.finfo(rhs.dtype).tiny
    x = torch.zeros_like(rhs)
    residual = rhs
    direction = rhs
    residual_sq = rhs.square().sum(-2, keepdim=True)  # [..., 1, k]
    for _ in range(iters):
        projected = matrix @ direction + shift * direction
        alpha = residual_sq / (direction * projected).sum(-2, keepdim=True).clamp(min=tiny)
        x = x + alpha * direction
        residual = residual - alpha * projected
        new_residual_sq = residual.square().sum(-2, keepdim=True)
        direction = residual + (new_residual_sq / residual_sq.clamp(min=tiny)) * direction
        residual_sq = new_residual_sq
    return x


def cholesky_solve_spd(matrix: torch.Tensor, rhs: torch.Tensor, shift: float = 0.0) -> torch.Tensor:
    """``(matrix + shift*I)^-1 rhs`` by a Cholesky factorisation: [..., m, m], [..., m, k] -> [..., m, k].

    ``cholesky_ex`` does not check the factorisation on the host (no sync); a matrix that is not
    positive definite gives NaN instead of an error.
    """
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    factor, _ = torch.linalg.cholesky_ex(matrix + shift * eye)
    return torch.cholesky_solve(rhs, factor)


def landmark_gram(landmarks: torch.Tensor, kernel: Kernel) -> torch.Tensor:
    """``K(q~, q~)`` in fp32 (fp64 stays fp64) with autocast off: [B, H, M, D] -> [B, H, M, M]."""
    with torch.autocast(device_type=landmarks.device.type, enabled=False):
        landmarks = landmarks.to(compute_dtype(landmarks.dtype))
        return kernel(landmarks, landmarks)


def newton_schulz_solve(gram: torch.Tensor, rhs: torch.Tensor, iters: int,
                        shift: float) -> torch.Tensor:
    """``V rhs`` with ``V ~ (gram + shift*I)^-1`` after ``iters`` Newton–Schulz steps:
    gram [B, H, M, M] (fp32/fp64), rhs [B, H, M, k] -> rhs's dtype.

    V is computed with autocast off (the iteration squares its error each step; in bf16 it stalls
    at ~1e-2 or diverges on ill-conditioned Gram matrices), the product ``V rhs`` in rhs's dtype,
    as autocast would.
    """
    with torch.autocast(device_type=gram.device.type, enabled=False):
        inverse_gram = newton_schulz_inverse(gram, iters=iters, eps=shift)
    return inverse_gram.to(rhs.dtype) @ rhs


def solve_in_gram_dtype(solver: Callable[..., torch.Tensor], gram: torch.Tensor, rhs: torch.Tensor,
                        **kwargs) -> torch.Tensor:
    """``solver(gram, rhs, **kwargs)`` with rhs cast to gram's dtype and autocast off; the result in
    rhs's dtype (for :func:`cholesky_solve_spd` and :func:`conjugate_gradient_solve`)."""
    with torch.autocast(device_type=gram.device.type, enabled=False):
        return solver(gram, rhs.to(gram.dtype), **kwargs).to(rhs.dtype)


def exact_kernel_attention(q: torch.Tensor, v: torch.Tensor, kernel: Kernel, den_eps: float = 1e-6,
                           queries: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``y = D^-1 K v`` with ``K = kernel(queries, q)`` and ``D = diag(K 1)``; queries default to q.

    q: [B, H, N, D] (the keys), v: [B, H, N, Dv], queries: [B, H, Q, D] -> [B, H, Q, Dv].
    Quadratic in N: for the stride-32 stage.
    """
    weights = kernel(q if queries is None else queries, q)
    return _normalise(weights @ _append_ones(v).to(weights.dtype), den_eps)


def nystrom_attention(q: torch.Tensor, landmarks: torch.Tensor, v: torch.Tensor, kernel: Kernel,
                      solve: Solver, den_eps: float = 1e-6,
                      queries: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``y = C_Q (W^-1 (C^T v)) / clamp(C_Q (W^-1 (C^T 1)), den_eps)`` with ``C = kernel(q, q~)``
    and ``C_Q = kernel(queries, q~)``; queries default to q (then ``C_Q = C``).

    q: [B, H, N, D] (the keys), landmarks q~: [B, H, M, D], v: [B, H, N, Dv], queries:
    [B, H, Q, D] -> [B, H, Q, Dv]; ``solve(q~, rhs [B, H, M, k]) -> W^-1 rhs``. Cost
    O((N + Q) M (D + Dv)) plus the solve; memory O((N + Q) M).
    """
    cross = kernel(q, landmarks.to(q.dtype))  # C: [B, H, N, M]
    v_ones = _append_ones(v).to(cross.dtype)  # [B, H, N, Dv + 1]
    context = cross.transpose(-2, -1) @ v_ones  # C^T [v, 1]: [B, H, M, Dv + 1]
    context = solve(landmarks, context)  # W^-1 C^T [v, 1], the Gram matrix from the uncast q~
    cross_queries = (cross if queries is None else  # C_Q: [B, H, Q, M]
                     kernel(queries, landmarks.to(q.dtype)))
    return _normalise(cross_queries @ context, den_eps)  # C_Q W^-1 C^T [v, 1] -> [B, H, Q, Dv]


def _average_pool_matrix(size: Union[torch.Tensor, torch.SymInt], limit: int, dtype: torch.dtype,
                         device: torch.device) -> torch.Tensor:
    """[out, size] with ``out = min(size, limit)``: row i averages the inputs
    ``floor(i*size/out) .. ceil((i+1)*size/out) - 1``, the windows of ``adaptive_avg_pool``
    (the identity when size <= limit). ``size``: a 0-d tensor (TorchScript tracing) or a
    symbolic size (torch.export)."""
    out = (torch.clamp(size, max=limit) if isinstance(size, torch.Tensor) else
           torch.sym_min(size, limit))
    rows = torch.arange(out, device=device)[:, None]
    cols = torch.arange(size, device=device)[None, :]
    start = torch.div(rows * size, out, rounding_mode='floor')
    end = torch.div((rows + 1) * size + out - 1, out, rounding_mode='floor')
    window = ((cols >= start) & (cols < end)).to(dtype)
    return window / window.sum(-1, keepdim=True)


def capped_avg_pool2d_exportable(x: torch.Tensor, max_grid: Tuple[int, int]) -> torch.Tensor:
    """``adaptive_avg_pool2d(x, (min(H, gh), min(W, gw)))`` for x [..., H, W] as two matrix
    products whose sizes follow H and W, so an ONNX graph traced at one size stays right at any
    other (``adaptive_avg_pool2d`` to a fixed grid has no ONNX translation for dynamic sizes, and
    the "is the cap reached" branch would be frozen at the traced size). Used while exporting.

    The sizes are the traced tensor's shape as a tensor for the TorchScript tracer (which records
    the shape ops); under torch.export (the dynamo exporter), whose non-strict capture cannot read
    a shape tensor, they are its symbolic sizes."""
    shape = x.shape if is_exporting() else torch._shape_as_tensor(x)
    rows = _average_pool_matrix(shape[-2], max_grid[0], x.dtype, x.device)
    cols = _average_pool_matrix(shape[-1], max_grid[1], x.dtype, x.device)
    return rows @ x @ cols.transpose(0, 1)


class LaplacianAttention(nn.Module):
    """Multi-head Laplacian-kernel attention with Nyström landmarks and a local depthwise branch.

    Per head (head dim ``d = embed_dims / num_heads``, stride ``s = landmark_ratio``):

    - ``q = W_q x * d^-1/2`` (``d^-1/4`` with ``kernel='gaussian'``) is both query and key;
      ``v = W_v x``.
    - landmarks ``q~ = GELU(LN(Conv2d(d, d, s, stride=s)(q as [B*h, d, H, W])))``, q zero-padded on
      the bottom/right to a multiple of s, so ``m = ceil(H/s) * ceil(W/s)``; the conv is shared
      by the heads. ``max_landmark_grid=(gh, gw)`` average-pools the conv output to at most
      ``gh x gw`` before the LN (``m <= gh*gw``): without it m grows with the image (``H*W/s^2``,
      1050 per head at 800x1333) and the Newton–Schulz step (``2 m^3`` per iteration) dominates;
      with the 224^2 grid (7x7) as cap, the 224^2 model is unchanged and the cost stays linear.
    - ``y = nystrom_attention(q, q~, v, K, W^-1)`` (see the module docstring); for ``s = 1`` the
      exact ``D^-1 K(q, q) v``.
    - ``out = W_o (y + DWConv_k(v))``, the local branch a depthwise k x k conv on v as an image.

    Args:
        embed_dims: channels C.
        num_heads: heads h, dividing C.
        landmark_ratio: s >= 1, the landmark pooling stride; 1 selects exact attention.
        local_kernel_size: k of the depthwise local branch (odd); 0 disables it.
        proj_drop: dropout after the output projection.

    The attention settings, keyword-only (a backbone's ``attn_cfg``; the defaults are the paper's
    model):

        lam: the Laplacian kernel's bandwidth; None means 4. The Gaussian kernel has none (SOFT's
            ``exp(-||a - b||_2^2 / 2)``, its width set by the ``d^-1/4`` query scaling), so
            ``kernel='gaussian'`` needs ``lam=None``.
        kernel: 'laplacian' ``exp(-||a - b||_1 / lam)`` (the paper) or 'gaussian' (SOFT's).
        inverse: how ``W^-1 C^T [v, 1]`` is solved: 'newton_schulz' (the paper; ``ns_iters``
            steps from ``I / ||W||_inf``), 'exact' (Cholesky) or 'conjugate_gradient'
            (``cg_iters`` steps per column). All in fp32 (fp64 stays fp64).
        ns_iters: Newton–Schulz steps with ``inverse='newton_schulz'``.
        cg_iters: conjugate-gradient steps with ``inverse='conjugate_gradient'``.
        landmark_shift: the diagonal shift ``eps >= 0`` of the landmark system
            ``W = K(q~, q~) + eps*I``, which every inverse solves.
        max_landmark_grid: an int or (gh, gw) cap on the landmark grid; 7, the grid of a 224^2
            input in every LaplacianFormer stage, leaves the 224^2 model unchanged and keeps the
            cost linear in the pixels. None: ``m = ceil(H/s) * ceil(W/s)``, the paper-literal
            landmarks, which grow with the input (docs/models/laplacianformer.md).
        qv_bias: bias of the q and v projections.
        den_eps: lower clamp of the row normaliser.

    Shapes: ``forward(x [B, N, C], hw_shape=(H, W))`` with ``N = H*W`` -> [B, N, C].
    """

    def __init__(self, embed_dims: int, num_heads: int, landmark_ratio: int,
                 local_kernel_size: int = 3, proj_drop: float = 0.0, *, lam: Optional[float] = None,
                 kernel: str = 'laplacian', inverse: str = 'newton_schulz', ns_iters: int = 20,
                 cg_iters: int = 20, landmark_shift: float = 1e-2,
                 max_landmark_grid: Optional[Union[int, Tuple[int, int]]] = 7,
                 qv_bias: bool = True, den_eps: float = 1e-6):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims must be divisible by num_heads, got {embed_dims} and '
                             f'{num_heads}')
        if (isinstance(landmark_ratio, bool) or not isinstance(landmark_ratio, int)
                or landmark_ratio < 1):
            raise ValueError(f'landmark_ratio must be a positive integer, got {landmark_ratio!r}')
        if kernel not in KERNELS:
            raise ValueError(f'kernel must be one of {KERNELS}, got {kernel!r}')
        if inverse not in INVERSES:
            raise ValueError(f'inverse must be one of {INVERSES}, got {inverse!r}')
        if kernel == 'gaussian' and lam is not None:
            raise ValueError(f'lam is the Laplacian kernel\'s bandwidth; kernel=\'gaussian\' has '
                             f'none and needs lam=None, got lam={lam!r}')
        if kernel == 'laplacian':
            lam = 4.0 if lam is None else lam
            if not lam > 0:
                raise ValueError(f'lam must be positive, got {lam!r}')
        for name, iters in (('ns_iters', ns_iters), ('cg_iters', cg_iters)):
            if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
                raise ValueError(f'{name} must be a positive integer, got {iters!r}')
        if not landmark_shift >= 0:
            raise ValueError(f'landmark_shift must be >= 0, got {landmark_shift!r}')
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
        self.kernel = kernel
        self.inverse = inverse
        self.lam = None if lam is None else float(lam)
        self.ns_iters = ns_iters
        self.cg_iters = cg_iters
        self.landmark_shift = landmark_shift
        self.den_eps = den_eps
        # The kernel and the solver, chosen here once: the forward pass only calls them.
        self._kernel: Kernel = (gaussian_kernel if kernel == 'gaussian' else
                                functools.partial(laplacian_kernel, lam=self.lam))
        self._gram_solver: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = {
            'newton_schulz': functools.partial(newton_schulz_solve, iters=ns_iters,
                                               shift=landmark_shift),
            'exact': functools.partial(solve_in_gram_dtype, cholesky_solve_spd,
                                       shift=landmark_shift),
            'conjugate_gradient': functools.partial(solve_in_gram_dtype, conjugate_gradient_solve,
                                                    iters=cg_iters, shift=landmark_shift),
        }[inverse]
        # SOFT scales q by d^-1/4 before exp(-||q - k||^2 / 2), i.e. exp(q.k / sqrt(d)) up to the
        # norms, as softmax attention (fudan-zvg/SOFT, models/softmax_free_transformer.py).
        self.scale = self.head_dims**(-0.25 if kernel == 'gaussian' else -0.5)

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
        solver = {'newton_schulz': f'ns_iters={self.ns_iters}', 'exact': 'exact',
                  'conjugate_gradient': f'cg_iters={self.cg_iters}'}[self.inverse]
        return (f'num_heads={self.num_heads}, landmark_ratio={self.landmark_ratio}, '
                f'kernel={self.kernel}, lam={self.lam}, inverse={self.inverse} ({solver}), '
                f'landmark_shift={self.landmark_shift}, max_landmark_grid={self.max_landmark_grid}')

    def kernel_matrix(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``K(a_i, b_j)`` of this layer's kernel: a [B, h, N, d], b [B, h, M, d] -> [B, h, N, M]."""
        return self._kernel(a, b)

    def landmark_solve(self, landmarks: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
        """``(K(q~, q~) + landmark_shift*I)^-1 rhs`` by this layer's inverse, in fp32 (fp64 stays
        fp64): landmarks [B, h, m, d], rhs [B, h, m, k] -> [B, h, m, k] in rhs's dtype."""
        return self._gram_solver(landmark_gram(landmarks, self._kernel), rhs)

    def attend(self, q: torch.Tensor, landmarks: Optional[torch.Tensor], v: torch.Tensor,
               queries: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The kernel attention ``y = A v`` of :meth:`attention_inputs`' q, q~ and v: Nyström
        (:func:`nystrom_attention`) or, without landmarks, exact (:func:`exact_kernel_attention`).

        q: [B, h, N, d] (the keys), landmarks: [B, h, m, d] or None, v: [B, h, N, dv], queries:
        [B, h, Q, d] (default q) -> [B, h, Q, dv].
        """
        if landmarks is None:
            return exact_kernel_attention(q, v, self._kernel, self.den_eps, queries)
        return nystrom_attention(q, landmarks, v, self._kernel, self.landmark_solve, self.den_eps,
                                 queries)

    def attention_rows(self, q: torch.Tensor, landmarks: Optional[torch.Tensor],
                       query_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The rows ``A_i`` that :meth:`attend` applies to v, for the queries ``q[..., query_index, :]``
        (all when None): q [B, h, N, d], landmarks [B, h, m, d] or None -> [B, h, Q, N].

        :meth:`attend` with v the identity: ``A v`` is the layer's attention output up to
        rounding. Nyström rows sum to one but may hold small negative entries. Memory O(Q N).
        """
        batch, heads, num_tokens, _ = q.shape
        identity = torch.eye(num_tokens, dtype=q.dtype, device=q.device)
        queries = None if query_index is None else q[..., query_index, :]
        return self.attend(q, landmarks, identity.expand(batch, heads, num_tokens, num_tokens),
                           queries)

    def landmarks(self, q: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """q: [B, h, N, d] -> q~: [B, h, m, d], ``m = ceil(H/s) * ceil(W/s)`` (capped, see above)."""
        batch, heads, _, head_dims = q.shape
        height, width = hw_shape
        s = self.landmark_ratio
        grid = q.reshape(batch * heads, height, width, head_dims)
        grid = pad_if_needed(grid, (0, 0, 0, pad_to_multiple(width, s), 0, pad_to_multiple(height, s)))
        # [B*h, d, ceil(H/s), ceil(W/s)], a channels-last view of the conv's GEMM
        pooled = patch_linear(grid, self.landmark_conv).permute(0, 3, 1, 2)
        if self.max_landmark_grid is not None and torch.onnx.is_in_onnx_export():
            pooled = capped_avg_pool2d_exportable(pooled, self.max_landmark_grid)
        elif self.max_landmark_grid is not None:
            cap = tuple(min(size, limit)
                        for size, limit in zip(pooled.shape[2:], self.max_landmark_grid))
            if cap != tuple(pooled.shape[2:]):
                pooled = F.adaptive_avg_pool2d(pooled, cap)
        # [B*h, m, d]: a view when pooled is channels-last, as patch_linear returns it
        pooled = pooled.permute(0, 2, 3, 1).reshape(batch * heads, -1, head_dims)
        pooled = self.landmark_act(self.landmark_norm(pooled))
        return pooled.reshape(batch, heads, -1, head_dims)

    def attention_inputs(self, x: torch.Tensor, hw_shape: Tuple[int, int]):
        """x [B, N, C] -> q [B, h, N, d] (``W_q x`` scaled, query and key), the landmarks
        q~ [B, h, m, d] (None when ``landmark_ratio == 1``) and v [B, h, N, d]. The forward pass and
        the analysis tools both read the layer through it."""
        batch, num_tokens, _ = x.shape

        def split_heads(t):  # [B, N, C] -> [B, h, N, d], a view
            return t.reshape(batch, num_tokens, self.num_heads, self.head_dims).transpose(1, 2)

        # The scale folded into the projection and q made contiguous once: the kernels, the
        # landmark conv (which sees a view of it) and the backward need no more copies.
        q_bias = None if self.q.bias is None else self.q.bias * self.scale
        q = split_heads(F.linear(x, self.q.weight * self.scale, q_bias)).contiguous()
        v = split_heads(self.v(x))
        landmarks = self.landmarks(q, hw_shape) if self.landmark_ratio > 1 else None
        return q, landmarks, v

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        check_token_input(self, x, hw_shape)
        batch, num_tokens, channels = x.shape
        height, width = hw_shape
        q, landmarks, v = self.attention_inputs(x, hw_shape)
        y = self.attend(q, landmarks, v)
        y = y.transpose(1, 2).reshape(batch, num_tokens, channels).to(v.dtype)
        if self.local_conv is not None:  # v as a channels-last image [B, C, H, W]: views, no copies
            v_image = v.transpose(1, 2).reshape(batch, height, width, channels).permute(0, 3, 1, 2)
            local = depthwise_conv2d(v_image, self.local_conv.weight,
                                     self.local_conv.bias).permute(0, 2, 3, 1)
            y = y + local.reshape(batch, num_tokens, channels)
        return self.proj_drop(self.proj(y))
