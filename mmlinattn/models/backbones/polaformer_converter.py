"""Official PolaFormer checkpoints <-> this package's ``PolaPVT`` / ``PolaSwin`` keys.

The official ImageNet files (github.com/ZacharyMeng/PolaFormer, built on the FLatten-Transformer
and Swin code) are ``{'model': state_dict, ...}`` with

- Pola-PVT: ``patch_embed{i}.{proj,norm}``, ``pos_embed{i}``, ``block{i}.{j}.{norm1,norm2,mlp.fc1,
  mlp.fc2}``, ``block{i}.{j}.attn.{qg,kv,power,scale,positional_encoding,dwc,proj[,sr,norm]}``,
  ``norm`` (built but never applied: the classifier averages the last stage's tokens) and ``head``;
- Pola-Swin: ``patch_embed.{proj,norm}``, ``layers.{i}.blocks.{j}.{norm1,norm2,mlp.*}``,
  ``layers.{i}.blocks.{j}.attn.{qkvg,power,scale,positional_encoding,dwc,proj}`` (linear stages) or
  ``.attn.{qkv,relative_position_bias_table,proj}`` (window stages), ``layers.{i}.downsample.{norm,
  reduction}``, the final ``norm`` and ``head``, plus the buffers ``...attn.relative_position_index``
  and ``...blocks.{j}.attn_mask``.

Our modules carry the same names, so converting only drops what the backbone does not hold (head,
the unused PVT ``norm``, the buffers, which are recomputed) and renames Swin's final ``norm`` to
``norm3`` (the backbone's stage-4 output norm, applied before the classifier's pooling, as in the
official forward). With ``keep_head`` the result is an mmpretrain ``ImageClassifier`` state dict
(``backbone.*`` and ``head.fc.*``).

:func:`official_model_settings` reads the input size and window size a file was made for from its
shapes (the official Pola-Swin-B at 384^2 uses window 12), so the model to convert into can be
built to match.
"""
import math
import re
from collections import OrderedDict
from typing import Dict, Mapping, Optional, Tuple

import torch

from ..layers.window_attention import relative_position_index, shifted_window_mask
from .base import unwrap_state_dict

FAMILIES = ('pvt', 'swin')
ARCHS = {
    'pola_pvt_tiny': ('pvt', 'tiny'),
    'pola_pvt_small': ('pvt', 'small'),
    'pola_pvt_medium': ('pvt', 'medium'),
    'pola_pvt_large': ('pvt', 'large'),
    'pola_swin_tiny': ('swin', 'tiny'),
    'pola_swin_small': ('swin', 'small'),
    'pola_swin_base': ('swin', 'base'),
}
_BUFFER_SUFFIXES = ('.relative_position_index', '.attn_mask')
_HEAD_KEYS = {'head.weight': 'head.fc.weight', 'head.bias': 'head.fc.bias'}


def detect_family(state_dict: Mapping) -> Optional[str]:
    """'pvt' (``block1.*`` keys), 'swin' (``layers.0.blocks.*``) or None."""
    keys = list(state_dict)
    if any(re.match(r'(backbone\.)?block1\.\d+\.attn\.', k) for k in keys):
        return 'pvt'
    if any(re.match(r'(backbone\.)?layers\.0\.blocks\.\d+\.', k) for k in keys):
        return 'swin'
    return None


def _square_side(key: str, tokens: int) -> int:
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ValueError(f'{key} holds {tokens} tokens, not a square grid; give the image size '
                         'explicitly')
    return side


def official_model_settings(state_dict: Mapping, family: str) -> Dict[str, int]:
    """``pretrain_img_size`` (and for Pola-Swin ``window_size``) of the model a file was made for.

    Pola-PVT: ``pos_embed1`` is ``[1, (S/4)^2, C]``. Pola-Swin: ``layers.0.blocks.0.attn.
    positional_encoding`` is ``[1, (S/4)^2, C]``, a window stage's ``relative_position_bias_table``
    ``[(2w - 1)^2, heads]``. ``state_dict``: official or converted keys (``backbone.`` allowed).
    """
    if family not in FAMILIES:
        raise ValueError(f'family must be one of {FAMILIES}, got {family!r}')
    shapes = {k[len('backbone.'):] if k.startswith('backbone.') else k: tuple(v.shape)
              for k, v in unwrap_state_dict(state_dict).items()}
    size_key = 'pos_embed1' if family == 'pvt' else 'layers.0.blocks.0.attn.positional_encoding'
    if size_key not in shapes:
        raise ValueError(f'{size_key} is missing: cannot tell the image size the weights are for')
    settings = dict(pretrain_img_size=4 * _square_side(size_key, shapes[size_key][1]))
    if family == 'swin':
        tables = [k for k in shapes if k.endswith('.attn.relative_position_bias_table')]
        if not tables:
            raise ValueError('no relative_position_bias_table: cannot tell the window size')
        settings['window_size'] = (_square_side(tables[0], shapes[tables[0]][0]) + 1) // 2
    return settings


