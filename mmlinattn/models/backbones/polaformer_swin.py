"""Pola-Swin: Swin with global polarity-aware linear attention in stages 1-2, shifted windows after."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import nn

from mmlinattn.registry import MODELS
from mmlinattn.utils.polaformer_checkpoint import format_keys, load_pretrained_polaformer
from ..layers import PatchEmbed, PatchMerging, PolarityAttention, PreNormBlock, ShiftedWindowAttention
from .frozen_stages import FrozenStagesMixin
from .polaformer_pvt import check_out_indices

ATTN_TYPES = ('polarity', 'window')


class PolaSwinStage(nn.Module):
    """One stage as the official ``layers.{i}``: ``blocks`` and the ``downsample`` that follows them."""

    def __init__(self, blocks: List[PreNormBlock], downsample: Optional[PatchMerging]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


@MODELS.register_module()
class PolaSwin(FrozenStagesMixin, BaseModule):
    """Pola-Swin backbone (``type='mmlinattn.PolaSwin'``), laid out as the official model.

    A 4x4 patch embedding (+ LayerNorm), then four stages of pre-norm blocks (MLP ratio 4) with
    :class:`PatchMerging` between them. Stages with ``attn_types[i] == 'polarity'`` (1 and 2 by
    default) use :class:`PolarityAttention` over the whole feature map: the official code gives
    them a window as large as the 224^2 map (56, then 28), so they are global and unshifted, and
    their positional encodings (56^2 and 28^2 tokens) are resized bicubically to the actual map.
    Stages with ``'window'`` use :class:`ShiftedWindowAttention` with ``window_size`` 7, shifted in
    every odd block, the map zero-padded to a multiple of the window and the shifted regions masked.
    The full-map positional encodings are what the published parameter counts require:
    Pola-Swin-T has 29.30M parameters with them (S 50.63M, B 89.17M; published 29.3/50.6/89.1),
    and 28.42M with 7x7 ones.

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
        alpha: the polarity attention's power is ``1 + alpha * sigmoid(theta)``.
        kernel_size: of the polarity attention's depthwise conv on v.
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
    default_attn_types = ('polarity', 'polarity', 'window', 'window')
    num_stages = 4
    patch_size = 4

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 pretrain_img_size: int = 224,
                 window_size: int = 7,
                 mlp_ratio: float = 4.0,
                 qkv_bias: bool = True,
                 alpha: float = 4.0,
                 kernel_size: int = 5,
                 drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.2,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        arch = self._parse_arch(arch)
        self.depths = list(arch['depths'])
        self.num_heads = list(arch['num_heads'])
        self.attn_types = list(arch.get('attn_types', self.default_attn_types))
        self.embed_dims = [arch['embed_dims'] * 2**i for i in range(self.num_stages)]
        self.out_indices = check_out_indices(out_indices, self.num_stages)
        if not -1 <= frozen_stages <= self.num_stages:
            raise ValueError(f'frozen_stages must be in -1..{self.num_stages}, got {frozen_stages}')
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.pretrain_img_size = pretrain_img_size

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
                                             fused_qkvg=True, qkv_bias=qkv_bias, kernel_size=kernel_size,
                                             alpha=alpha, proj_drop=drop_rate)
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

    @classmethod
    def _parse_arch(cls, arch: Union[str, dict]) -> dict:
        if isinstance(arch, str):
            if arch.lower() not in cls.arch_settings:
                raise ValueError(f'arch must be one of {sorted(cls.arch_settings)} or a dict, got {arch!r}')
            return cls.arch_settings[arch.lower()]
        if not isinstance(arch, dict):
            raise ValueError(f'arch must be a str or a dict, got {type(arch).__name__}')
        missing = {'embed_dims', 'depths', 'num_heads'} - set(arch)
        if missing:
            raise ValueError(f'arch dict misses {sorted(missing)}; got keys {sorted(arch)}')
        for name in ('depths', 'num_heads', 'attn_types'):
            if name in arch and len(arch[name]) != cls.num_stages:
                raise ValueError(f'arch {name} must have {cls.num_stages} entries, got {arch[name]}')
        if any(t not in ATTN_TYPES for t in arch.get('attn_types', ())):
            raise ValueError(f'arch attn_types must be drawn from {ATTN_TYPES}, got {arch["attn_types"]}')
        return arch

    def stage_modules(self, i: int) -> List[nn.Module]:
        """The modules of stage i (0-based) that ``frozen_stages`` freezes."""
        modules = [self.patch_embed if i == 0 else self.layers[i - 1].downsample, self.layers[i].blocks]
        if i in self.out_indices:
            modules.append(getattr(self, f'norm{i}'))
        return modules

    def init_weights(self) -> None:
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            checkpoint = self.init_cfg['checkpoint']
            missing, unexpected, dropped = load_pretrained_polaformer(
                self, checkpoint, 'swin', self.init_cfg.get('prefix'))
            print_log(f'PolaSwin: loaded {checkpoint}'
                      + (f' (official layout; dropped {format_keys(dropped)})' if dropped else '')
                      + f'; missing keys: {format_keys(missing)}; unexpected keys: '
                      f'{format_keys(unexpected)}', logger='current')
        elif self.init_cfg is None:
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    trunc_normal_(module.weight, std=0.02)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.LayerNorm):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)
                elif isinstance(module, ShiftedWindowAttention):
                    trunc_normal_(module.relative_position_bias_table, std=0.02)
        else:
            super().init_weights()
        self._is_init = True

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
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
