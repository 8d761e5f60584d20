"""The plugin's model registry.

A child of mmengine's root ``MODELS`` with scope ``mmlinattn``, so that mmdet, mmseg and mmpretrain
configs (whose registries are siblings under the same root) build ``type='mmlinattn.X'``.
"""
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmlinattn', locations=['mmlinattn.models'])
