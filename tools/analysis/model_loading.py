"""Build the backbone or the classifier of an mmdet / mmseg / mmpretrain config, with random or
checkpoint weights, and load an image the way the config's data preprocessor normalises it."""
import contextlib
import copy
import importlib
import logging
from typing import Optional, Tuple

import numpy as np
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope
from torch import nn

from mmlinattn.checkpoint import load_checkpoint_file
from mmlinattn.models.backbones.base import unwrap_state_dict
from mmlinattn.models.backbones.polaformer_converter import (convert_official, detect_family,
                                                             is_official_polaformer)

SCOPES = ('mmdet', 'mmseg', 'mmpretrain')
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def load_config(path: str) -> Config:
    """Read a config of one of :data:`SCOPES` and make its scope the default one."""
    cfg = Config.fromfile(path)
    scope = cfg.get('default_scope')
    if scope not in SCOPES:
        raise ValueError(f'{path}: default_scope must be one of {SCOPES}, got {scope!r}')
    init_default_scope(scope)
    import mmlinattn  # noqa: F401  (registers the backbones)
    return cfg


def _registry(cfg: Config):
    return importlib.import_module(f'{cfg.default_scope}.registry').MODELS


@contextlib.contextmanager
def _quiet_mmengine_logger():
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def build_backbone(cfg: Config, checkpoint: Optional[str] = None) -> nn.Module:
    """``cfg.model.backbone`` in eval mode: its own random initialisation when ``checkpoint`` is
    None, else ``init_cfg=dict(type='Pretrained', checkpoint=...)``, so the backbone's loader
    handles whole-model files (``backbone.`` prefix) and official PolaFormer files."""
    backbone_cfg = copy.deepcopy(cfg.model.backbone)
    backbone_cfg['init_cfg'] = (None if checkpoint is None else dict(type='Pretrained',
                                                                     checkpoint=checkpoint))
    backbone = _registry(cfg).build(backbone_cfg)
    backbone.init_weights()
    return backbone.eval()


def build_classifier(cfg: Config, checkpoint: Optional[str] = None) -> nn.Module:
    """The mmpretrain model of ``cfg`` in eval mode, randomly initialised or loaded (strictly)
    from ``checkpoint``: an mmpretrain checkpoint, or an official PolaFormer file with its head."""
    if cfg.default_scope != 'mmpretrain':
        raise ValueError(f'a classifier needs an mmpretrain config, got default_scope '
                         f'{cfg.default_scope!r}')
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone['init_cfg'] = None
    model_cfg.pop('init_cfg', None)
    model = _registry(cfg).build(model_cfg)
    with _quiet_mmengine_logger():  # init_weights logs every parameter at INFO level
        model.init_weights()
    if checkpoint is not None:
        state_dict = unwrap_state_dict(load_checkpoint_file(checkpoint))
        if is_official_polaformer(state_dict):
            state_dict, _ = convert_official(state_dict, detect_family(state_dict), keep_head=True)
        model.load_state_dict(state_dict, strict=True)
    return model.eval()


def normalisation(cfg: Config) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """(mean, std) in 0..255 RGB units from the config's data preprocessor; ImageNet's if none."""
    preprocessor = cfg.model.get('data_preprocessor') or cfg.get('data_preprocessor') or {}
    return (tuple(preprocessor.get('mean',
                                   IMAGENET_MEAN)), tuple(preprocessor.get('std', IMAGENET_STD)))


def load_image(path: str, shape: Tuple[int, int], mean, std) -> Tuple[np.ndarray, torch.Tensor]:
    """The image resized to ``shape`` (H, W): as uint8 RGB [H, W, 3] for display, and normalised
    ``(rgb - mean) / std`` as the model input [1, 3, H, W]."""
    from PIL import Image
    height, width = shape
    with Image.open(path) as image:
        rgb = np.asarray(image.convert('RGB').resize((width, height), Image.BILINEAR))
    tensor = torch.from_numpy(rgb.astype(np.float32)).permute(2, 0, 1)[None]
    tensor = (tensor - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    return rgb, tensor
