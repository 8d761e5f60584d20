"""mmlinattn: LaplacianFormer and PolaFormer linear-attention backbones and fused ops for OpenMMLab.

``import mmlinattn`` (or ``custom_imports=dict(imports=['mmlinattn'])`` in a config) registers the
backbones and :class:`~mmlinattn.hooks.SafeCheckpointLoadingHook` in the ``mmlinattn`` registry scope
(``type='mmlinattn.LaplacianFormer'``) and nothing else: checkpoint loading stays mmengine's and
torch's unless code asks for :mod:`mmlinattn.checkpoint` (the plugin's backbones, and the hook in a
runner whose config names it).
"""
from .version import __version__
from . import ops
from .registry import MODELS
from . import models  # noqa: F401  (registers the backbones)
from . import hooks  # noqa: F401  (registers the hook)
from .configs import config_path

__all__ = ['__version__', 'MODELS', 'config_path', 'ops']
