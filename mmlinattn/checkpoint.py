"""Where the plugin reads checkpoint files: one function, so that every load path shares one policy."""
from mmengine.runner.checkpoint import CheckpointLoader


def load_checkpoint_file(filename: str, map_location='cpu'):
    """The object stored in ``filename`` (a local path or any scheme mmengine's loader knows)."""
    return CheckpointLoader.load_checkpoint(filename, map_location=map_location, logger='current')
