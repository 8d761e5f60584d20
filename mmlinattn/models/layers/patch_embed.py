"""Patch embedding (strided conv + LayerNorm) and Swin's 2x2 patch merging, for any input size.

Parameter names (``proj``/``norm``, ``norm``/``reduction``) are those of the official PVT, Swin and
PolaFormer checkpoints.
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .padding import pad_if_needed, pad_to_multiple


def patch_linear(grid: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """``conv`` (kernel p, stride p, no padding) as one matmul over the non-overlapping p x p patches.

    grid: channels-last [B, H, W, C_in] with H, W multiples of p -> [B, H/p, W/p, C_out]. Each
    patch is flattened in (row, column, channel) order and multiplied by the conv weight permuted to
    that order: the conv's result up to summation order, as a GEMM, which runs on the matrix units
    in bf16 where a strided convolution does not (and its backward is two more GEMMs).
    """
    batch, height, width, channels = grid.shape
    p = conv.stride[0]
    patches = grid.reshape(batch, height // p, p, width // p, p, channels).transpose(2, 3)
    patches = patches.reshape(batch, height // p, width // p, p * p * channels)
    weight = conv.weight.permute(0, 2, 3, 1).reshape(conv.out_channels, -1)
    return F.linear(patches, weight, conv.bias)


class PatchEmbed(nn.Module):
    """``LN(Conv2d(C_in, C, p, stride=p)(x))`` as tokens, the conv computed by :func:`patch_linear`.

    The image is zero-padded on the bottom/right to a multiple of p, so any size works and the grid
    is ``(ceil(H/p), ceil(W/p))``; sizes that are multiples of p are not padded.
    ``forward(x [B, C_in, H, W]) -> (tokens [B, H'*W', C], (H', W'))``.
    """

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int, norm_eps: float = 1e-5):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dims, eps=norm_eps)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        p = self.patch_size
        padding = (0, pad_to_multiple(x.shape[-1], p), 0, pad_to_multiple(x.shape[-2], p))
        tokens = patch_linear(pad_if_needed(x, padding).permute(0, 2, 3, 1), self.proj)  # [B, H', W', C]
        hw_shape = (tokens.shape[1], tokens.shape[2])
        return self.norm(tokens.flatten(1, 2)), hw_shape


class PatchMerging(nn.Module):
    """Swin's downsampling: each 2x2 patch's tokens concatenated, ``reduction(LN(.))`` to 2C.

    The concatenation order is (row 0, col 0), (row 1, col 0), (row 0, col 1), (row 1, col 1), as in
    the official Swin code. Odd sizes are zero-padded on the bottom/right.
    ``forward(x [B, H*W, C], (H, W)) -> ([B, ceil(H/2)*ceil(W/2), 2C], (ceil(H/2), ceil(W/2)))``.
    """

    def __init__(self, in_dims: int, norm_eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(4 * in_dims, eps=norm_eps)
        self.reduction = nn.Linear(4 * in_dims, 2 * in_dims, bias=False)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> Tuple[torch.Tensor, Tuple[int, int]]:
        batch, _, channels = x.shape
        height, width = hw_shape
        padding = (0, 0, 0, pad_to_multiple(width, 2), 0, pad_to_multiple(height, 2))
        grid = pad_if_needed(x.reshape(batch, height, width, channels), padding)
        grid = torch.cat([grid[:, 0::2, 0::2], grid[:, 1::2, 0::2], grid[:, 0::2, 1::2],
                          grid[:, 1::2, 1::2]], dim=-1)
        out_hw = (grid.shape[1], grid.shape[2])
        return self.reduction(self.norm(grid.reshape(batch, -1, 4 * channels))), out_hw
