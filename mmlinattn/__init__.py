"""mmlinattn: LaplacianFormer and PolaFormer linear-attention backbones and fused ops for OpenMMLab.

``import mmlinattn`` (or ``custom_imports=dict(imports=['mmlinattn'])`` in a config) registers the
backbones in the ``mmlinattn`` registry scope (``type='mmlinattn.LaplacianFormer'``) and makes
mmengine's checkpoint loading work under torch >= 2.6.
"""
from .utils.compat import patch_mmengine_checkpoint_loading
from .version import __version__

patch_mmengine_checkpoint_loading()

from . import ops  # noqa: E402
from .registry import MODELS  # noqa: E402
from . import models  # noqa: E402,F401  (registers the backbones)
from .configs import config_path  # noqa: E402

__all__ = ['__version__', 'MODELS', 'config_path', 'ops']
