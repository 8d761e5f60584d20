"""tools/benchmark.py learning, without training: a run's record from mmengine's scalars.json, the
table over seeds, and the options that move a config to another data root."""
import json

import pytest
from mmengine.config import Config

from dev.benchmarks import learning
from e2e_utils import ROOT


def _write_scalars(work_dir, stamp, records):
    path = work_dir / stamp / 'vis_data' / 'scalars.json'
    path.parent.mkdir(parents=True)
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))


def test_run_record_reads_the_latest_run_and_leaves_out_the_first_window(tmp_path):
    train = [dict(step=10, loss=2.0, time=5.0, data_time=4.0), dict(step=20, loss=1.5, time=1.0, data_time=0.1),
             dict(step=30, loss=1.0, time=3.0, data_time=0.3)]
    _write_scalars(tmp_path, '20260101_000000', [dict(step=5, loss=9.0, time=1.0, data_time=0.0), {'acc': 1.0}])
    _write_scalars(tmp_path, '20260102_000000', train + [{'acc': 10.0, 'step': 15}, {'acc': 42.0, 'step': 30}])
    record = learning.run_record(str(tmp_path))
    assert record['curve'] == [(10, 2.0), (20, 1.5), (30, 1.0)]
    assert record['iter_s'] == pytest.approx(2.0)
    assert record['data_share'] == pytest.approx(0.2 / 2.0)
    assert record['val'] == {'acc': 42.0, 'step': 30}


def test_run_record_refuses_a_log_without_validation(tmp_path):
    _write_scalars(tmp_path, '20260101_000000', [dict(step=1, loss=1.0, time=1.0, data_time=0.1)])
    with pytest.raises(RuntimeError, match='no validation record'):
        learning.run_record(str(tmp_path))


def test_summary_rows_are_means_with_the_seeds_range():
    runs = [dict(model=m, seed=s, val={'mIoU': v, 'aAcc': 2 * v}, curve=[(10, 9.0), (20, v / 10)],
                 wall_s=60.0 * (s + 1), images_per_s=10.0 + s, data_share=0.1)
            for m, s, v in [('A', 0, 10.0), ('A', 1, 20.0), ('B', 0, 5.0)]]
    section = learning.summarise(runs, ('mIoU', 'aAcc'), 'val')
    assert [row['model'] for row in section.rows] == ['A', 'B']
    a = section.rows[0]
    assert (a['seeds'], a['mIoU (mean)'], a['min'], a['max'], a['aAcc (mean)']) == ('0 1', 15.0, 10.0, 20.0, 30.0)
    assert a['last train loss'] == pytest.approx(1.5)
    assert (a['wall min / run'], a['train images/s'], a['data_time %']) == (1.5, 10.5, pytest.approx(10.0))
    assert section.columns == ['model', 'seeds', 'mIoU (mean)', 'min', 'max', 'aAcc (mean)', 'last train loss',
                               'wall min / run', 'train images/s', 'data_time %']
    assert section.rows[1]['aAcc (mean)'] == 10.0


def test_data_root_options_move_the_datasets_and_the_coco_evaluator():
    cfg = Config.fromfile(f'{ROOT}/configs/balloon/mask_rcnn_laplacian_tiny_balloon.py')
    assert learning._data_root_options(cfg, '/elsewhere/balloon') == [
        'train_dataloader.dataset.data_root=/elsewhere/balloon/', 'val_dataloader.dataset.data_root=/elsewhere/balloon/',
        'val_evaluator.ann_file=/elsewhere/balloon/annotations/instances_val.json']
    cifar = Config.fromfile(f'{ROOT}/configs/cifar10/resnet18_1xb32_cifar10.py')
    assert learning._data_root_options(cifar, 'd/') == ['train_dataloader.dataset.data_root=d/',
                                                         'val_dataloader.dataset.data_root=d/']


def test_each_precision_is_its_own_row_and_bf16_trains_with_amp(tmp_path, monkeypatch):
    """--precisions fp32 bf16: one run per row, precision and seed, bf16 through tools/train.py
    --amp, the --cfg-options given to every run; the rows are labelled by precision."""
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        work_dir = tmp_path / command[command.index('--work-dir') + 1]
        _write_scalars(work_dir, '20261205_000000', [
            {'step': 1, 'loss': 3.0, 'time': 9.0, 'data_time': 0.1},
            {'step': 2, 'loss': 2.0, 'time': 0.5, 'data_time': 0.1},
            {'step': 2, 'accuracy/top1': 12.0}])
        return type('Done', (), {'returncode': 0, 'stderr': ''})()

    monkeypatch.setattr(learning.subprocess, 'run', fake_run)
    parser = __import__('argparse').ArgumentParser()
    learning.add_arguments(parser)
    args = parser.parse_args(['--task', 'cifar10', '--models', 'ResNet-18', '--seeds', '0',
                              '--precisions', 'fp32', 'bf16', '--cfg-options', 'train_cfg.max_iters=4',
                              '--work-dir', 'w', '--data-root', str(tmp_path)])
    monkeypatch.chdir(tmp_path)
    assert learning.main(args) == 0
    assert ['--amp' in c for c in commands] == [False, True]
    assert all('train_cfg.max_iters=4' in c for c in commands)
