"""Swin's (shifted) window multi-head self-attention with a relative position bias.

The map is zero-padded on the bottom/right to a multiple of the window size w, optionally rolled by
-w//2 (shifted windows), cut into w x w windows, and each window attends within itself:

    attn = softmax(q k^T * d^-1/2 + B[rel(i, j)] + mask)        B: [(2w-1)^2, h] learned table

``mask`` is -100 between tokens that the roll brought together from different image regions and 0
otherwise. When the padded map is a single window, shifting would only mix the map's own borders,
so it is switched off (as Swin and PolaFormer do for the 7x7 stage at 224x224). The parameter names
(``qkv``, ``proj``, ``relative_position_bias_table``) are the official Swin/PolaFormer ones.
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .padding import pad_if_needed, pad_to_multiple
from .token_input import check_token_input

MASK_VALUE = -100.0


def window_partition(x: torch.Tensor, window_size: int) -> torch.Tensor:
    """[B, H, W, C] (H, W multiples of w) -> [B * H/w * W/w, w*w, C], windows in row-major order."""
    batch, height, width, channels = x.shape
    x = x.reshape(batch, height // window_size, window_size, width // window_size, window_size,
                  channels)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window_size * window_size, channels)


def window_reverse(windows: torch.Tensor, window_size: int, height: int, width: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`: [B * nW, w*w, C] -> [B, H, W, C]."""
    channels = windows.shape[-1]
    x = windows.reshape(-1, height // window_size, width // window_size, window_size, window_size,
                        channels)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, height, width, channels)


def relative_position_index(window_size: int) -> torch.Tensor:
    """[w*w, w*w] index into the (2w-1)^2 table: ``(dy + w - 1) * (2w - 1) + (dx + w - 1)``."""
    coords = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size),
                                        indexing='ij')).flatten(1)  # [2, w*w]
    delta = coords[:, :, None] - coords[:, None, :] + (window_size - 1)  # [2, w*w, w*w]
    return delta[0] * (2 * window_size - 1) + delta[1]


def shifted_window_mask(height: int, width: int, window_size: int, shift: int,
                        device=None) -> torch.Tensor:
    """[nW, w*w, w*w] additive mask for a map (H, W multiples of w) rolled by ``-shift``.

    The rolled map has three bands per axis, [0, H-w), [H-w, H-shift), [H-shift, H); tokens of
    different (row band, column band) regions must not attend to each other.
    """
    region = torch.zeros(1, height, width, 1, device=device)
    bands = (slice(0, -window_size), slice(-window_size, -shift), slice(-shift, None))
    label = 0
    for rows in bands:
        for cols in bands:
            region[:, rows, cols, :] = label
            label += 1
    labels = window_partition(region, window_size).squeeze(-1)  # [nW, w*w]
    different = labels[:, None, :] != labels[:, :, None]
    return torch.zeros(different.shape, device=device).masked_fill(different, MASK_VALUE)


class ShiftedWindowAttention(nn.Module):
    """W-MSA (``shift=False``) or SW-MSA (``shift=True``) over a token grid of any size.

    Args:
        embed_dims: channels C.
        num_heads: heads h, dividing C.
        window_size: w.
        shift: roll the map by ``w // 2`` before partitioning (odd blocks of a Swin stage).
        qkv_bias: bias of the qkv projection.
        attn_drop, proj_drop: dropout on the attention weights and after the output projection.

    Shapes: ``forward(x [B, H*W, C], hw_shape=(H, W))`` -> [B, H*W, C].
    """

    def __init__(self, embed_dims: int, num_heads: int, window_size: int = 7, shift: bool = False,
                 qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims must be divisible by num_heads, got {embed_dims} and '
                             f'{num_heads}')
        if window_size < 2:
            raise ValueError(f'window_size must be at least 2, got {window_size}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.window_size = window_size
        self.shift_size = window_size // 2 if shift else 0
        self.qkv = nn.Linear(embed_dims, 3 * embed_dims, bias=qkv_bias)
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1)**2, num_heads))
        self.register_buffer('relative_position_index', relative_position_index(window_size),
                             persistent=False)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        return f'num_heads={self.num_heads}, window_size={self.window_size}, shift_size={self.shift_size}'

    def window_attention(self, windows: torch.Tensor, mask: torch.Tensor = None) -> torch.Tensor:
        """Softmax attention inside each window: [B*nW, w*w, C] -> [B*nW, w*w, C].

        mask: [nW, w*w, w*w] additive, or None.
        """
        num_windows_batch, tokens, channels = windows.shape
        qkv = self.qkv(windows).reshape(num_windows_batch, tokens, 3, self.num_heads, self.head_dims)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B*nW, h, w*w, d]
        attn = (q * self.head_dims**-0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
        attn = attn + bias.reshape(tokens, tokens, self.num_heads).permute(2, 0, 1).to(attn.dtype)
        if mask is not None:
            num_windows = mask.shape[0]
            attn = attn.reshape(-1, num_windows, self.num_heads, tokens, tokens)
            attn = (attn + mask[None, :, None].to(attn.dtype)).reshape(-1, self.num_heads, tokens, tokens)
        attn = self.attn_drop(attn.softmax(dim=-1))
        out = (attn @ v).transpose(1, 2).reshape(num_windows_batch, tokens, channels)
        return self.proj_drop(self.proj(out))

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        check_token_input(self, x, hw_shape)
        batch, num_tokens, channels = x.shape
        height, width = hw_shape
        w = self.window_size
        padding = (0, 0, 0, pad_to_multiple(width, w), 0, pad_to_multiple(height, w))
        grid = pad_if_needed(x.reshape(batch, height, width, channels), padding)
        padded_h, padded_w = grid.shape[1:3]
        shift = self.shift_size if (padded_h > w or padded_w > w) else 0
        mask = None
        if shift:
            grid = torch.roll(grid, shifts=(-shift, -shift), dims=(1, 2))
            mask = shifted_window_mask(padded_h, padded_w, w, shift, device=x.device)
        out = window_reverse(self.window_attention(window_partition(grid, w), mask), w, padded_h,
                             padded_w)
        if shift:
            out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
        return out[:, :height, :width, :].reshape(batch, num_tokens, channels)
