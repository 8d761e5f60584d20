"""The input check every attention layer runs first."""
from typing import Tuple

import torch
from torch import nn

from mmlinattn.ops import check_finite_input


def check_token_input(layer: nn.Module, x: torch.Tensor, hw_shape: Tuple[int, int]) -> None:
    """``x`` must be ``[B, H*W, layer.embed_dims]`` for ``hw_shape = (H, W)``: a ``ValueError``
    otherwise, from shapes only (no host sync). Then the opt-in finite check
    (``MMLINATTN_CHECK_FINITE=1``), which does read values."""
    height, width = hw_shape
    if x.dim() != 3 or x.shape[1] != height * width or x.shape[2] != layer.embed_dims:
        raise ValueError(f'{type(layer).__name__}: x must be [B, H*W, {layer.embed_dims}] for '
                         f'hw_shape {tuple(hw_shape)}, got {list(x.shape)}')
    check_finite_input(layer, x)
