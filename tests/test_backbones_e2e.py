"""Our backbones through the tools on the toy data: tools/train.py a couple of iterations ->
checkpoint -> tools/test.py with the library's metric (COCO bbox/segm AP, mIoU, top-1)."""
import json
import re

import pytest

from e2e_utils import require_toy_data, run

FEW = {'train': 4, 'val': 2, 'test': 4}
# (config, toy set, schedule overrides giving 2 training iterations and a checkpoint, metric keys)
CASES = [
    ('configs/mask_rcnn_laplacian_tiny_1x_coco.py', 'coco',
     ['train_cfg.max_epochs=1', 'train_dataloader.batch_size=2', 'model.test_cfg.rcnn.score_thr=0.0'],
     'epoch_1.pth', ['coco/bbox_mAP', 'coco/segm_mAP']),
    ('configs/mask_rcnn_pola_pvt_tiny_1x_coco.py', 'coco',
     ['train_cfg.max_epochs=1', 'train_dataloader.batch_size=2', 'model.test_cfg.rcnn.score_thr=0.0'],
     'epoch_1.pth', ['coco/bbox_mAP', 'coco/segm_mAP']),
    ('configs/upernet_laplacian_tiny_512x512_160k_ade20k.py', 'ade',
     ['train_cfg.max_iters=2', 'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2'],
     'iter_2.pth', ['mIoU', 'aAcc']),
    ('configs/fpn_pola_pvt_tiny_512x512_80k_ade20k.py', 'ade',
     ['train_cfg.max_iters=2', 'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2'],
     'iter_2.pth', ['mIoU', 'aAcc']),
    ('configs/laplacianformer_tiny_8xb128_in1k.py', 'imagenet',
     ['train_cfg.max_epochs=1', 'train_dataloader.batch_size=2', 'val_dataloader.batch_size=2',
      'param_scheduler.1.begin=0'],  # the cosine phase starts after a 20-epoch warm-up
     'epoch_1.pth', ['accuracy/top1', 'accuracy/top5']),
]


def _subset_options():
    return [f'{split}_dataloader.dataset.indices={n}' for split, n in FEW.items()] + [
        f'{split}_dataloader.num_workers=0' for split in FEW] + [
        f'{split}_dataloader.persistent_workers=False' for split in FEW]


@pytest.mark.parametrize('config,toy_set,schedule,checkpoint,metric_keys', CASES,
                         ids=[c[0].split('/')[-1][:-3] for c in CASES])
def test_train_checkpoint_test(tmp_path, config, toy_set, schedule, checkpoint, metric_keys):
    require_toy_data(toy_set)
    options = ['--cfg-options', *schedule, *_subset_options(), 'default_hooks.logger.interval=1']
    proc = run(['tools/train.py', config, '--toy-data', '--work-dir', tmp_path, *options])
    assert re.search(r'\(train\).*\[2/2\].*loss', proc.output), proc.output[-3000:]
    assert (tmp_path / checkpoint).is_file()

    out_json = tmp_path / 'metrics.json'
    proc = run(['tools/test.py', config, tmp_path / checkpoint, '--toy-data', '--work-dir', tmp_path,
                '--out-json', out_json, *options])
    metrics = json.loads(out_json.read_text())
    for key in metric_keys:
        assert key in metrics, (key, metrics)
        assert re.search(rf'{re.escape(key)}\s+-?\d', proc.output)
    value = float(metrics[metric_keys[0]])
    assert (-1.0 <= value <= 1.0) if toy_set == 'coco' else (0.0 <= value <= 100.0), metrics
