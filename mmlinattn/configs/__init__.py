"""The configs that ship with mmlinattn, for configs of your own that inherit them.

``mmlinattn/configs/<name>.py`` holds each config of the repository's ``configs/`` resolved (its bases
merged; written by ``tools/dev/generate_configs.py``), so a config anywhere inherits it through
mmengine's pure-Python format::

    from mmengine.config import read_base
    with read_base():
        from mmlinattn.configs.mask_rcnn_laplacian_tiny_1x_coco import *

The sources also install as ``mmlinattn/.mim/configs`` (the OpenMMLab layout), for inheriting by
path (mmengine 0.10 resolves ``_base_ = ['pkg::path']`` only for its own table of packages)::

    python -m mmlinattn.configs                                      # the names
    python -m mmlinattn.configs mask_rcnn_laplacian_tiny_1x_coco.py  # its absolute path
    ln -s "$(python -m mmlinattn.configs --dir)" mmlinattn_configs   # then, in your config:
    # _base_ = ['./mmlinattn_configs/mask_rcnn_laplacian_tiny_1x_coco.py']
"""
import os
import os.path as osp
from typing import List

_PACKAGE_DIR = osp.dirname(osp.dirname(osp.abspath(__file__)))  # mmlinattn/


def config_dir() -> str:
    """The folder of the shipped configs: ``mmlinattn/.mim/configs`` of the installed package, or the
    checkout's ``configs/`` when the package is imported from a source checkout without installing."""
    installed = osp.join(_PACKAGE_DIR, '.mim', 'configs')
    if osp.isdir(installed):
        return installed
    checkout = osp.dirname(_PACKAGE_DIR)
    if osp.isfile(osp.join(checkout, 'setup.py')) and osp.isdir(osp.join(checkout, 'configs')):
        return osp.join(checkout, 'configs')
    raise FileNotFoundError(f'mmlinattn was installed without its configs: {installed} does not exist')


def list_configs() -> List[str]:
    """Names of the full configs (the files in the config folder, without ``_base_/``)."""
    folder = config_dir()
    return sorted(f for f in os.listdir(folder)
                  if f.endswith('.py') and osp.isfile(osp.join(folder, f)))


def config_path(name: str) -> str:
    """Absolute path of a shipped config, e.g. ``config_path('mask_rcnn_laplacian_tiny_1x_coco.py')``
    (the ``.py`` may be left out; ``'_base_/plugin.py'`` names a shared part)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f'name must be a config file name such as '
                         f'"mask_rcnn_laplacian_tiny_1x_coco.py", got {name!r}')
    relative = osp.normpath(name if name.endswith('.py') else name + '.py')
    folder = config_dir()
    if osp.isabs(relative) or relative.startswith('..'):
        raise ValueError(f'name must be relative to the config folder {folder}, got {name!r}')
    path = osp.join(folder, relative)
    if not osp.isfile(path):
        raise ValueError(f'name: no config {name!r} in {folder}; the configs are: '
                         f'{", ".join(list_configs())}')
    return path


__all__ = ['config_dir', 'config_path', 'list_configs']
