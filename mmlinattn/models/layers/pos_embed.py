"""Learned absolute position embeddings defined on a fixed grid, resized to the actual feature size."""
from typing import Tuple

import torch
import torch.nn.functional as F

from mmlinattn.ops import compute_dtype


def interpolation_matrix(src: int, dst: int, mode: str, dtype: torch.dtype,
                         device: torch.device) -> torch.Tensor:
    """[dst, src]: the 1-D ``F.interpolate(mode, align_corners=False)`` map from ``src`` to ``dst``
    samples, read off by interpolating the identity (computed in fp32, fp64 stays fp64)."""
    eye = torch.eye(src, dtype=compute_dtype(dtype), device=device)[None, :, :, None]  # [1, src, src, 1]
    return F.interpolate(eye, size=(dst, 1), mode=mode, align_corners=False)[0, :, :, 0].T.to(dtype)


def resize_pos_embed(pos_embed: torch.Tensor, src_shape: Tuple[int, int], dst_shape: Tuple[int, int],
                     mode: str = 'bicubic') -> torch.Tensor:
    """Resize a grid position embedding ``[1, Hs*Ws, C]`` to ``[1, Hd*Wd, C]``.

    The tokens are laid out row-major on an ``Hs x Ws`` grid; the grid is interpolated (bicubic by
    default, ``align_corners=False``) to ``Hd x Wd``. Returns ``pos_embed`` itself when the shapes match.

    Bicubic and bilinear interpolation are separable, so the resize is ``R_h P R_w^T`` with the 1-D
    maps ``R_h [Hd, Hs]``, ``R_w [Wd, Ws]`` (:func:`interpolation_matrix`): equal to
    ``F.interpolate`` on the grid up to rounding, two small matmuls in the embedding's dtype (bf16
    under autocast) instead of an fp32 resample whose backward scatters into the grid.
    """
    src_h, src_w = src_shape
    dst_h, dst_w = dst_shape
    if pos_embed.dim() != 3 or pos_embed.shape[1] != src_h * src_w:
        raise ValueError(f'pos_embed must be [1, {src_h}*{src_w}, C] for src_shape {tuple(src_shape)}, '
                         f'got {list(pos_embed.shape)}')
    if (src_h, src_w) == (dst_h, dst_w):
        return pos_embed
    channels = pos_embed.shape[2]
    rows = interpolation_matrix(src_h, dst_h, mode, pos_embed.dtype, pos_embed.device)
    cols = interpolation_matrix(src_w, dst_w, mode, pos_embed.dtype, pos_embed.device)
    grid = pos_embed.reshape(src_h, src_w * channels)
    grid = (rows @ grid).reshape(dst_h, src_w, channels)  # [Hd, Ws, C]
    grid = cols @ grid  # [Hd, Wd, C]
    return grid.reshape(1, dst_h * dst_w, channels)
