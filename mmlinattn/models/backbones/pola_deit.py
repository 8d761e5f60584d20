"""Pola-DeiT: a plain (DeiT-style) ViT with PolaFormer's polarity-aware linear attention in every block.

The official PolaFormer code has no DeiT model; this layout is ours (docs/ablations.md explains
the choices and the parameter count against the paper's 6.1M).
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.model.weight_init import trunc_normal_
from torch import nn

from mmlinattn.registry import MODELS
from ..layers import PolarityAttention, PreNormBlock, pad_if_needed, pad_to_multiple, resize_pos_embed
from .attn_cfg import check_attn_cfg
from .base import StagedBackbone


@MODELS.register_module()
class PolaDeiT(StagedBackbone):
    """Pola-DeiT backbone (``type='mmlinattn.PolaDeiT'``): one stage at stride 16.

    ``x -> Conv2d(C_in, C, 16, stride=16)`` (the image zero-padded on the bottom/right to a multiple
    of 16), ``+ pos_embed`` (learned on the ``pretrain_img_size / 16`` grid, resized bicubically),
    ``depth`` pre-norm blocks of :class:`PolarityAttention` (gate, DWC on v, learned power and
    scale; no spatial reduction) and an MLP of ratio 4, then LayerNorm. No class token: the
    classifier averages the tokens (``GlobalAveragePooling + LinearClsHead``), as the Pola-PVT
    classifier does, so every token is an image patch and the attention's DWC sees the whole grid.

    By default the blocks carry no positional encoding of their own (the polarity attention's
    ``positional_encoding`` on k, ``[1, n, C]`` per block): the ViT's ``pos_embed`` already places
    every token, and with the per-block encodings Pola-DeiT-T would have 6.64M parameters
    against the paper's 6.1M (6.19M without them). ``block_pos_encoding=True`` adds them.

    Output: ``(LN(tokens) as [B, C, ceil(H/16), ceil(W/16)],)``.

    Args:
        arch: 'tiny' (DeiT-T: 192 channels, 12 blocks, 3 heads) | 'small' (DeiT-S: 384, 12, 6), or
            a dict with ``embed_dims``, ``depth``, ``num_heads`` (and optionally ``mlp_ratio``).
        in_channels: image channels.
        pretrain_img_size: the input size the position embeddings are defined for.
        qkv_bias: bias of the attention's input projections.
        attn_cfg: the settings of every :class:`PolarityAttention` (its keyword-only arguments:
            ``alpha``, ``kernel_size``, ``polarity``, ``power``, ``fixed_power``, ``eps``), passed
            unchanged; the layer holds their defaults and checks them (docs/ablations.md).
        block_pos_encoding: give each block's attention its positional encoding on k.
        drop_rate: dropout after the position embedding, the attention projection and in the MLP.
        drop_path_rate: stochastic depth, rising linearly over the blocks to this value.
        out_indices: (0,), the one stage.
        frozen_stages: 1 freezes everything (patch and position embedding, blocks, norm); -1 or 0
            nothing.
        norm_eval: no BatchNorm here; kept for config compatibility.
        with_cp: gradient checkpointing of every block.
        init_cfg: ``dict(type='Pretrained', checkpoint=...)`` or None (truncated-normal linear
            layers and position embedding, as DeiT).
    """

    num_stages = 1
    arch_settings: Dict[str, dict] = {
        'tiny': dict(embed_dims=192, depth=12, num_heads=3),
        'small': dict(embed_dims=384, depth=12, num_heads=6),
    }
    arch_defaults = dict(mlp_ratio=4.0)
    keys_allowed_missing = ()
    patch_size = 16
    out_strides = (patch_size, )
    norm_eps = 1e-6

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 pretrain_img_size: int = 224,
                 qkv_bias: bool = True,
                 attn_cfg: Optional[dict] = None,
                 block_pos_encoding: bool = False,
                 drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1,
                 out_indices: Sequence[int] = (0, ),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg=None,
                 **unknown_kwargs):
        attn_cfg = check_attn_cfg(type(self).__name__, PolarityAttention, attn_cfg, unknown_kwargs)
        super().__init__(arch, out_indices, frozen_stages, norm_eval, init_cfg, in_channels)
        self.embed_dims = self.arch['embed_dims']
        self.depth = self.arch['depth']
        self.num_heads = self.arch['num_heads']
        self.pretrain_img_size = pretrain_img_size
        self.pos_grid = (pretrain_img_size // self.patch_size, ) * 2

        dims = self.embed_dims
        self.patch_embed = nn.Conv2d(in_channels, dims, self.patch_size, stride=self.patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.pos_grid[0] * self.pos_grid[1], dims))
        self.pos_drop = nn.Dropout(drop_rate)
        drop_path_rates = torch.linspace(0, drop_path_rate, self.depth, device='cpu').tolist()
        self.blocks = nn.ModuleList(
            PreNormBlock(PolarityAttention(dims, self.num_heads,
                                           pos_grid=self.pos_grid if block_pos_encoding else None,
                                           qkv_bias=qkv_bias, proj_drop=drop_rate, **attn_cfg),
                         dims, self.arch['mlp_ratio'], norm_cfg=dict(type='LN', eps=self.norm_eps),
                         drop_rate=drop_rate, drop_path_rate=rate, with_cp=with_cp)
            for rate in drop_path_rates)
        self.norm = nn.LayerNorm(dims, eps=self.norm_eps)
        self._freeze_stages()

    def stage_channels(self) -> List[int]:
        return [self.embed_dims]

    def stage_modules(self, i: int) -> List[nn.Module]:
        return [self.patch_embed, self.blocks, self.norm]

    def stage_parameters(self, i: int) -> List[nn.Parameter]:
        return [self.pos_embed]

    def init_default_weights(self) -> None:
        super().init_default_weights()
        trunc_normal_(self.pos_embed, std=0.02)

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor]:
        """x: [B, C_in, H, W] -> ([B, C, ceil(H/16), ceil(W/16)],)."""
        p = self.patch_size
        padding = (0, pad_to_multiple(x.shape[-1], p), 0, pad_to_multiple(x.shape[-2], p))
        x = self.patch_embed(pad_if_needed(x, padding))
        batch, _, height, width = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        pos = resize_pos_embed(self.pos_embed, self.pos_grid, (height, width))
        tokens = self.pos_drop(tokens + pos.to(tokens.dtype))
        for block in self.blocks:
            tokens = block(tokens, (height, width))
        out = self.norm(tokens).transpose(1, 2).reshape(batch, -1, height, width)
        return (out.contiguous(), )
