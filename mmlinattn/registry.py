"""The plugin's registries.

Children of mmengine's root ``MODELS``, ``HOOKS``, ``OPTIM_WRAPPERS`` and ``LOOPS`` with scope
``mmlinattn``, so that mmdet, mmseg and mmpretrain configs (whose registries are siblings under the
same roots) build ``type='mmlinattn.X'``.
"""
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import LOOPS as MMENGINE_LOOPS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmlinattn', locations=['mmlinattn.models'])
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope='mmlinattn', locations=['mmlinattn.hooks'])
OPTIM_WRAPPERS = Registry('optim_wrapper', parent=MMENGINE_OPTIM_WRAPPERS, scope='mmlinattn',
                          locations=['mmlinattn.optim_wrapper'])
LOOPS = Registry('loop', parent=MMENGINE_LOOPS, scope='mmlinattn', locations=['mmlinattn.loops'])