def check_official_settings(state_dict: Mapping, family: str, backbone) -> None:
    """Raise ``ValueError`` naming the settings when an official file was made for another input or
    window size than ``backbone`` (a PolaPVT / PolaSwin) is built for."""
    wanted = official_model_settings(state_dict, family)
    built = {name: getattr(backbone, name) for name in wanted}
    if wanted != built:
        given = ', '.join(f'{k}={v}' for k, v in wanted.items())
        raise ValueError(f'the checkpoint was made for {given}, but {type(backbone).__name__} is '
                         f'built with {", ".join(f"{k}={v}" for k, v in built.items())}; build the '
                         f'backbone with {given}')


def is_official_polaformer(state_dict: Mapping) -> bool:
    """Whether the keys are laid out as the official files: a top-level ``head.*``/``norm.*`` or the
    Swin buffers, none of which a state dict of this package's backbones or classifiers holds."""
    if detect_family(state_dict) is None:
        return False
    return any(k in _HEAD_KEYS or k.startswith('norm.') or k.endswith(_BUFFER_SUFFIXES)
               for k in state_dict)


def convert_official(state_dict: Mapping, family: str,
                     keep_head: bool = False) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Official keys -> ours. Returns ``(converted, dropped)``, ``dropped`` mapping key -> reason.

    keep_head=False: backbone keys for dense prediction (the classifier head is dropped).
    keep_head=True: an mmpretrain classifier state dict, ``backbone.<key>`` and ``head.fc.*``.
    """
    if family not in FAMILIES:
        raise ValueError(f'family must be one of {FAMILIES}, got {family!r}')
    state_dict = unwrap_state_dict(state_dict)
    converted, dropped = OrderedDict(), OrderedDict()
    for key, value in state_dict.items():
        if key in _HEAD_KEYS:
            if keep_head:
                converted[_HEAD_KEYS[key]] = value
            else:
                dropped[key] = 'classifier head (dropped for dense prediction; --keep-head keeps it)'
            continue
        if key.endswith(_BUFFER_SUFFIXES):
            dropped[key] = 'buffer, recomputed by the model'
            continue
        if key.startswith('norm.'):
            if family == 'pvt':
                dropped[key] = 'final norm, built but not applied by the official Pola-PVT'
                continue
            key = 'norm3.' + key[len('norm.'):]
        converted[('backbone.' + key) if keep_head else key] = value
    return converted, dropped


def to_official(state_dict: Mapping, family: str, pretrain_img_size: int = 224,
                window_size: int = 7) -> Dict[str, Dict[str, torch.Tensor]]:
    """Ours -> the official layout ``{'model': ...}`` (the inverse of :func:`convert_official`).

    ``state_dict``: a backbone's (built with ``out_indices=(3,)``) or a classifier's (``backbone.*``,
    ``head.fc.*``). The official file's extra entries are recreated: for Pola-PVT the unused final
    ``norm`` (identity weights), for Pola-Swin the ``relative_position_index`` buffers and the
    ``attn_mask`` buffers of the shifted blocks at ``pretrain_img_size``.
    """
    if family not in FAMILIES:
        raise ValueError(f'family must be one of {FAMILIES}, got {family!r}')
    head = {official: state_dict[ours] for official, ours in _HEAD_KEYS.items() if ours in state_dict}
    backbone = OrderedDict()
    for key, value in state_dict.items():
        if key in _HEAD_KEYS.values():
            continue
        key = key[len('backbone.'):] if key.startswith('backbone.') else key
        backbone[key] = value
    official = OrderedDict()
    for key, value in backbone.items():
        match = re.match(r'layers\.(\d+)\.blocks\.(\d+)\.attn\.relative_position_bias_table$', key)
        if family == 'swin' and re.match(r'norm[012]\.', key):
            continue  # dense-prediction output norms have no official counterpart
        if family == 'swin' and key.startswith('norm3.'):
            key = 'norm.' + key[len('norm3.'):]
        official[key] = value
        if family == 'swin' and match:
            layer, block = int(match.group(1)), int(match.group(2))
            prefix = f'layers.{layer}.blocks.{block}'
            official[f'{prefix}.attn.relative_position_index'] = relative_position_index(window_size)
            resolution = pretrain_img_size // 4 // 2**layer
            if block % 2 == 1 and resolution > window_size:
                official[f'{prefix}.attn_mask'] = shifted_window_mask(resolution, resolution,
                                                                      window_size, window_size // 2)
    if family == 'pvt':
        last_dims = backbone['patch_embed4.proj.weight'].shape[0]
        official['norm.weight'] = torch.ones(last_dims)
        official['norm.bias'] = torch.zeros(last_dims)
    official.update(head)
    return {'model': official}
