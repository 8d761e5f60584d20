"""The pre-norm transformer block of every backbone."""
from typing import Tuple

import torch
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from torch import nn

from .mlp import Mlp


class PreNormBlock(nn.Module):
    """``x + DropPath(attn(LN(x), hw))``, then ``x + DropPath(mlp(LN(x)))``.

    Args:
        attn: a token mixer called as ``attn(x [B, N, C], hw_shape) -> [B, N, C]``.
        embed_dims: channels C.
        mlp_ratio: hidden width of the MLP / C.
        norm_cfg: the two norms (mmcv ``build_norm_layer`` config).
        drop_rate: dropout inside the MLP.
        drop_path_rate: stochastic depth of both residual branches.
        with_cp: recompute the block in the backward pass (gradient checkpointing).

    Parameter names (``norm1``, ``attn``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``) follow the official
    PVT/Swin/PolaFormer checkpoints.
    """

    def __init__(self, attn: nn.Module, embed_dims: int, mlp_ratio: float = 4.0,
                 norm_cfg: dict = dict(type='LN', eps=1e-5), drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = attn
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop=drop_rate)

    def _forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), hw_shape))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self._forward, x, hw_shape, use_reentrant=False)
        return self._forward(x, hw_shape)
