"""The tools with our backbones on the toy data: --resume through tools/train.py, the configs through
mmdet's and mmseg's own train scripts, a 2-process distributed train and test on CPU (gloo) through
tools/dist_train.sh and tools/dist_test.sh, and the clear failures a user meets first. (Train ->
checkpoint -> test per library, with the metric checks, is test_backbones_e2e.py.) No stock model
runs here: every run trains an mmlinattn backbone."""
import os
import re

import pytest

from e2e_utils import (ROOT, SMALL_MASK_RCNN, TOY_SET, evaluate, require_toy_data, run, run_distributed,
                       toy_config)

DET_CONFIG = 'configs/mask_rcnn_laplacian_tiny_1x_coco.py'
SMALL = dict(side=128, eval_images=2)


def _stock_script(library):
    module = __import__(library)
    path = os.path.join(os.path.dirname(module.__file__), '.mim', 'tools', 'train.py')
    assert os.path.isfile(path), f'the {library} wheel ships tools/ under {library}/.mim'
    return path


# ---------------------------------------------------------------- fast: options and failures


@pytest.mark.parametrize('config', [DET_CONFIG, 'configs/upernet_laplacian_tiny_512x512_160k_ade20k.py',
                                    'configs/pola_pvt_tiny_8xb128_in1k.py'])
def test_toy_data_option_points_every_split_at_the_toy_set(tmp_path, config):
    """tools/train.py's --toy-data after --cfg-options: datasets and evaluators on data/toy, the
    user's options kept."""
    import train
    from _common import load_config
    cfg = load_config(train.parse_args([os.path.join(ROOT, config), '--toy-data', '--work-dir',
                                        str(tmp_path), '--cfg-options', 'train_dataloader.batch_size=3']))
    toy_root = f'data/toy/{TOY_SET[cfg.default_scope]}'
    for split in ('train', 'val', 'test'):
        dataset = cfg[f'{split}_dataloader'].dataset
        while 'dataset' in dataset:
            dataset = dataset.dataset
        assert dataset.data_root.startswith(toy_root), (split, dataset.data_root)
    for evaluator in (cfg.val_evaluator, cfg.test_evaluator):
        assert evaluator.get('ann_file', toy_root).startswith(toy_root)
    assert cfg.train_dataloader.batch_size == 3 and cfg.work_dir == str(tmp_path)


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


def test_missing_checkpoint_fails_clearly(tmp_path):
    missing = tmp_path / 'no_such.pth'
    proc = run(['tools/test.py', DET_CONFIG, missing, '--toy-data'], expect_ok=False)
    assert proc.returncode != 0
    assert f"error: checkpoint '{missing}' does not exist" in proc.output


# ---------------------------------------------------------------- slow: training runs


@pytest.mark.slow
def test_resume_continues_from_the_latest_checkpoint(tmp_path):
    config = toy_config(DET_CONFIG, tmp_path / 'config.py', iters=2, **SMALL_MASK_RCNN,
                        **{'default_hooks.checkpoint.interval': 1}, **SMALL)
    run(['tools/train.py', config, '--work-dir', tmp_path])
    assert (tmp_path / 'iter_1.pth').is_file() and (tmp_path / 'iter_2.pth').is_file()

    proc = run(['tools/train.py', config, '--work-dir', tmp_path, '--resume', '--cfg-options',
                'train_cfg.max_iters=3', 'train_cfg.val_interval=3'])
    assert f'Load checkpoint from {tmp_path / "iter_2.pth"}' in proc.output
    assert 'resumed epoch: 0, iter: 2' in proc.output, proc.output[-3000:]
    assert re.search(r'Iter\(train\) \[3/3\]', proc.output)
    assert not re.search(r'Iter\(train\) \[[12]/3\]', proc.output)  # iterations 1-2 are not redone
    assert (tmp_path / 'iter_3.pth').is_file()


@pytest.mark.slow
@pytest.mark.parametrize('library,config', [
    ('mmdet', 'configs/retinanet_pola_pvt_tiny_1x_coco.py'),
    ('mmseg', 'configs/upernet_pola_swin_tiny_512x512_160k_ade20k.py'),
])
def test_the_librarys_own_train_script_runs_our_config(tmp_path, library, config):
    """The configs' custom_imports make the stock script find the plugin's backbones."""
    config = toy_config(config, tmp_path / 'config.py', iters=2, **SMALL)
    proc = run([_stock_script(library), config, '--work-dir', tmp_path / 'work'])
    assert re.search(r'Iter\(train\) \[2/2\].*loss', proc.output), proc.output[-3000:]
    assert (tmp_path / 'work' / 'iter_2.pth').is_file()


@pytest.mark.slow
def test_distributed_train_and_test_two_processes_on_cpu(tmp_path):
    """tools/dist_train.sh and dist_test.sh with 2 processes and no GPU: gloo, DistributedDataParallel
    over our backbone (which fails on a parameter without gradient), then a 2-process evaluation."""
    config = toy_config(DET_CONFIG, tmp_path / 'config.py', iters=2, batch_size=1, **SMALL_MASK_RCNN,
                        **SMALL)

    proc = run_distributed('dist_train.sh', config, 2, '--work-dir', tmp_path)
    assert 'Distributed training: True' in proc.output
    assert 'using the gloo backend' in proc.output
    assert re.search(r'Iter\(train\) \[2/2\]', proc.output), proc.output[-3000:]
    checkpoint = tmp_path / 'iter_2.pth'
    assert checkpoint.is_file()

    output, metrics = evaluate(config, checkpoint, tmp_path / 'test', processes=2)
    assert 'coco/bbox_mAP' in metrics and 'coco/segm_mAP' in metrics
    assert re.search(r'coco/segm_mAP\s+\d', output)  # printed once, by rank 0
    assert len(re.findall(r'coco/segm_mAP\s+\d', output)) == 1
