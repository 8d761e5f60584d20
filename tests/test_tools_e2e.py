"""The toolchain end to end with stock OpenMMLab models on the toy data: train -> checkpoint -> test
(with the library's metric) -> resume, through tools/train.py and tools/test.py, the libraries' own
scripts, and a 2-process distributed run on CPU (gloo). Also the clear failures a user meets first."""
import json
import os
import re

import pytest

from e2e_utils import ROOT, dump_toy_config, free_port, require_toy_data, run

DET_CONFIG = 'tests/configs/mask_rcnn_r18_fpn_toy_coco.py'
SEG_CONFIG = 'tests/configs/fpn_r18_toy_ade20k.py'
CLS_CONFIG = 'tests/configs/resnet18_toy_imagenet.py'
FEW_VAL_IMAGES = ['--cfg-options', 'test_dataloader.dataset.indices=6']


def _test_metrics(config, checkpoint, work_dir, extra=()):
    out_json = work_dir / 'metrics.json'
    proc = run(['tools/test.py', config, checkpoint, '--toy-data', '--work-dir', work_dir,
                '--out-json', out_json, *extra])
    return proc.output, json.loads(out_json.read_text())


def test_mmdet_train_checkpoint_test_resume(tmp_path):
    require_toy_data('coco')
    proc = run(['tools/train.py', DET_CONFIG, '--toy-data', '--work-dir', tmp_path])
    assert re.search(r'Iter\(train\) \[2/2\].*loss_mask', proc.output), proc.output[-3000:]
    checkpoint = tmp_path / 'iter_2.pth'
    assert checkpoint.is_file()

    output, metrics = _test_metrics(DET_CONFIG, checkpoint, tmp_path, FEW_VAL_IMAGES)
    for key in ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50'):
        assert key in metrics and -1.0 <= float(metrics[key]) <= 1.0, metrics
    assert 'Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all' in output  # CocoMetric's table
    assert re.search(r'coco/segm_mAP\s+\S+', output)  # our printed summary

    proc = run(['tools/train.py', DET_CONFIG, '--toy-data', '--work-dir', tmp_path, '--resume',
                '--cfg-options', 'train_cfg.max_iters=3'])
    assert 'resumed epoch: 0, iter: 2' in proc.output, proc.output[-3000:]
    assert re.search(r'Iter\(train\) \[3/3\]', proc.output)
    assert 'Iter(train) [1/3]' not in proc.output
    assert (tmp_path / 'iter_3.pth').is_file()


def test_mmdet_stock_train_script(tmp_path):
    import mmdet
    stock_train = os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')
    assert os.path.isfile(stock_train), 'mmdet wheel ships tools/ under mmdet/.mim'
    require_toy_data('coco')
    config = dump_toy_config(DET_CONFIG, tmp_path / 'config.py')
    proc = run([stock_train, config, '--work-dir', tmp_path / 'work'])
    assert re.search(r'Iter\(train\) \[2/2\]', proc.output), proc.output[-3000:]
    assert (tmp_path / 'work' / 'iter_2.pth').is_file()


def test_mmdet_distributed_two_processes_on_cpu(tmp_path):
    require_toy_data('coco')
    proc = run(['-m', 'torch.distributed.run', '--nproc_per_node=2', f'--master_port={free_port()}',
                'tools/train.py', DET_CONFIG, '--toy-data', '--launcher', 'pytorch',
                '--work-dir', tmp_path, '--cfg-options', 'train_dataloader.batch_size=1'],
               env={'OMP_NUM_THREADS': '1'})
    assert 'Distributed training: True' in proc.output
    assert 'using the gloo backend' in proc.output
    assert re.search(r'Iter\(train\) \[2/2\]', proc.output), proc.output[-3000:]
    assert (tmp_path / 'iter_2.pth').is_file()


def test_mmseg_train_checkpoint_test(tmp_path):
    require_toy_data('ade')
    proc = run(['tools/train.py', SEG_CONFIG, '--toy-data', '--work-dir', tmp_path])
    assert re.search(r'Iter\(train\) \[2/2\].*decode.loss_ce', proc.output), proc.output[-3000:]
    output, metrics = _test_metrics(SEG_CONFIG, tmp_path / 'iter_2.pth', tmp_path, FEW_VAL_IMAGES)
    assert 0.0 <= float(metrics['mIoU']) <= 100.0 and 'aAcc' in metrics, metrics
    assert '| Class |' in output or 'per class results' in output  # IoUMetric's table


def test_mmseg_stock_train_script(tmp_path):
    import mmseg
    stock_train = os.path.join(os.path.dirname(mmseg.__file__), '.mim', 'tools', 'train.py')
    assert os.path.isfile(stock_train), 'mmseg wheel ships tools/ under mmseg/.mim'
    require_toy_data('ade')
    config = dump_toy_config(SEG_CONFIG, tmp_path / 'config.py')
    run([stock_train, config, '--work-dir', tmp_path / 'work'])
    assert (tmp_path / 'work' / 'iter_2.pth').is_file()


def test_mmpretrain_train_checkpoint_test(tmp_path):
    require_toy_data('imagenet')
    proc = run(['tools/train.py', CLS_CONFIG, '--toy-data', '--work-dir', tmp_path])
    assert re.search(r'Iter\(train\) \[2/2\].*loss', proc.output), proc.output[-3000:]
    _, metrics = _test_metrics(CLS_CONFIG, tmp_path / 'iter_2.pth', tmp_path)
    assert 0.0 <= float(metrics['accuracy/top1']) <= 100.0, metrics
    assert 'accuracy/top5' in metrics


def test_unknown_backbone_type_fails_clearly(tmp_path):
    config = tmp_path / 'bad_backbone.py'
    config.write_text(f"_base_ = ['{os.path.join(ROOT, DET_CONFIG)}']\n"
                      "model = dict(backbone=dict(_delete_=True, type='mmlinattn.NoSuchBackbone'))\n")
    require_toy_data('coco')
    proc = run(['tools/train.py', config, '--toy-data', '--work-dir', tmp_path], expect_ok=False)
    assert proc.returncode != 0
    assert ("error: model.backbone.type='mmlinattn.NoSuchBackbone' is not registered by mmlinattn; "
            'registered types: ') in proc.output
    assert 'LaplacianFormer' in proc.output and 'PolaPVT' in proc.output


def test_missing_data_root_fails_clearly(tmp_path):
    missing = tmp_path / 'no_such_coco'
    proc = run(['tools/train.py', DET_CONFIG, '--work-dir', tmp_path, '--cfg-options',
                f'train_dataloader.dataset.data_root={missing}/'], expect_ok=False)
    assert proc.returncode != 0
    assert f"the data root '{missing}/' of train_dataloader does not exist" in proc.output
    assert '--toy-data' in proc.output
