"""Where the plugin reads checkpoint files, and how: nothing in a file runs unless the user asks.

:func:`load_checkpoint_file` reads a local file with
1. ``torch.load(weights_only=True)`` with :data:`MMENGINE_CHECKPOINT_GLOBALS` allow-listed for that
   load: plain weights and mmengine's own checkpoints (resume, ``load_from``); torch < 2.5 has no
   such allow-list and goes straight to 2.;
2. if torch refuses a global, the restricted unpickler (:mod:`mmlinattn.restricted_unpickler`): the
   tensors and plain data as stored, every other object as an inert :class:`UnloadedObject` (the
   yacs config and argparse namespaces of the official PolaFormer files), with a warning naming
   their classes; a file that would call anything fails with :class:`UnsafeCheckpointError`;
3. only with ``unsafe_trust_checkpoint=True``, a full unpickle, with a warning naming the file.
Other schemes (``http://``, ``open-mmlab://``, ...) go through mmengine's loader, weights-only;
they are refused on torch < 2.6, where that loader would unpickle fully (also inside
:func:`safe_checkpoint_loading`).

:func:`safe_checkpoint_loading` makes mmengine's own loading (``load_checkpoint``, a Runner's resume
and ``load_from``) use the same policy inside a ``with`` block;
:class:`mmlinattn.hooks.SafeCheckpointLoadingHook` runs each of a runner's loads in one, which is how
every OpenMMLab tool (the plugin's and mmdet's, mmseg's, mmpretrain's stock ones) reads checkpoints
with the project's configs. ``import mmlinattn`` changes neither mmengine's loader nor torch's
allow-list.
"""
import contextlib
import logging
import os.path as osp
import pickle
from typing import Optional

import torch
from mmengine.logging import print_log
from mmengine.runner.checkpoint import CheckpointLoader
from torch.torch_version import TorchVersion

from mmlinattn import restricted_unpickler
from mmlinattn.restricted_unpickler import (MMENGINE_CHECKPOINT_GLOBALS, UnloadedObject,
                                            UnsafeCheckpointError, unloaded_class_paths)

__all__ = ['load_checkpoint_file', 'safe_checkpoint_loading', 'MMENGINE_CHECKPOINT_GLOBALS',
           'UnloadedObject', 'UnsafeCheckpointError']

# torch.serialization.safe_globals (torch >= 2.5). Without it the restricted unpickler, which
# allows the same globals, reads every local file.
_SAFE_GLOBALS = getattr(torch.serialization, 'safe_globals', None)
# mmengine's remote loaders call torch.load with torch's default, weights-only from torch 2.6 on;
# before, they would unpickle fully, so remote files are refused there.
_REMOTE_LOADS_WEIGHTS_ONLY = TorchVersion(torch.__version__) >= (2, 6)

OPT_IN = ('If you trust the file, load it with --unsafe-trust-checkpoint (mmlinattn\'s tools/train.py, '
          'test.py, convert_checkpoint.py), --cfg-options '
          'default_hooks.safe_checkpoint_loading.unsafe_trust_checkpoint=True (any OpenMMLab '
          'tools/train.py or test.py with a config that inherits mmlinattn\'s) or '
          'unsafe_trust_checkpoint=True (a Pretrained init_cfg, '
          'mmlinattn.checkpoint.load_checkpoint_file).')


def load_checkpoint_file(filename: str, map_location='cpu', unsafe_trust_checkpoint: bool = False):
    """The object stored in ``filename`` (a local path or any scheme mmengine's loader knows),
    read without running code from it unless ``unsafe_trust_checkpoint`` (see the module doc)."""
    if not isinstance(unsafe_trust_checkpoint, bool):
        raise ValueError(f'unsafe_trust_checkpoint must be True or False, got '
                         f'{unsafe_trust_checkpoint!r}')
    if any(prefix and filename.startswith(prefix) for prefix in CheckpointLoader._schemes):
        if unsafe_trust_checkpoint:
            raise ValueError(f'unsafe_trust_checkpoint applies to local files; download {filename} '
                             'and pass its path')
        _refuse_remote_unless_weights_only(filename)
        with _SAFE_GLOBALS(MMENGINE_CHECKPOINT_GLOBALS):
            return CheckpointLoader.load_checkpoint(filename, map_location=map_location,
                                                    logger='current')
    path = osp.expanduser(filename)
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint {filename} does not exist')
    if unsafe_trust_checkpoint:
        print_log(f'mmlinattn: fully unpickling {filename} (unsafe_trust_checkpoint): it can run '
                  'any code it holds', logger='current', level=logging.WARNING)
        return torch.load(path, map_location=map_location, weights_only=False)
    if _SAFE_GLOBALS is not None:
        try:
            with _SAFE_GLOBALS(MMENGINE_CHECKPOINT_GLOBALS):
                return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError:
            pass  # a global beyond the allow-list: read it with the restricted unpickler
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=False,
                                pickle_module=restricted_unpickler)
    except UnsafeCheckpointError as err:
        raise UnsafeCheckpointError(
            f'{filename}: not loaded: {err}, which would run code from the file; mmlinattn reads '
            f'checkpoints as tensors and plain data only. {OPT_IN}') from None
    unloaded = sorted(unloaded_class_paths(checkpoint))
    if unloaded:
        print_log(f'mmlinattn: {filename} holds objects of {", ".join(unloaded)}; they were read as '
                  'inert UnloadedObject records, never constructed', logger='current',
                  level=logging.WARNING)
    return checkpoint


def _refuse_remote_unless_weights_only(filename: str) -> None:
    if not _REMOTE_LOADS_WEIGHTS_ONLY:
        raise ValueError(f'{filename}: with torch {torch.__version__} mmengine\'s loader would unpickle '
                         'it fully (torch.load is weights-only by default from torch 2.6), so '
                         'mmlinattn reads local files only there; download it and pass its path')


def _refusing_loader(filename, map_location):
    _refuse_remote_unless_weights_only(filename)


@contextlib.contextmanager
def safe_checkpoint_loading(trusted_checkpoint: Optional[str] = None):
    """Inside the block mmengine's loader reads local files with :func:`load_checkpoint_file`, and
    weights-only ``torch.load`` calls (mmengine's remote loaders) accept
    :data:`MMENGINE_CHECKPOINT_GLOBALS`. ``trusted_checkpoint``: the one local file to unpickle
    fully (the user asked for it). Both are undone on exit."""
    trusted = None if trusted_checkpoint is None else osp.realpath(osp.expanduser(trusted_checkpoint))

    def load_from_mmlinattn(filename, map_location):
        return load_checkpoint_file(filename, map_location, unsafe_trust_checkpoint=(
            trusted is not None and osp.realpath(osp.expanduser(filename)) == trusted))

    # mmengine 0.10.7 can register a scheme but not remove one: swap the entries and restore them
    # (the local one always; the remote ones where torch.load is not weights-only by default).
    schemes = CheckpointLoader._schemes
    previous = dict(schemes)
    schemes[''] = load_from_mmlinattn
    if not _REMOTE_LOADS_WEIGHTS_ONLY:
        for prefix in previous:
            if prefix:
                schemes[prefix] = _refusing_loader
    try:
        with (contextlib.nullcontext() if _SAFE_GLOBALS is None
              else _SAFE_GLOBALS(MMENGINE_CHECKPOINT_GLOBALS)):
            yield
    finally:
        schemes.update(previous)
