"""Pola-PVT: the PVT (v1) pyramid with PolaFormer's polarity-aware linear attention in every block
(docs/models/polaformer.md)."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.model.weight_init import trunc_normal_
from torch import nn

from mmlinattn.registry import MODELS
from ..layers import PatchEmbed, PolarityAttention, PreNormBlock, resize_pos_embed
from .attn_cfg import check_attn_cfg
from .base import StagedBackbone, StateDict
from .polaformer_converter import (check_official_settings, convert_official,
                                   is_official_polaformer)


@MODELS.register_module()
class PolaPVT(StagedBackbone):
    """Pola-PVT backbone (``type='mmlinattn.PolaPVT'``), laid out as the official model.

    Stage i (stride ``4 * 2^i``): ``patch_embed{i+1}`` (conv 4x4 s4 for the first stage, 2x2 s2
    after, + LayerNorm), the learned ``pos_embed{i+1}`` of a ``pretrain_img_size`` input resized
    bilinearly to the actual grid (as the official ``_get_pos_embed``), and ``block{i+1}``: pre-norm
    blocks of :class:`PolarityAttention` (spatial reduction ``sr_ratios[i]``) and an MLP of ratio
    ``mlp_ratios[i]``. The official classifier averages the last stage's tokens without a norm, so
    the outputs carry no norm either: ``GlobalAveragePooling + LinearClsHead`` on output 3 is the
    official classifier.

    The architecture follows the official ``pola_pvt_*`` (FLatten-PVT code): dims 64/128/320/512,
    heads 1/2/5/8, MLP ratios 8/8/4/4, qkv bias, block LayerNorm eps 1e-6 (patch-embed eps 1e-5),
    no cls token, and ``sr_ratios`` 1/1/1/1 (the official ``PVT_LA_SR_RATIOS: 1111``). The
    parameter counts pin this down: with sr 8/4/2/1 Pola-PVT-T would have 14.1M parameters instead
    of the published 12.9M; with sr 1 it has 12.92M (S 23.16M, M 39.96M, L 54.37M, vs 23.2/40.0/54.4).

    Any input size works: the image and every stage are zero-padded on the bottom/right to a
    multiple of the patch size, so output i is ``[B, embed_dims[i], ceil(H / 2^(i+2)),
    ceil(W / 2^(i+2))]``.

    Args:
        arch: 'tiny' | 'small' | 'medium' | 'large', or a dict with ``depths`` (and optionally
            ``embed_dims``, ``num_heads``, ``mlp_ratios``, ``sr_ratios``).
        in_channels: image channels.
        pretrain_img_size: the input size the position embeddings are defined for.
        qkv_bias: bias of the attention's input projections.
        attn_cfg: the settings of every :class:`PolarityAttention` (its keyword-only arguments:
            ``alpha``, ``kernel_size``, ``polarity``, ``power``, ``fixed_power``, ``eps``), passed
            unchanged; the layer holds their defaults (the official model) and checks them. The
            ablations (docs/ablations.md) are ``attn_cfg`` entries, e.g. ``dict(polarity='same')``.
        drop_rate: dropout after the position embedding, the attention projection and in the MLP.
        drop_path_rate: stochastic depth, rising linearly over the blocks to this value.
        out_indices: stages whose outputs are returned.
        frozen_stages: the first ``frozen_stages`` stages (patch embedding, position embedding and
            blocks) get no gradients and stay in eval mode; -1 or 0 freezes nothing.
        norm_eval: keep BatchNorm layers in eval mode while training; this backbone only has
            LayerNorms (which hold no running statistics), so it changes nothing here and exists for
            config compatibility with the other backbones.
        with_cp: gradient checkpointing of every block.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL[, prefix='backbone.'])`` loads an
            official PolaFormer file (recognised by its keys and converted) or a converted one;
            None: the official initialisation (truncated normal linear layers and position embeddings).
    """

    arch_settings: Dict[str, dict] = {
        'tiny': dict(depths=[2, 2, 2, 2]),
        'small': dict(depths=[3, 4, 6, 3]),
        'medium': dict(depths=[3, 4, 18, 3]),
        'large': dict(depths=[3, 8, 27, 3]),
    }
    arch_defaults = dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                         sr_ratios=[1, 1, 1, 1])
    per_stage_keys = ('embed_dims', 'num_heads', 'mlp_ratios', 'sr_ratios', 'depths')
    patch_sizes = (4, 2, 2, 2)
    block_norm_cfg = dict(type='LN', eps=1e-6)

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 pretrain_img_size: int = 224,
                 qkv_bias: bool = True,
                 attn_cfg: Optional[dict] = None,
                 drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg=None,
                 **unknown_kwargs):
        attn_cfg = check_attn_cfg(type(self).__name__, PolarityAttention, attn_cfg, unknown_kwargs)
        super().__init__(arch, out_indices, frozen_stages, norm_eval, init_cfg, in_channels)
        self.embed_dims = list(self.arch['embed_dims'])
        self.num_heads = list(self.arch['num_heads'])
        self.mlp_ratios = list(self.arch['mlp_ratios'])
        self.sr_ratios = list(self.arch['sr_ratios'])
        self.depths = list(self.arch['depths'])
        self.pretrain_img_size = pretrain_img_size

        drop_path_rates = torch.linspace(0, drop_path_rate, sum(self.depths), device='cpu').tolist()
        self.pos_grids = []
        self.pos_drop = nn.Dropout(drop_rate)
        in_dims, stride = in_channels, 1
        for i in range(self.num_stages):
            dims, patch_size = self.embed_dims[i], self.patch_sizes[i]
            stride *= patch_size
            grid = (pretrain_img_size // stride, ) * 2
            self.pos_grids.append(grid)
            sr = self.sr_ratios[i]
            blocks = []
            for j in range(self.depths[i]):
                attn = PolarityAttention(dims, self.num_heads[i], pos_grid=(grid[0] // sr, grid[1] // sr),
                                         sr_ratio=sr, qkv_bias=qkv_bias, proj_drop=drop_rate,
                                         **attn_cfg)
                blocks.append(PreNormBlock(attn, dims, self.mlp_ratios[i], norm_cfg=self.block_norm_cfg,
                                           drop_rate=drop_rate,
                                           drop_path_rate=drop_path_rates[sum(self.depths[:i]) + j],
                                           with_cp=with_cp))
            self.add_module(f'patch_embed{i + 1}', PatchEmbed(in_dims, dims, patch_size))
            pos_embed = nn.Parameter(torch.zeros(1, grid[0] * grid[1], dims))
            self.register_parameter(f'pos_embed{i + 1}', pos_embed)
            self.add_module(f'block{i + 1}', nn.ModuleList(blocks))
            in_dims = dims
        self._freeze_stages()

    def stage_modules(self, i: int) -> List[nn.Module]:
        """The modules of stage i (0-based) that ``frozen_stages`` freezes."""
        return [getattr(self, f'patch_embed{i + 1}'), getattr(self, f'block{i + 1}')]

    def stage_parameters(self, i: int) -> List[nn.Parameter]:
        return [getattr(self, f'pos_embed{i + 1}')]

    def init_default_weights(self) -> None:
        """The official initialisation: truncated-normal linear layers and position embeddings."""
        super().init_default_weights()
        for i in range(self.num_stages):
            trunc_normal_(getattr(self, f'pos_embed{i + 1}'), std=0.02)

    def convert_state_dict(self, state_dict: StateDict) -> Tuple[StateDict, Dict[str, str]]:
        """Official PolaFormer files (recognised by their keys) to this backbone's keys; a file made
        for another input (or window) size fails naming the settings to build with."""
        if is_official_polaformer(state_dict):
            check_official_settings(state_dict, 'pvt', self)
            return convert_official(state_dict, 'pvt')
        return state_dict, {}

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: [B, C_in, H, W] -> tuple of [B, embed_dims[i], ceil(H/s_i), ceil(W/s_i)], s_i = 4*2^i."""
        batch = x.shape[0]
        outs = []
        for i in range(self.num_stages):
            tokens, hw_shape = getattr(self, f'patch_embed{i + 1}')(x)
            pos = resize_pos_embed(getattr(self, f'pos_embed{i + 1}'), self.pos_grids[i], hw_shape,
                                   mode='bilinear')
            tokens = self.pos_drop(tokens + pos.to(tokens.dtype))
            for block in getattr(self, f'block{i + 1}'):
                tokens = block(tokens, hw_shape)
            x = tokens.transpose(1, 2).reshape(batch, -1, *hw_shape)
            if i in self.out_indices:
                outs.append(x.contiguous())
        return tuple(outs)

