"""Learned absolute position embeddings defined on a fixed grid, resized to the actual feature size."""
from typing import Tuple

import torch
import torch.nn.functional as F

from mmlinattn.ops import compute_dtype


def resize_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int], dst_shape: Tuple[int, int],
                     mode: str = 'bicubic') -> torch.Tensor:
    """Resize a grid position embedding ``[1, Hs*Ws, C]`` to ``[1, Hd*Wd, C]``.

    The tokens are laid out row-major on an ``Hs x Ws`` grid; the grid is interpolated (bicubic by
    default, ``align_corners=False``) to ``Hd x Wd``. Returns ``pos_embed`` itself when the shapes match.
    """
    src_h, src_w = src_shape
    dst_h, dst_w = dst_shape
    if pos_embed.dim() != 3 or pos_embed.shape[1] != src_h * src_w:
        raise ValueError(f'pos_embed must be [1, {src_h}*{src_w}, C] for src_shape {tuple(src_shape)}, '
                         f'got {list(pos_embed.shape)}')
    if (src_h, src_w) == (dst_h, dst_w):
        return pos_embed
    channels = pos_embed.shape[2]
    grid = pos_embed.reshape(1, src_h, src_w, channels).permute(0, 3, 1, 2)
    # bicubic upsampling is not implemented for bf16/fp16 on every device: interpolate in fp32
    # (fp64 stays fp64).
    grid = F.interpolate(grid.to(compute_dtype(pos_embed.dtype)), size=(dst_h, dst_w), mode=mode, align_corners=False)
    return grid.to(pos_embed.dtype).flatten(2).transpose(1, 2)
