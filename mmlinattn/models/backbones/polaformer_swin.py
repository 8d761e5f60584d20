"""Pola-Swin: Swin with global polarity-aware linear attention in stages 1-2, shifted windows after
(docs/models/polaformer.md)."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.model.weight_init import trunc_normal_
from torch import nn

from mmlinattn.registry import MODELS
from ..layers import PatchEmbed, PatchMerging, PolarityAttention, PreNormBlock, ShiftedWindowAttention
from .attn_cfg import check_attn_cfg
from .base import StagedBackbone, StateDict
from .polaformer_converter import (check_official_settings, convert_official,
                                   is_official_polaformer)

ATTN_TYPES = ('polarity', 'window')


class PolaSwinStage(nn.Module):
    """One stage as the official ``layers.{i}``: ``blocks`` and the ``downsample`` that follows them."""

    def __init__(self, blocks: List[PreNormBlock], downsample: Optional[PatchMerging]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


@MODELS.register_module()
class PolaSwin(StagedBackbone):
    """Pola-Swin backbone (``type='mmlinattn.PolaSwin'``), laid out as the official model.

    A 4x4 patch embedding (+ LayerNorm), then four stages of pre-norm blocks (MLP ratio 4) with
    :class:`PatchMerging` between them. Stages with ``attn_types[i] == 'polarity'`` (1 and 2 by
    default) use :class:`PolarityAttention` over the whole feature map: the official code gives
    them a window as large as the 224^2 map (56, then 28), so they are global and unshifted, and
    their positional encodings (56^2 and 28^2 tokens) are resized bicubically to the actual map.
    Stages with ``'window'`` use :class:`ShiftedWindowAttention` with ``window_size`` 7, shifted in
    every odd block, the map zero-padded to a multiple of the window and the shifted regions masked.
    The full-map positional encodings are what the published parameter counts require:
    Pola-Swin-T has 29.29M parameters with them (S 50.60M, B 89.14M; published 29.3/50.6/89.1),
    and 28.41M with 7x7 ones.

    Output i is LayerNorm ``norm{i}`` of stage i as ``[B, C*2^i, ceil(H / 2^(i+2)),
    ceil(W / 2^(i+2))]``; ``norm3`` is the official final ``norm``, so ``out_indices=(3,)`` followed
    by global average pooling and a linear head is the official classifier.

    Args:
        arch: 'tiny' | 'small' | 'base', or a dict with ``embed_dims`` (int), ``depths``,
            ``num_heads`` (and optionally ``attn_types``).
        in_channels: image channels.
        pretrain_img_size: the input size the positional encodings are defined for.
        window_size: of the window stages.
        mlp_ratio: hidden width of the MLPs / channels.
        qkv_bias: bias of the attention's input projections.
        attn_cfg: the settings of every :class:`PolarityAttention` of the polarity stages (its
            keyword-only arguments: ``alpha``, ``kernel_size``, ``polarity``, ``power``,
            ``fixed_power``, ``eps``), passed unchanged; the layer holds their defaults (the
            official model) and checks them. The ablations (docs/ablations.md) are ``attn_cfg``
            entries, e.g. ``dict(polarity='same')``.
        drop_rate, attn_drop_rate: dropout (patch embedding, projections, MLPs; window attention).
        drop_path_rate: stochastic depth, rising linearly over the blocks to this value.
        out_indices: stages whose (normalised) outputs are returned.
        frozen_stages: the first ``frozen_stages`` stages (with the patch embedding or the patch
            merging before them and their output norm) get no gradients and stay in eval mode;
            -1 or 0 freezes nothing.
        norm_eval: keep BatchNorm layers in eval mode while training; this backbone only has
            LayerNorms, so it changes nothing here and exists for config compatibility.
        with_cp: gradient checkpointing of every block.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL[, prefix='backbone.'])`` loads an
            official PolaFormer file (recognised by its keys and converted) or a converted one;
            None: the official initialisation (truncated normal linear layers and bias tables).
    """

    arch_settings: Dict[str, dict] = {
        'tiny': dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24]),
        'small': dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24]),
        'base': dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32]),
    }
    arch_defaults = dict(attn_types=('polarity', 'polarity', 'window', 'window'))
    per_stage_keys = ('depths', 'num_heads', 'attn_types')
    patch_size = 4

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 pretrain_img_size: int = 224,
                 window_size: int = 7,
                 mlp_ratio: float = 4.0,
                 qkv_bias: bool = True,
                 attn_cfg: Optional[dict] = None,
                 drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.2,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg=None,
                 **unknown_kwargs):
        attn_cfg = check_attn_cfg(type(self).__name__, PolarityAttention, attn_cfg, unknown_kwargs)
        super().__init__(arch, out_indices, frozen_stages, norm_eval, init_cfg, in_channels)
        self.depths = list(self.arch['depths'])
        self.num_heads = list(self.arch['num_heads'])
        self.attn_types = list(self.arch['attn_types'])
        if any(t not in ATTN_TYPES for t in self.attn_types):
            raise ValueError(f'arch attn_types must be drawn from {ATTN_TYPES}, got {self.attn_types}')
        self.embed_dims = [self.arch['embed_dims'] * 2**i for i in range(self.num_stages)]
        self.pretrain_img_size = pretrain_img_size
        self.window_size = window_size

        self.patch_embed = PatchEmbed(in_channels, self.embed_dims[0], self.patch_size)
        self.pos_drop = nn.Dropout(drop_rate)
        drop_path_rates = torch.linspace(0, drop_path_rate, sum(self.depths), device='cpu').tolist()
        self.layers = nn.ModuleList()
        for i in range(self.num_stages):
            dims = self.embed_dims[i]
            resolution = pretrain_img_size // (self.patch_size * 2**i)
            blocks = []
            for j in range(self.depths[i]):
                if self.attn_types[i] == 'polarity':
                    attn = PolarityAttention(dims, self.num_heads[i], pos_grid=(resolution, resolution),
                                             fused_qkvg=True, qkv_bias=qkv_bias, proj_drop=drop_rate,
                                             **attn_cfg)
                else:
                    attn = ShiftedWindowAttention(dims, self.num_heads[i], window_size, shift=j % 2 == 1,
                                                  qkv_bias=qkv_bias, attn_drop=attn_drop_rate,
                                                  proj_drop=drop_rate)
                blocks.append(PreNormBlock(attn, dims, mlp_ratio, drop_rate=drop_rate,
                                           drop_path_rate=drop_path_rates[sum(self.depths[:i]) + j],
                                           with_cp=with_cp))
            downsample = PatchMerging(dims) if i < self.num_stages - 1 else None
            self.layers.append(PolaSwinStage(blocks, downsample))
            if i in self.out_indices:
                self.add_module(f'norm{i}', nn.LayerNorm(dims))
        self._freeze_stages()

    def stage_modules(self, i: int) -> List[nn.Module]:
        """The modules of stage i (0-based) that ``frozen_stages`` freezes."""
        modules = [self.patch_embed if i == 0 else self.layers[i - 1].downsample, self.layers[i].blocks]
        if i in self.out_indices:
            modules.append(getattr(self, f'norm{i}'))
        return modules

    def init_default_weights(self) -> None:
        """The official initialisation: truncated-normal linear layers and bias tables."""
        super().init_default_weights()
        for module in self.modules():
            if isinstance(module, ShiftedWindowAttention):
                trunc_normal_(module.relative_position_bias_table, std=0.02)

    def convert_state_dict(self, state_dict: StateDict) -> Tuple[StateDict, Dict[str, str]]:
        """Official PolaFormer files (recognised by their keys) to this backbone's keys; a file made
        for another input (or window) size fails naming the settings to build with."""
        if is_official_polaformer(state_dict):
            check_official_settings(state_dict, 'swin', self)
            return convert_official(state_dict, 'swin')
        return state_dict, {}

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: [B, C_in, H, W] -> tuple of [B, C*2^i, ceil(H/s_i), ceil(W/s_i)], s_i = 4*2^i."""
        batch = x.shape[0]
        tokens, hw_shape = self.patch_embed(x)
        tokens = self.pos_drop(tokens)
        outs = []
        for i, layer in enumerate(self.layers):
            for block in layer.blocks:
                tokens = block(tokens, hw_shape)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(tokens)
                outs.append(out.transpose(1, 2).reshape(batch, -1, *hw_shape).contiguous())
            if layer.downsample is not None:
                tokens, hw_shape = layer.downsample(tokens, hw_shape)
        return tuple(outs)
