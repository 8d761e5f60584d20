"""The real sets through mmdet's, mmseg's and mmpretrain's own ``tools/train.py`` and ``tools/test.py``,
against the installed wheel: the shared archives converted by tools/misc/download_dataset.py, then the
wheel's shipped configs (``mmlinattn/.mim/configs/<set>/``) trained for a few iterations and their
checkpoint evaluated, printing the task's metric: COCO bbox/segm AP on balloon (downscaled, a short
epoch), mIoU on camvid_mini, top-1 on cifar10_mini. Short runs: they show the path works on real
photographs, not what the models learn (docs/benchmarks.md)."""
import os
import re

import pytest

from e2e_utils import SHARED_ARCHIVES, shared_archive
from misc import download_dataset
from test_stock_tools import run_stock

pytestmark = pytest.mark.slow

# set -> (library, config under .mim/configs, --cfg-options of a short run, the metrics test.py prints)
RUNS = {
    'balloon': ('mmdet', 'balloon/mask_rcnn_laplacian_tiny_balloon.py',
                ['train_dataloader.dataset.indices=8', 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
                 'val_dataloader.dataset.indices=3', 'test_dataloader.dataset.indices=3'],
                ('coco/bbox_mAP', 'coco/segm_mAP')),
    'camvid': ('mmseg', 'camvid/fpn_pola_pvt_tiny_camvid.py',
               ['train_cfg.max_iters=4', 'train_cfg.val_interval=4', 'param_scheduler.0.end=2',
                'param_scheduler.1.begin=2', 'param_scheduler.1.end=4', 'default_hooks.logger.interval=2'],
               ('mIoU', )),
    'cifar10': ('mmpretrain', 'cifar10/laplacianformer_tiny_1xb32_cifar10.py',
                ['train_cfg.max_iters=4', 'train_cfg.val_interval=4', 'param_scheduler.0.end=2',
                 'param_scheduler.1.begin=2', 'param_scheduler.1.end=4', 'default_hooks.logger.interval=2'],
                ('accuracy/top1', )),
}


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    """The user's data/ (the configs' relative data_root), one converted set at a time."""
    return tmp_path_factory.mktemp('user') / 'data'


@pytest.mark.parametrize('name', sorted(RUNS))
def test_stock_tools_train_and_test_the_shipped_config_on_a_real_set(installed_wheel, data_dir, name):
    site, _ = installed_wheel
    library, config, options, metrics = RUNS[name]
    download_dataset.prepare(name, str(data_dir), shared_archive(SHARED_ARCHIVES[name]),
                             max_size=256 if name == 'balloon' else None)
    config = site / 'mmlinattn' / '.mim' / 'configs' / config
    assert config.is_file(), config
    user = data_dir.parent
    work = f'work_{name}'
    proc = run_stock(library, 'train.py', config, '--work-dir', work, '--cfg-options', *options, cwd=user,
                     site=site)
    assert re.search(r'\(train\).*loss', proc.output), proc.output[-3000:]
    checkpoint = open(user / work / 'last_checkpoint').read().strip()
    proc = run_stock(library, 'test.py', config, checkpoint, '--work-dir', f'test_{name}',
                     '--cfg-options', *options, cwd=user, site=site)
    assert f'Loads checkpoint by mmlinattn backend from path: {checkpoint}' in proc.output
    for metric in metrics:
        assert re.search(re.escape(metric) + r': \d', proc.output), proc.output[-3000:]
    print(*(line for line in proc.output.splitlines() if any(m in line for m in metrics)), sep='\n')
