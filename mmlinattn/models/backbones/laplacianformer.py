"""LaplacianFormer: a four-stage pyramid of Laplacian-kernel Nyström attention blocks (docs/models/laplacianformer.md)."""
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmcv.cnn import ConvModule, build_norm_layer
from mmengine.model.weight_init import trunc_normal_
from torch import nn

from mmlinattn.registry import MODELS
from ..layers import LaplacianAttention, PreNormBlock, resize_pos_embed
from .attn_cfg import check_attn_cfg
from .base import StagedBackbone, StateDict


class LaplacianFormerStage(nn.Module):
    """Patch embedding (stem or 3x3 s2 conv + BN), learned position embedding, blocks.

    ``forward(x [B, C_in, H_in, W_in]) -> (tokens [B, H*W, C], (H, W))``. The position embedding
    is defined on the ``pos_grid`` of a 224^2 input and resized bicubically to ``(H, W)``.
    """

    def __init__(self, patch_embed: nn.Module, embed_dims: int, pos_grid: Tuple[int, int],
                 blocks: List[PreNormBlock], drop_rate: float = 0.0):
        super().__init__()
        self.patch_embed = patch_embed
        self.pos_grid = tuple(pos_grid)
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_grid[0] * pos_grid[1], embed_dims))
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.patch_embed(x)
        hw_shape = (x.shape[2], x.shape[3])
        # A view of the channels-last map. Not flatten(2).transpose(1, 2): its backward gives the
        # map a gradient whose batch stride is C, which at batch 1 sends BatchNorm's CPU backward
        # to a path 15x slower than for the map's own strides.
        x = x.permute(0, 2, 3, 1).flatten(1, 2)
        x = self.pos_drop(x + resize_pos_embed(self.pos_embed, self.pos_grid, hw_shape).to(x.dtype))
        for block in self.blocks:
            x = block(x, hw_shape)
        return x, hw_shape


# Checkpoints that call the blocks' MLP ``ffn`` load under this backbone's ``mlp`` keys.
LEGACY_MLP_KEY = re.compile(r'(stages\.\d+\.blocks\.\d+\.)ffn\.')


def rename_legacy_keys(state_dict: StateDict, prefix: str = '') -> StateDict:
    """Rename ``{prefix}stages.i.blocks.j.ffn.*`` to ``{prefix}stages.i.blocks.j.mlp.*`` in place;
    returns ``state_dict``."""
    legacy = [key for key in state_dict
              if key.startswith(prefix) and LEGACY_MLP_KEY.match(key, len(prefix))]
    for key in legacy:
        state_dict[prefix + LEGACY_MLP_KEY.sub(r'\1mlp.', key[len(prefix):], count=1)] = (
            state_dict.pop(key))
    return state_dict


def _soft_stem(in_channels: int, stem_channels: int, out_channels: int, conv_norm_cfg: dict):
    """SOFT's stem: 3x3 s2 -> 3x3 s1 -> 3x3 s2 convs, each + BN + ReLU; stride 4."""
    return nn.Sequential(
        ConvModule(in_channels, stem_channels, 3, stride=2, padding=1, norm_cfg=conv_norm_cfg),
        ConvModule(stem_channels, stem_channels, 3, stride=1, padding=1, norm_cfg=conv_norm_cfg),
        ConvModule(stem_channels, out_channels, 3, stride=2, padding=1, norm_cfg=conv_norm_cfg))


