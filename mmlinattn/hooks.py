"""The runner hook that makes every OpenMMLab tool load checkpoints with mmlinattn's policy.

mmengine's ``Runner.train/val/test`` call the hooks' ``before_run`` before ``load_or_resume()``, and
every load (``load_from``, ``--resume``) goes through ``runner.load_checkpoint``. So a hook that
wraps that one method of that one runner in :func:`mmlinattn.checkpoint.safe_checkpoint_loading`
covers mmdet's, mmseg's and mmpretrain's stock ``tools/train.py`` and ``tools/test.py`` (whatever
runner class they build) as well as the plugin's own, and changes nothing outside the runner.
"""
import functools

from mmengine.hooks import Hook

from mmlinattn.checkpoint import safe_checkpoint_loading
from mmlinattn.registry import HOOKS

__all__ = ['SafeCheckpointLoadingHook']


@HOOKS.register_module()
class SafeCheckpointLoadingHook(Hook):
    """Read the checkpoints the runner loads with :func:`mmlinattn.checkpoint.load_checkpoint_file`:
    tensors and plain data, mmengine's own checkpoints exactly, and a file whose pickle would call
    anything refused with :class:`mmlinattn.checkpoint.UnsafeCheckpointError`.

    Every config of this project has it as ``default_hooks.safe_checkpoint_loading`` (a named default
    hook, so a config that sets its own ``custom_hooks`` keeps it).

    Args:
        unsafe_trust_checkpoint: fully unpickle the files this run loads (they can run any code);
            e.g. ``--cfg-options default_hooks.safe_checkpoint_loading.unsafe_trust_checkpoint=True``.
    """
    priority = 'VERY_HIGH'

    def __init__(self, unsafe_trust_checkpoint: bool = False):
        if not isinstance(unsafe_trust_checkpoint, bool):
            raise ValueError(f'unsafe_trust_checkpoint must be True or False, got '
                             f'{unsafe_trust_checkpoint!r}')
        self.unsafe_trust_checkpoint = unsafe_trust_checkpoint

    def before_run(self, runner) -> None:
        load = runner.load_checkpoint
        if getattr(load, 'loads_safely', False):  # a second train/val/test call on the same runner
            return
        trust = self.unsafe_trust_checkpoint

        @functools.wraps(load)
        def load_checkpoint(filename, *args, **kwargs):
            with safe_checkpoint_loading(trusted_checkpoint=filename if trust else None):
                return load(filename, *args, **kwargs)

        load_checkpoint.loads_safely = True
        runner.load_checkpoint = load_checkpoint
