"""mmlinattn: LaplacianFormer and PolaFormer linear-attention backbones and fused ops for OpenMMLab.

``import mmlinattn`` (or ``custom_imports=dict(imports=['mmlinattn'])`` in a config) registers the
backbones, :class:`~mmlinattn.hooks.SafeCheckpointLoadingHook`,
:class:`~mmlinattn.optim_wrapper.MixedPrecisionOptimWrapper` and
:class:`~mmlinattn.loops.MixedPrecisionTestLoop` in the ``mmlinattn`` registry scope
(``type='mmlinattn.LaplacianFormer'``) and nothing else: checkpoint loading stays mmengine's and
torch's unless code asks for :mod:`mmlinattn.checkpoint` (the plugin's backbones, and the hook in a
runner whose config names it).
"""
from .version import __version__
from . import ops
from .registry import MODELS
from . import models  # noqa: F401  (registers the backbones)
from . import hooks  # noqa: F401  (registers the hook)
from . import optim_wrapper  # noqa: F401  (registers the mixed precision optim wrapper)
from . import loops  # noqa: F401  (registers the mixed precision test loop)
from .configs import config_path

__all__ = ['__version__', 'MODELS', 'config_path', 'ops']
