"""tools/benchmark.py deploy: every row's config exists (the libraries' shipped ones included) and
loads without a pretrained download, the table's ratios, and the option checks. The measurement
itself (exports and timings, minutes per row) is the benchmark's, not a test's."""
import os

import pytest

from dev.benchmarks import deploy_latency as deploy
from dev.benchmarks.common import format_table


@pytest.mark.parametrize('task,label', [(t, label) for t, (_, _, rows) in deploy.TASKS.items() for label in rows])
def test_every_row_config_loads_without_pretrained_weights(task, label):
    spec, edits = deploy.TASKS[task][2][label]
    assert os.path.isfile(deploy.config_path(spec)), spec
    cfg = deploy.model_config(spec, edits)
    assert cfg.model.backbone.init_cfg is None
    if label.startswith('PVT-T') and task == 'Mask R-CNN':
        assert cfg.model.backbone.type == 'mmdet.PyramidVisionTransformer'
        assert cfg.model.neck.in_channels == [64, 128, 320, 512]
    deploy_task = deploy.TASKS[task][0]
    for form in deploy.DEPLOY_CONFIGS.values():
        assert os.path.isfile(os.path.join(deploy.REPO_ROOT, 'configs', 'deploy', form.format(task=deploy_task)))


def test_the_table_compares_with_pytorch_and_the_task_baseline():
    rows = [dict(task='RetinaNet', model='LaplacianFormer-T', input='800x1216',
                 **{'onnxruntime custom_op': 2.0, 'onnxruntime standard_ops': 6.0, 'PyTorch fp32': 4.0,
                    'PyTorch bf16': 3.0}),
            dict(task='RetinaNet', model='ResNet-50 (mmdet)', input='800x1216',
                 **{'onnxruntime custom_op': 3.0, 'PyTorch fp32': 3.0, 'PyTorch bf16': 1.5})]
    section = deploy.summarise(rows, threads=2)
    ours, baseline = section.rows
    assert ours['onnxruntime speed vs PyTorch fp32'] == 2.0 and ours['onnxruntime speed vs PyTorch bf16'] == 1.5
    assert baseline['onnxruntime speed vs PyTorch bf16'] == 0.5
    assert ours['onnxruntime speed vs the baseline'] == 1.5
    assert ours['onnxruntime, standard ops ms'] == 6.0 and baseline['onnxruntime, standard ops ms'] is None
    assert '2 threads' in format_table(section)


def test_each_input_size_has_its_own_baseline():
    times = {'onnxruntime custom_op': 1.0, 'PyTorch fp32': 1.0, 'PyTorch bf16': 1.0}
    rows = [dict(task='RetinaNet', model='LaplacianFormer-T', input='800x1088', **times),
            dict(task='RetinaNet', model='LaplacianFormer-T', input='1344x800', **dict(times, **{
                'onnxruntime custom_op': 2.0})),
            dict(task='RetinaNet', model='ResNet-50 (mmdet)', input='800x1088', **dict(times, **{
                'onnxruntime custom_op': 3.0})),
            dict(task='RetinaNet', model='ResNet-50 (mmdet)', input='1344x800', **dict(times, **{
                'onnxruntime custom_op': 4.0}))]
    section = deploy.summarise(rows, threads=2)
    assert [(r['model'], r['input']) for r in section.rows] == [
        ('LaplacianFormer-T', '800x1088'), ('ResNet-50 (mmdet)', '800x1088'),
        ('LaplacianFormer-T', '1344x800'), ('ResNet-50 (mmdet)', '1344x800')]
    assert [r['onnxruntime speed vs the baseline'] for r in section.rows] == [3.0, 1.0, 2.0, 1.0]


def test_coco_latency_images_are_the_common_shape_and_the_one_filling_the_test_scale(tmp_path, monkeypatch):
    from PIL import Image
    folder = tmp_path / 'data' / 'coco' / 'val2017'
    folder.mkdir(parents=True)
    for name, size in {'a.jpg': (500, 375), 'b.jpg': (640, 480), 'c.jpg': (383, 640), 'd.jpg': (640, 360),
                       'e.jpg': (640, 480)}.items():
        Image.new('RGB', size).save(folder / name)
    monkeypatch.setattr(deploy, 'REPO_ROOT', str(tmp_path))
    assert [os.path.basename(p) for p in deploy.test_images('coco')] == ['b.jpg', 'c.jpg']
    with pytest.raises(SystemExit, match='--dataset-name ade20k'):
        deploy.test_images('ade')


def test_unknown_rows_are_refused(capsys):
    import argparse
    parser = argparse.ArgumentParser()
    deploy.add_arguments(parser)
    assert deploy.main(parser.parse_args(['--tasks', 'UperNet', '--models', 'ResNet-50 (mmdet)'])) == 2
    assert "no row named ['ResNet-50 (mmdet)']" in capsys.readouterr().err


def test_onnxruntime_op_times_per_run_and_the_profile_table(tmp_path):
    """A two-node graph (MatMul then Relu) profiled: both op types, per run, largest first; the table
    keeps the top op types and sums the rest."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node('MatMul', ['x', 'w'], ['y']), helper.make_node('Relu', ['y'], ['z'])], 'g',
        [helper.make_tensor_value_info('x', TensorProto.FLOAT, [256, 256])],
        [helper.make_tensor_value_info('z', TensorProto.FLOAT, [256, 256])],
        [helper.make_tensor('w', TensorProto.FLOAT, [256, 256], np.ones(256 * 256, np.float32))])
    path = str(tmp_path / 'g.onnx')
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid('', 13)]), path)
    times = deploy.onnxruntime_op_times(path, {'x': np.ones((256, 256), np.float32)}, threads=1, runs=2,
                                        work_dir=str(tmp_path))
    assert set(times) == {'MatMul', 'Relu'} and all(ms > 0 for ms in times.values())
    assert list(times.values()) == sorted(times.values(), reverse=True)

    rows = [dict(task='RetinaNet', model='LaplacianFormer-T', input='800x1088',
                 profile={'LaplacianKernel': 5.0, 'Conv': 3.0, 'MatMul': 1.0, 'Add': 1.0})]
    section = deploy.summarise_profiles(rows, top=2)
    assert [(r['op type'], r['ms'], r['share %']) for r in section.rows] == [
        ('LaplacianKernel', 5.0, 50.0), ('Conv', 3.0, 30.0), ('(other)', 2.0, 20.0)]
