"""Compatibility of mmengine 0.10.7 with torch >= 2.6.

torch 2.6 made ``torch.load(weights_only=True)`` the default. mmengine's checkpoints pickle its own
objects (``HistoryBuffer``, numpy scalars, ``getattr`` calls in message-hub state), so resuming or
loading a checkpoint written by mmengine's own runner fails with ``UnpicklingError``. Allow-listing
those globals would also have to allow ``getattr``, which defeats the point of ``weights_only``.

The local-file loader is therefore replaced: it first tries ``weights_only=True`` and falls back to
a full load only for the file the user named, with a one-line warning saying so. This is mmengine's
behaviour before torch 2.6, made visible.
"""
import os.path as osp
import pickle
import warnings

import torch


def load_local_checkpoint(filename: str, map_location=None):
    """Load ``filename`` with ``weights_only=True``; fall back to a full (trusted) load, with a warning."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    try:
        return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        warnings.warn(f'mmlinattn: {filename} holds objects that weights_only=True rejects '
                      f'({first_line[:120]}); loading it fully because it was named explicitly. '
                      'Only load checkpoints you trust.', stacklevel=2)
        return torch.load(filename, map_location=map_location, weights_only=False)


def patch_mmengine_checkpoint_loading() -> None:
    """Register :func:`load_local_checkpoint` as mmengine's loader for local paths."""
    from mmengine.runner.checkpoint import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', force=True)(load_local_checkpoint)
