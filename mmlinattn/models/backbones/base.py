"""What the four-stage backbones share: the arch table, index checks, the input check, frozen stages,
Pretrained loading.

A family subclasses :class:`StagedBackbone` and keeps only what is its own: ``arch_settings`` (the
named variants), ``arch_defaults`` (what a variant may leave out), ``forward_features(x)`` (the
stages; the base's ``forward`` checks the input first, :func:`check_image`), ``stage_modules(i)``,
``init_default_weights()`` and, where a foreign checkpoint layout or a resized parameter needs it,
``convert_state_dict``. mmdet's Swin/PVT conventions hold throughout: ``out_indices``,
``frozen_stages`` (the first stages get no gradients and stay in eval mode), ``norm_eval`` (BatchNorm
layers stay in eval mode) and ``init_cfg=dict(type='Pretrained', checkpoint=..., prefix=...)``, read
with :func:`mmlinattn.checkpoint.load_checkpoint_file` (no code from the file runs unless
``unsafe_trust_checkpoint=True``).
"""
import re
from collections import OrderedDict
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmlinattn.checkpoint import load_checkpoint_file

StateDict = Dict[str, torch.Tensor]


def unwrap_state_dict(checkpoint: Mapping) -> StateDict:
    """The weights of a loaded checkpoint: under ``state_dict`` (mmengine) or ``model`` (the official
    PolaFormer files), in that order, with a DistributedDataParallel ``module.`` prefix stripped."""
    state_dict = checkpoint
    for wrapper in ('state_dict', 'model'):
        if isinstance(state_dict, Mapping) and isinstance(state_dict.get(wrapper), Mapping):
            state_dict = state_dict[wrapper]
            break
    if not isinstance(state_dict, Mapping) or not all(
            isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ValueError('a checkpoint must be a dict of tensors, optionally under "state_dict" or '
                         f'"model"; got {type(state_dict).__name__}')
    return OrderedDict((k[len('module.'):] if k.startswith('module.') else k, v)
                       for k, v in state_dict.items())


def strip_prefix(state_dict: Mapping, prefix: Optional[str] = None) -> StateDict:
    """The entries under ``prefix`` with it removed. ``prefix=None`` means ``'backbone.'`` when a key
    has it (a whole detector/classifier) and nothing otherwise; ``''`` keeps every key."""
    if prefix is None:
        prefix = 'backbone.' if any(k.startswith('backbone.') for k in state_dict) else ''
    return OrderedDict((k[len(prefix):], v) for k, v in state_dict.items() if k.startswith(prefix))


def check_shapes(module: nn.Module, state_dict: Mapping, source: str = 'checkpoint') -> None:
    """Raise ``ValueError`` naming the first key whose shape differs from the module's."""
    own = module.state_dict()
    for key, value in state_dict.items():
        if key in own and tuple(own[key].shape) != tuple(value.shape):
            raise ValueError(f'{source}: {key} has shape {list(value.shape)} but '
                             f'{type(module).__name__} expects {list(own[key].shape)}')


def check_image(backbone: nn.Module, x, in_channels: int) -> None:
    """Raise ``ValueError`` unless ``x`` is a floating-point ``[B, in_channels, H, W]`` tensor with
    H, W >= 1 (B may be 0), naming the backbone's class, what it expects and what arrived.

    Reads the type, sizes and dtype only: no host sync, no value scan. The size comparisons are
    plain Python, so under torch.compile(fullgraph=True) and torch.export they hold on symbolic
    sizes without a graph break.
    """
    if (isinstance(x, torch.Tensor) and x.dim() == 4 and x.shape[1] == in_channels
            and x.is_floating_point() and x.shape[2] >= 1 and x.shape[3] >= 1):
        return
    got = (f'shape {list(x.shape)}, dtype {x.dtype}' if isinstance(x, torch.Tensor) else
           f'a {type(x).__name__}')
    raise ValueError(f'{type(backbone).__name__} expects a floating-point tensor '
                     f'[B, in_channels={in_channels}, H, W] with H, W >= 1; got {got}')


def format_keys(keys: Iterable[str]) -> str:
    keys = list(keys)
    return ', '.join(keys) if keys else 'none'


class StagedBackbone(BaseModule):
    """Base of the four-stage backbones (see the module docstring).

    ``forward(x)`` checks ``x`` (:func:`check_image`: a floating-point ``[B, in_channels, H, W]``
    tensor, else a ``ValueError`` naming the backbone and what arrived), answers an empty batch
    with empty outputs of the shapes :meth:`output_shapes` gives, and otherwise runs the family's
    ``forward_features(x)``.

    Args:
        arch: a name of ``arch_settings`` or a dict; the result, with ``arch_defaults`` filled in
            and checked, is ``self.arch``.
        out_indices: stages whose outputs are returned (negative indices count from the end).
        frozen_stages: the first ``frozen_stages`` stages get no gradients and stay in eval mode;
            -1 or 0 freezes nothing.
        norm_eval: keep the BatchNorm layers in eval mode while training.
        init_cfg: None (the family's own initialisation, :meth:`init_default_weights`),
            ``dict(type='Pretrained', checkpoint=PATH, prefix=None, strict=True,
            unsafe_trust_checkpoint=False)`` (:meth:`load_pretrained`) or any other mmengine init
            config.
        in_channels: the image channels ``forward`` accepts.
    """

    num_stages = 4
    arch_settings: Dict[str, dict] = {}
    arch_defaults: Dict[str, object] = {}
    per_stage_keys: Tuple[str, ...] = ()  # arch entries that need one value per stage
    # The inductor options torch.compile(backbone, dynamic=True) needs (None: none).
    dynamic_compile_options: Optional[dict] = None
    # Keys a Pretrained checkpoint may lack: the output norms of stages its model did not output
    # (an ImageNet classifier normalises stage 4 only); they keep their initialisation.
    keys_allowed_missing: Tuple[str, ...] = (r'norm\d+\.(weight|bias)',)
    # Stage i's output is [stage_channels()[i], ceil(H / out_strides[i]), ceil(W / out_strides[i])].
    out_strides: Tuple[int, ...] = (4, 8, 16, 32)

    def __init__(self, arch: Union[str, dict], out_indices: Sequence[int], frozen_stages: int,
                 norm_eval: bool, init_cfg=None, in_channels: int = 3):
        super().__init__(init_cfg=init_cfg)
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f'in_channels must be a positive integer, got {in_channels!r}')
        self.in_channels = in_channels
        self.arch = self.parse_arch(arch)
        self.out_indices = self.check_out_indices(out_indices)
        if isinstance(frozen_stages, bool) or not isinstance(frozen_stages, int) or not (
                -1 <= frozen_stages <= self.num_stages):
            raise ValueError(f'frozen_stages must be an integer in -1..{self.num_stages}, got '
                             f'{frozen_stages!r}')
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval

    # ---- arguments ---------------------------------------------------------------------------
    @classmethod
    def parse_arch(cls, arch: Union[str, dict]) -> dict:
        """``arch_settings[arch]`` or the dict ``arch``, completed from ``arch_defaults``; every
        key of ``per_stage_keys`` must hold ``num_stages`` values."""
        if isinstance(arch, str):
            if arch.lower() not in cls.arch_settings:
                raise ValueError(f'arch must be one of {sorted(cls.arch_settings)} or a dict, got '
                                 f'{arch!r}')
            arch = cls.arch_settings[arch.lower()]
        elif not isinstance(arch, dict):
            raise ValueError(f'arch must be a str or a dict, got {type(arch).__name__}')
        required = set(next(iter(cls.arch_settings.values()))) - set(cls.arch_defaults)
        missing = required - set(arch)
        if missing:
            raise ValueError(f'arch dict misses {sorted(missing)}; got keys {sorted(arch)}')
        arch = {**cls.arch_defaults, **arch}
        for name in cls.per_stage_keys:
            if len(arch[name]) != cls.num_stages:
                raise ValueError(f'arch {name} must have {cls.num_stages} entries, got {arch[name]}')
        return arch

    @classmethod
    def check_out_indices(cls, out_indices: Sequence[int]) -> Tuple[int, ...]:
        indices = tuple(i + cls.num_stages if i < 0 else i for i in out_indices)
        if not indices or any(not 0 <= i < cls.num_stages for i in indices):
            raise ValueError(f'out_indices must be a non-empty subset of 0..{cls.num_stages - 1} '
                             f'(or negative counterparts), got {tuple(out_indices)}')
        return indices

    # ---- forward -------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: floating-point ``[B, in_channels, H, W]`` -> one ``[B, C_i, ceil(H / s_i),
        ceil(W / s_i)]`` per stage i of ``out_indices``, in stage order (:meth:`output_shapes`)."""
        check_image(self, x, self.in_channels)
        if x.shape[0] == 0:  # the stages' token reshapes cannot infer a size from 0 elements
            return tuple(x.new_empty((0, ) + shape) for shape in self.output_shapes(*x.shape[2:]))
        return self.forward_features(x)

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The stages on a checked, non-empty ``x``; the family's own."""
        raise NotImplementedError

    def stage_channels(self) -> List[int]:
        """The channels of each stage's output (the families' ``embed_dims``)."""
        return list(self.embed_dims)

    def output_shapes(self, height: int, width: int) -> List[Tuple[int, int, int]]:
        """``(C, H, W)`` of each output for an ``height x width`` input, from the strides alone
        (no data runs); stage order, as ``forward`` returns them."""
        channels = self.stage_channels()
        return [(channels[i], -(-height // self.out_strides[i]), -(-width // self.out_strides[i]))
                for i in range(self.num_stages) if i in self.out_indices]

    # ---- frozen stages and norm_eval ---------------------------------------------------------
    def stage_modules(self, i: int) -> List[nn.Module]:
        """The modules of stage i (0-based) that ``frozen_stages`` freezes."""
        raise NotImplementedError

    def stage_parameters(self, i: int) -> List[nn.Parameter]:
        """Bare parameters of stage i that no module of :meth:`stage_modules` holds."""
        return []

    def _freeze_stages(self) -> None:
        for i in range(max(self.frozen_stages, 0)):
            for param in self.stage_parameters(i):
                param.requires_grad = False
            for module in self.stage_modules(i):
                module.eval()
                for param in module.parameters():
                    param.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()
        return self

    # ---- initialisation and checkpoints ------------------------------------------------------
    def init_weights(self) -> None:
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            self.load_pretrained(
                self.init_cfg['checkpoint'], prefix=self.init_cfg.get('prefix'),
                strict=self.init_cfg.get('strict', True),
                unsafe_trust_checkpoint=self.init_cfg.get('unsafe_trust_checkpoint', False))
        elif self.init_cfg is None:
            self.init_default_weights()
        else:
            super().init_weights()
        self._is_init = True

    def init_default_weights(self) -> None:
        """Truncated-normal (std 0.02) linear weights, zero biases; families add their own."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def convert_state_dict(self, state_dict: StateDict) -> Tuple[StateDict, Dict[str, str]]:
        """Map a checkpoint's backbone weights onto this backbone's keys and shapes.

        Returns ``(state_dict, dropped)``, ``dropped`` naming each key left out and why. The
        default keeps everything; families override it (official layouts, resized embeddings).
        """
        return state_dict, {}

    def load_pretrained(self, checkpoint: str, prefix: Optional[str] = None, strict: bool = True,
                        unsafe_trust_checkpoint: bool = False) -> Tuple[List[str], List[str]]:
        """Load the backbone weights of ``checkpoint`` (a backbone's, a whole model's with
        ``prefix`` or ``backbone.`` keys, or a layout :meth:`convert_state_dict` knows).

        A shape mismatch fails naming the key. With ``strict``, keys the backbone does not have
        (unexpected) and keys it has but the file lacks (missing, except ``keys_allowed_missing``)
        fail naming them, before anything is loaded; otherwise they are logged. The file is read
        without running code from it unless ``unsafe_trust_checkpoint``
        (:func:`~mmlinattn.checkpoint.load_checkpoint_file`). Returns ``(missing, unexpected)``.
        """
        checkpoint_dict = load_checkpoint_file(checkpoint,
                                               unsafe_trust_checkpoint=unsafe_trust_checkpoint)
        state_dict = strip_prefix(unwrap_state_dict(checkpoint_dict), prefix)
        state_dict, dropped = self.convert_state_dict(state_dict)
        check_shapes(self, state_dict, source=checkpoint)
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        fatal_missing = [k for k in missing
                         if not any(re.fullmatch(p, k) for p in self.keys_allowed_missing)]
        if strict and (unexpected or fatal_missing):
            raise ValueError(f'{checkpoint} does not match {type(self).__name__}: missing keys: '
                             f'{format_keys(fatal_missing)}; unexpected keys: '
                             f'{format_keys(unexpected)} (init_cfg strict=False loads the rest)')
        self.load_state_dict(state_dict, strict=False)
        print_log(f'{type(self).__name__}: loaded {checkpoint}'
                  + (f' (converted; dropped {format_keys(dropped)})' if dropped else '')
                  + f'; missing keys: {format_keys(missing)}; unexpected keys: '
                  f'{format_keys(unexpected)}', logger='current')
        return missing, unexpected
