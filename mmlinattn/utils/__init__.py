from .compat import load_local_checkpoint, patch_mmengine_checkpoint_loading

__all__ = ['load_local_checkpoint', 'patch_mmengine_checkpoint_loading']
