"""PolaFormer's polarity-aware linear attention as a token-mixing layer (docs/models/polaformer.md).

For x: [B, N, C] on an H x W grid, h heads of d = C / h channels and n key tokens:

    q, g = split(qg(x))          k, v = split(kv(x_kv))       (or q, k, v, g = split(qkvg(x)))
    k = k + pos                  pos: learned [1, n, C], resized bicubically to the key grid
    s = softplus(scale)          q = q / s,  k = k / s
    p = 1 + alpha * sigmoid(power)                             power: [1, h, 1, d], alpha = 4
    y = polarity_linear_attention(q, k, v, p)                  [B, h, N, d], see mmlinattn.ops
    out = proj((y + DWC(v)) * g)                               DWC: Conv2d(d, d, 5, groups=d) per head

``x_kv`` is x, or ``LN(Conv2d(C, C, sr, stride=sr)(x))`` with a spatial reduction ``sr > 1``; the
n = (H//sr)(W//sr) values are then stretched back to N tokens for the DWC by a 1-D linear
interpolation over the flattened token sequence, which is what the official code does.
The parameter names (``qg``, ``kv``, ``qkvg``, ``power``, ``scale``, ``positional_encoding``,
``dwc``, ``proj``, ``sr``, ``norm``) are the official ones, so official checkpoints load unchanged.

Ablations (docs/ablations.md; the defaults are the official model):

- ``polarity='same'`` drops the opposite-sign stream; the whole of v goes through the same-sign
  one: ``y = phi_s(q) (phi(k)^T v / n) / (phi_s(q).z + eps)`` (:func:`same_sign_linear_attention`).
- ``power='fixed'``: ``p = fixed_power`` (3 by default) for every channel instead of the learned
  ``1 + alpha * sigmoid(power)``; the layer then has no ``power`` parameter.
- ``pos_grid=None``: no positional encoding on k.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from mmlinattn.ops import depthwise_conv2d, polarity_features, polarity_linear_attention
from mmlinattn.ops.polarity_attention import attention_dtype
from mmlinattn.ops.torch_compat import autocast_enabled
from .pos_embed import resize_pos_embed
from .token_input import check_token_input


POLARITIES = ('both', 'same')
POWERS = ('learned', 'fixed')


def same_sign_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, power: torch.Tensor,
                               eps: float = 1e-6) -> torch.Tensor:
    """PolaFormer's same-sign stream alone, over all of v (the ``polarity='same'`` ablation).

    q: [B, h, N, d], k: [B, h, n, d], v: [B, h, n, dv], power: [1, h, 1, d] -> [B, h, N, dv].
    With ``x+, x- = polarity_features(x, p)``, ``phi_s(q) = [q+, q-]``, ``phi(k) = [k+, k-]``
    and ``z = mean_j phi(k_j)``: ``y = phi_s(q) (phi(k)^T v / n) / (phi_s(q).z + eps)``, the
    normalisation of :func:`mmlinattn.ops.polarity_linear_attention`'s streams.
    """
    q_feat = torch.cat(polarity_features(q, power), dim=-1)  # [B, h, N, 2d]
    k_feat = torch.cat(polarity_features(k, power), dim=-1)  # [B, h, n, 2d]
    num_keys = k.shape[-2]
    state = k_feat.transpose(-2, -1) @ v * (1.0 / num_keys)  # [B, h, 2d, dv]
    normaliser = q_feat @ k_feat.mean(dim=-2).unsqueeze(-1) + eps  # [B, h, N, 1]
    return (q_feat @ state) / normaliser


class PolarityAttention(nn.Module):
    """Polarity-aware linear attention with a gate, a depthwise conv on v and a learned power.

    Args:
        embed_dims: channels C.
        num_heads: heads h, dividing C; d = C / h must be even (v is split into two halves).
        pos_grid: (Hp, Wp), the key grid the positional encoding is learned on (the training
            resolution's token grid divided by ``sr_ratio``); it is resized to the actual one.
            None: no positional encoding.
        sr_ratio: spatial reduction of keys and values (Pola-PVT: 1); needs ``fused_qkvg=False``.
        fused_qkvg: one ``Linear(C, 4C)`` giving q, k, v, g (Pola-Swin) instead of ``qg`` and
            ``kv`` (Pola-PVT).
        qkv_bias: bias of the input projections.
        proj_drop: dropout after the output projection.

    The attention settings, keyword-only (a backbone's ``attn_cfg``; the defaults are the official
    model):

        kernel_size: of the depthwise conv on v.
        alpha: the learned power is ``1 + alpha * sigmoid(theta)``, in (1, 1 + alpha).
        eps: added to the normalisers of the attention.
        polarity: 'both' (same-sign and opposite-sign streams on the halves of v, the official
            model) or 'same' (the same-sign stream on all of v).
        power: 'learned' (the official ``1 + alpha * sigmoid(theta)``, ``theta`` the ``power``
            parameter) or 'fixed' (``fixed_power`` everywhere, no ``power`` parameter: a
            parameter that never gets a gradient would stall DistributedDataParallel and carry
            optimiser state for nothing, and the state dict says what the layer computes; an
            official checkpoint then loads with ``power`` listed as unexpected).
        fixed_power: the exponent of ``power='fixed'``, >= 1 (``relu(x)^p`` has a finite
            gradient at 0).

    Shapes: ``forward(x [B, H*W, C], hw_shape=(H, W))`` -> [B, H*W, C]. Everything after the input
    projections runs with autocast off in :func:`~mmlinattn.ops.polarity_attention.attention_dtype`
    of the projections' dtype: fp32 for fp16 (the powers overflow fp16), bf16 stays bf16, fp32 and
    fp64 unchanged.
    """

    def __init__(self, embed_dims: int, num_heads: int, pos_grid: Optional[Tuple[int, int]],
                 sr_ratio: int = 1, fused_qkvg: bool = False, qkv_bias: bool = True,
                 proj_drop: float = 0.0, *, kernel_size: int = 5, alpha: float = 4.0,
                 eps: float = 1e-6, polarity: str = 'both', power: str = 'learned',
                 fixed_power: float = 3.0):
        super().__init__()
        if embed_dims % num_heads != 0 or (embed_dims // num_heads) % 2 != 0:
            raise ValueError('embed_dims / num_heads must be an even integer (v is split in two), '
                             f'got embed_dims={embed_dims}, num_heads={num_heads}')
        if isinstance(sr_ratio, bool) or not isinstance(sr_ratio, int) or sr_ratio < 1:
            raise ValueError(f'sr_ratio must be a positive integer, got {sr_ratio!r}')
        if fused_qkvg and sr_ratio > 1:
            raise ValueError('fused_qkvg computes k and v from the full-resolution tokens, so it '
                             f'needs sr_ratio=1, got {sr_ratio}')
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f'kernel_size must be a positive odd integer, got {kernel_size}')
        if polarity not in POLARITIES:
            raise ValueError(f'polarity must be one of {POLARITIES}, got {polarity!r}')
        if power not in POWERS:
            raise ValueError(f'power must be one of {POWERS}, got {power!r}')
        if power == 'fixed' and not fixed_power >= 1:
            raise ValueError(f'fixed_power must be >= 1, got {fixed_power!r}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.pos_grid = None if pos_grid is None else (int(pos_grid[0]), int(pos_grid[1]))
        self.sr_ratio = sr_ratio
        self.fused_qkvg = fused_qkvg
        self.alpha = float(alpha)
        self.eps = eps
        self.polarity = polarity
        self.power_mode = power
        self.fixed_power = float(fixed_power)

        if fused_qkvg:
            self.qkvg = nn.Linear(embed_dims, 4 * embed_dims, bias=qkv_bias)
        else:
            self.qg = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
            self.kv = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(embed_dims, embed_dims, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(embed_dims)
        self.dwc = nn.Conv2d(self.head_dims, self.head_dims, kernel_size, padding=kernel_size // 2,
                             groups=self.head_dims)
        if power == 'learned':
            self.power = nn.Parameter(torch.zeros(1, num_heads, 1, self.head_dims))
        self.scale = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.positional_encoding = None if pos_grid is None else nn.Parameter(
            torch.zeros(1, self.pos_grid[0] * self.pos_grid[1], embed_dims))
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        power = (f'alpha={self.alpha}' if self.power_mode == 'learned' else
                 f'power=fixed {self.fixed_power}')
        return (f'num_heads={self.num_heads}, pos_grid={self.pos_grid}, sr_ratio={self.sr_ratio}, '
                f'{power}, polarity={self.polarity}')

    def feature_power(self) -> torch.Tensor:
        """The exponent p [1, h, 1, d]: ``1 + alpha * sigmoid(power)``, always in (1, 1 + alpha),
        or ``fixed_power`` everywhere with ``power='fixed'``."""
        if self.power_mode == 'fixed':
            return self.scale.new_full((1, self.num_heads, 1, self.head_dims), self.fixed_power)
        return 1 + self.alpha * torch.sigmoid(self.power)

    def _project(self, x: torch.Tensor, hw_shape: Tuple[int, int]):
        """x [B, N, C] -> q, k, v, g [B, tokens, C] and the key grid (Hk, Wk)."""
        batch, num_tokens, channels = x.shape
        if self.fused_qkvg:
            q, k, v, g = self.qkvg(x).reshape(batch, num_tokens, 4, channels).unbind(2)
            return q, k, v, g, tuple(hw_shape)
        q, g = self.qg(x).reshape(batch, num_tokens, 2, channels).unbind(2)
        kv_grid = tuple(hw_shape)
        if self.sr_ratio > 1:
            height, width = hw_shape
            if height < self.sr_ratio or width < self.sr_ratio:
                raise ValueError(f'the token grid {height}x{width} is smaller than sr_ratio='
                                 f'{self.sr_ratio}; use a larger input or a smaller sr_ratio')
            image = x.transpose(1, 2).reshape(batch, channels, height, width)
            reduced = self.sr(image)
            kv_grid = tuple(reduced.shape[-2:])
            x = self.norm(reduced.flatten(2).transpose(1, 2))
        k, v = self.kv(x).reshape(batch, -1, 2, channels).unbind(2)
        return q, k, v, g, kv_grid

    def _local_branch(self, v: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """DWC on v: [B, h, n, d] -> [B, N, C], the conv shared by the heads, channels-last
        (:func:`~mmlinattn.ops.depthwise_conv2d`, whose CPU weight gradient is the fast one)."""
        batch, heads, num_kv, head_dims = v.shape
        height, width = hw_shape
        num_tokens = height * width
        if num_kv != num_tokens:  # sr > 1: stretch the token sequence linearly, as the official code
            v = F.interpolate(v.transpose(-2, -1).reshape(batch * heads, head_dims, num_kv),
                              size=num_tokens, mode='linear')
            v = v.reshape(batch, heads, head_dims, num_tokens).transpose(-2, -1)
        image = v.reshape(batch * heads, height, width, head_dims).permute(0, 3, 1, 2)
        bias = self.dwc.bias
        out = depthwise_conv2d(image, self.dwc.weight.to(v.dtype),
                               None if bias is None else bias.to(v.dtype))
        return out.reshape(batch, heads * head_dims, num_tokens).transpose(1, 2)

    def attention_inputs(self, x: torch.Tensor, hw_shape: Tuple[int, int]):
        """What the polarity op receives, with autocast off after the input projections, in
        ``attention_dtype`` of the projections' dtype: q [B, h, N, d] and k [B, h, n, d]
        (``k + pos``, both divided by ``softplus(scale)``), v [B, h, n, d], the gate g [B, N, C],
        the power [1, h, 1, d] and the key grid (Hk, Wk). The forward pass and the analysis tools
        both read the layer through it."""
        batch = x.shape[0]
        q, k, v, g, kv_grid = self._project(x, hw_shape)
        dtype = attention_dtype(q.dtype)
        with torch.autocast(device_type=x.device.type, enabled=False):
            q, k, v, g = (t.to(dtype) for t in (q, k, v, g))
            if self.positional_encoding is not None:
                k = k + resize_pos_embed(self.positional_encoding.to(dtype), self.pos_grid, kv_grid)
            scale = F.softplus(self.scale.to(dtype))
            q = q / scale
            k = k / scale

            def split_heads(t):  # [B, n, C] -> [B, h, n, d]
                return t.reshape(batch, -1, self.num_heads, self.head_dims).transpose(1, 2)

            power = self.feature_power().to(dtype)
            return split_heads(q), split_heads(k), split_heads(v), g, power, kv_grid

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        check_token_input(self, x, hw_shape)
        batch, num_tokens, channels = x.shape
        q, k, v, g, power, _ = self.attention_inputs(x, hw_shape)
        with torch.autocast(device_type=x.device.type, enabled=False):
            if self.polarity == 'same':
                y = same_sign_linear_attention(q, k, v, power, self.eps)
            else:
                y = polarity_linear_attention(q, k, v, power, self.eps)
            y = y.transpose(1, 2).reshape(batch, num_tokens, channels)
            y = (y + self._local_branch(v, hw_shape)) * g
        if not autocast_enabled(x.device.type):  # under autocast, proj casts y itself
            y = y.to(x.dtype)
        return self.proj_drop(self.proj(y))
