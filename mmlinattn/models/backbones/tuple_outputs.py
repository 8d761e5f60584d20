"""``TupleOutputs``: a backbone from any registry whose feature list is returned as a tuple.

mmdet's backbones (PVT among them) return a ``list`` of stage outputs; mmpretrain's necks
(``GlobalAveragePooling``) accept a ``tuple`` or a tensor only. Wrapping such a backbone lets an
mmpretrain classifier use it unchanged; its parameters keep the ``backbone.backbone.`` prefix.
"""
from typing import Tuple

import torch
from mmengine.model import BaseModule

from ...registry import MODELS


@MODELS.register_module()
class TupleOutputs(BaseModule):
    """``TupleOutputs(backbone=dict(type='mmdet.PyramidVisionTransformer', ...))``.

    Args:
        backbone (dict): the config of the wrapped backbone, built through the registry.
    """

    def __init__(self, backbone: dict, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if not isinstance(backbone, dict) or 'type' not in backbone:
            raise TypeError(f'TupleOutputs: backbone must be a config dict with a type, got {backbone!r}')
        self.backbone = MODELS.build(backbone)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x [B, 3, H, W] -> the wrapped backbone's outputs as a tuple."""
        return tuple(self.backbone(x))
