from .compat import load_local_checkpoint, patch_mmengine_checkpoint_loading
from .toy_config import use_toy_data

__all__ = ['load_local_checkpoint', 'patch_mmengine_checkpoint_loading', 'use_toy_data']
