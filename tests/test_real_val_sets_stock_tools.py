"""The main configs on the real evaluation sets in their official layouts, through mmdet's, mmseg's
and mmpretrain's own ``tools/test.py``: the shared archives converted by
tools/misc/download_dataset.py into the user's data/, a randomly initialised checkpoint of each
config, and the config's metric printed at the config's own resolution (COCO 1333x800, ADE20K's
test scale, ImageNet 224) on a few images. Near zero without trained weights, but computed on real
files: grayscale and crowd-annotated COCO images, ADE20K's 0 = "other" with reduce_zero_label."""
import os
import re
import subprocess
import sys

import pytest
import torch

from e2e_utils import ROOT, SHARED_ARCHIVES, TOOL_THREADS, shared_archive
from test_stock_tools import stock_tool

pytestmark = pytest.mark.slow

# set -> (library, config, --cfg-options of a short test, the metrics test.py prints)
RUNS = {
    'coco2017': ('mmdet', 'mask_rcnn_laplacian_tiny_1x_coco.py', ['test_dataloader.dataset.indices=3'],
                 ('coco/bbox_mAP', 'coco/segm_mAP')),
    'ade20k': ('mmseg', 'upernet_laplacian_tiny_512x512_160k_ade20k.py',
               ['test_dataloader.dataset.indices=3'], ('mIoU', )),
    'imagenet': ('mmpretrain', 'laplacianformer_tiny_8xb128_in1k.py',
                 ['test_dataloader.dataset.indices=64', 'test_dataloader.batch_size=32',
                  'test_dataloader.num_workers=1'], ('accuracy/top1', )),
}


def random_checkpoint(config, path):
    """The config's model with its own random initialisation, saved as mmengine saves one."""
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    import mmlinattn  # noqa: F401
    cfg = Config.fromfile(config)
    init_default_scope(cfg.default_scope)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)


@pytest.mark.parametrize('name', sorted(RUNS))
def test_stock_test_py_evaluates_the_main_config_on_a_real_val_set(tmp_path, name):
    from misc import download_dataset
    library, config, options, metrics = RUNS[name]
    download_dataset.prepare(name, str(tmp_path / 'data'), shared_archive(SHARED_ARCHIVES[name]))
    config = os.path.join(ROOT, 'configs', config)
    checkpoint = tmp_path / 'random.pth'
    random_checkpoint(config, checkpoint)
    proc = subprocess.run([sys.executable, stock_tool(library, 'test.py'), config, str(checkpoint),
                           '--work-dir', 'work', '--cfg-options', *options], cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS=TOOL_THREADS),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert f'Loads checkpoint by mmlinattn backend from path: {checkpoint}' in proc.stdout
    for metric in metrics:
        assert re.search(re.escape(metric) + r': \d', proc.stdout), proc.stdout[-3000:]
    print(*(line for line in proc.stdout.splitlines() if any(m in line for m in metrics)), sep='\n')
