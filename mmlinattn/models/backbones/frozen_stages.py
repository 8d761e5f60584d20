"""``frozen_stages`` and ``norm_eval`` for the staged backbones (mmdet's Swin/PVT conventions)."""
from typing import List

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class FrozenStagesMixin:
    """Freezes stages ``0 .. frozen_stages-1`` (eval mode, no gradients) and, with ``norm_eval``,
    keeps BatchNorm layers in eval mode while training.

    A backbone mixing this in (before ``BaseModule``) sets ``self.frozen_stages`` and ``self.norm_eval``
    and defines ``stage_modules(i)``; ``stage_parameters(i)`` lists bare parameters of stage i (e.g. a
    position embedding registered on the backbone itself).
    """

    def stage_modules(self, i: int) -> List[nn.Module]:
        raise NotImplementedError

    def stage_parameters(self, i: int) -> List[nn.Parameter]:
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