@MODELS.register_module()
class LaplacianFormer(StagedBackbone):
    """LaplacianFormer backbone (``type='mmlinattn.LaplacianFormer'``).

    Stage i runs at stride ``4 * 2^i`` with ``embed_dims[i]`` channels, ``num_heads[i]`` heads of
    dim 32, ``depths[i]`` blocks of :class:`LaplacianAttention` with landmark pooling stride
    ``landmark_ratios[i]`` (8/4/2/1; 1 = exact attention) and a depthwise local branch of kernel
    ``local_kernel_sizes[i]`` (9/5/3/3).

    Any input size works: the stride-2 convs give ``ceil(H / stride)`` and the attention zero-pads q
    to a multiple of its landmark stride, so no image padding and no cropping is needed. Output i is
    ``[B, embed_dims[i], ceil(H / 2^(i+2)), ceil(W / 2^(i+2))]`` after its own LayerNorm.

    Args:
        arch: 'tiny' | 'small' | 'medium' | 'large' | 'huge', or a dict with ``embed_dims``,
            ``num_heads``, ``depths`` (and optionally ``landmark_ratios``, ``local_kernel_sizes``).
        in_channels: image channels.
        stem_channels: width of the stem's first two convs.
        mlp_ratio: MLP hidden width / embed dims.
        attn_cfg: the settings of every :class:`LaplacianAttention` (its keyword-only arguments:
            ``lam``, ``kernel``, ``inverse``, ``ns_iters``, ``cg_iters``, ``landmark_shift``,
            ``max_landmark_grid``, ...), passed unchanged; the layer holds their defaults (the
            paper's model, landmarks capped at the 224^2 grid) and checks them. The ablations
            (docs/ablations.md) are ``attn_cfg`` entries, e.g. ``dict(kernel='gaussian')``.
        pretrain_img_size: the input size the position embeddings are defined for.
        drop_rate: dropout after position embedding, attention projection and MLP.
        drop_path_rate: stochastic depth, rising linearly over the blocks to this value.
        out_indices: stages whose (normalised) outputs are returned.
        frozen_stages: the first ``frozen_stages`` stages (with their stem/downsampling conv, position
            embedding and output norm) get no gradients and stay in eval mode; -1 or 0 freezes nothing.
        norm_eval: keep the BatchNorm layers (stem, downsampling) in eval mode during training.
        with_cp: gradient checkpointing of every block.
        norm_cfg: the blocks' and outputs' norm; conv_norm_cfg: the convs' norm.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL[, prefix='backbone.'])`` loads
            weights strictly (see :meth:`StagedBackbone.load_pretrained`; position embeddings of
            another ``pretrain_img_size`` are resized); None: truncated-normal init of the linear
            layers and position embeddings.
    """

    arch_settings: Dict[str, dict] = {
        'tiny': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], depths=[1, 2, 3, 2]),
        'small': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], depths=[1, 3, 20, 4]),
        'medium': dict(embed_dims=[64, 128, 288, 512], num_heads=[2, 4, 9, 16], depths=[1, 3, 29, 5]),
        'large': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], depths=[1, 3, 40, 5]),
        'huge': dict(embed_dims=[64, 128, 352, 512], num_heads=[2, 4, 11, 16], depths=[1, 5, 49, 5]),
    }
    arch_defaults = dict(landmark_ratios=(8, 4, 2, 1), local_kernel_sizes=(9, 5, 3, 3))
    per_stage_keys = ('embed_dims', 'num_heads', 'depths', 'landmark_ratios', 'local_kernel_sizes')
    # The graph returns views whose strides are FloorDiv expressions of H and W (the landmark grid):
    # inductor orders such strides without a shape env and fails (`cannot determine truth value of
    # Relational`) unless it keeps their exact strides.
    dynamic_compile_options = {'strict_output_strides': True}

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 stem_channels: int = 32,
                 mlp_ratio: float = 4.0,
                 attn_cfg: Optional[dict] = None,
                 pretrain_img_size: int = 224,
                 drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 conv_norm_cfg: dict = dict(type='BN'),
                 init_cfg=None,
                 **unknown_kwargs):
        attn_cfg = check_attn_cfg(type(self).__name__, LaplacianAttention, attn_cfg, unknown_kwargs)
        super().__init__(arch, out_indices, frozen_stages, norm_eval, init_cfg, in_channels)
        self.embed_dims = list(self.arch['embed_dims'])
        self.num_heads = list(self.arch['num_heads'])
        self.depths = list(self.arch['depths'])
        self.landmark_ratios = list(self.arch['landmark_ratios'])
        self.local_kernel_sizes = list(self.arch['local_kernel_sizes'])
        self.pretrain_img_size = pretrain_img_size

        drop_path_rates = torch.linspace(0, drop_path_rate, sum(self.depths), device='cpu').tolist()
        self.stages = nn.ModuleList()
        in_dims = in_channels
        for i in range(self.num_stages):
            dims, stride = self.embed_dims[i], 4 * 2**i
            if i == 0:
                patch_embed = _soft_stem(in_dims, stem_channels, dims, conv_norm_cfg)
            else:
                patch_embed = ConvModule(in_dims, dims, 3, stride=2, padding=1, norm_cfg=conv_norm_cfg,
                                         act_cfg=None)
            first = sum(self.depths[:i])
            blocks = []
            for j in range(self.depths[i]):
                attn = LaplacianAttention(dims, self.num_heads[i], self.landmark_ratios[i],
                                          self.local_kernel_sizes[i], drop_rate, **attn_cfg)
                blocks.append(PreNormBlock(attn, dims, mlp_ratio, norm_cfg=norm_cfg, drop_rate=drop_rate,
                                           drop_path_rate=drop_path_rates[first + j], with_cp=with_cp))
            pos_grid = (-(-pretrain_img_size // stride), ) * 2
            self.stages.append(LaplacianFormerStage(patch_embed, dims, pos_grid, blocks, drop_rate))
            if i in self.out_indices:
                self.add_module(f'norm{i}', build_norm_layer(norm_cfg, dims)[1])
            in_dims = dims
        self._freeze_stages()

    def stage_modules(self, i: int) -> List[nn.Module]:
        """The modules of stage i (0-based) that ``frozen_stages`` freezes."""
        modules = [self.stages[i]]
        if i in self.out_indices:
            modules.append(getattr(self, f'norm{i}'))
        return modules

    def init_default_weights(self) -> None:
        super().init_default_weights()
        for stage in self.stages:
            trunc_normal_(stage.pos_embed, std=0.02)

    def convert_state_dict(self, state_dict: StateDict) -> Tuple[StateDict, Dict[str, str]]:
        """Rename ``ffn`` keys to ``mlp`` (:func:`rename_legacy_keys`) and resize position
        embeddings learned for another ``pretrain_img_size`` (bicubic)."""
        rename_legacy_keys(state_dict)
        for i, stage in enumerate(self.stages):
            key = f'stages.{i}.pos_embed'
            if key in state_dict and state_dict[key].shape != stage.pos_embed.shape:
                src = int(round(state_dict[key].shape[1]**0.5))
                state_dict[key] = resize_pos_embed(state_dict[key], (src, src), stage.pos_grid)
        return state_dict, {}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Every load_state_dict (a whole detector's checkpoint, a resumed run) passes through here
        # before the blocks read their keys, so checkpoints with ``ffn`` keys load everywhere.
        rename_legacy_keys(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: [B, C_in, H, W] -> tuple of [B, embed_dims[i], ceil(H/s_i), ceil(W/s_i)], s_i = 4*2^i."""
        # Channels-last from the stem on, and between the stages (tokens [B, H*W, C] seen as
        # [B, C, H, W] with channels-last strides): every conv then returns channels-last maps,
        # whose tokens are contiguous, so the residual stream, the norms and the projections, and
        # their gradients, read dense rows (an NCHW map's tokens are a transposed view that every
        # add and norm of the stage would copy or stride through). The outputs are contiguous
        # NCHW, as mmdet's backbones return them: mmcv's CPU RoIAlign reads its input as NCHW
        # whatever its strides, so channels-last maps reaching it through the neck (whose convs
        # keep the layout) would give wrong RoI features.
        x = x.contiguous(memory_format=torch.channels_last)
        outs = []
        for i, stage in enumerate(self.stages):
            tokens, (height, width) = stage(x)
            if i in self.out_indices:
                out = tokens_as_map(getattr(self, f'norm{i}')(tokens), height, width)
                outs.append(out.contiguous())
            x = tokens_as_map(tokens, height, width)
        return tuple(outs)


def tokens_as_map(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """tokens [B, H*W, C] -> [B, C, H, W], a channels-last view (no copy)."""
    return tokens.reshape(tokens.shape[0], height, width, -1).permute(0, 3, 1, 2)
