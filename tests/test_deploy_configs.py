"""The deploy configs of configs/deploy/: each loads with mmdeploy, targets onnxruntime, names a
codebase and task mmdeploy has, and says how the Laplacian kernel is exported; static ones fix the
input, dynamic ones free batch, height and width; tools/deploy_test.py fits the test set to a static
input and checks its arguments."""
import glob
import os

import pytest

from e2e_utils import ROOT

from mmlinattn.deploy.mmdeploy import laplacian_kernel_form

pytest.importorskip('mmdeploy')

DEPLOY_DIR = os.path.join(ROOT, 'configs', 'deploy')
DEPLOY_CONFIGS = sorted(glob.glob(os.path.join(DEPLOY_DIR, '*.py')))
TASKS = {'detection': ('mmdet', 'ObjectDetection', ['dets', 'labels']),
         'instance-seg': ('mmdet', 'ObjectDetection', ['dets', 'labels', 'masks']),  # mmdeploy's task for both
         'segmentation': ('mmseg', 'Segmentation', ['output']),
         'classification': ('mmpretrain', 'Classification', ['output'])}


def test_every_task_has_dynamic_static_and_standard_ops_configs():
    names = {os.path.basename(p) for p in DEPLOY_CONFIGS}
    for task in TASKS:
        assert f'{task}_onnxruntime_dynamic.py' in names
        assert f'{task}_onnxruntime-standard-ops_dynamic.py' in names
        assert any(n.startswith(f'{task}_onnxruntime_static-') for n in names), task


@pytest.mark.parametrize('path', DEPLOY_CONFIGS, ids=os.path.basename)
def test_deploy_config(path):
    from mmdeploy.utils import (get_backend, get_codebase, get_input_shape, get_ir_config,
                                get_task_type, load_config)
    (cfg, ) = load_config(path)
    name = os.path.basename(path)
    library, task, outputs = TASKS[name.split('_onnxruntime')[0]]
    assert get_backend(cfg).value == 'onnxruntime'
    assert get_codebase(cfg).value == library and get_task_type(cfg).value == task
    ir = get_ir_config(cfg)
    assert ir['save_file'] == 'end2end.onnx' and ir['output_names'] == outputs
    assert ir['opset_version'] == (16 if 'masks' in outputs else 11)
    assert laplacian_kernel_form(cfg) == ('standard_ops' if 'standard-ops' in name else 'custom_op')
    if '_static-' in name:
        height, width = map(int, name.rsplit('-', 1)[1][:-3].split('x'))
        assert get_input_shape(cfg) == [width, height]
        assert not ir.get('dynamic_axes')
    else:
        assert get_input_shape(cfg) is None
        assert ir['dynamic_axes']['input'] == {0: 'batch', 2: 'height', 3: 'width'}
        assert set(ir['dynamic_axes']) == {'input', *outputs}


@pytest.mark.parametrize('deploy_name,model_name,size', [
    ('instance-seg_onnxruntime_static-800x1344.py', 'balloon/mask_rcnn_laplacian_tiny_balloon.py', (1344, 800)),
    ('segmentation_onnxruntime_static-512x512.py', 'camvid/fpn_laplacian_tiny_camvid.py', (512, 512)),
    ('instance-seg_onnxruntime_dynamic.py', 'balloon/mask_rcnn_laplacian_tiny_balloon.py', None)])
def test_deploy_test_resizes_the_test_set_to_a_static_graphs_input(deploy_name, model_name, size):
    """A static graph refuses other sizes: tools/deploy_test.py resizes the test images to its input,
    as mmdeploy resized the exported one; a dynamic config leaves the pipeline as it is."""
    from deploy import load_configs
    from deploy_test import fit_test_pipeline_to_static_input
    deploy_cfg, model_cfg = load_configs(os.path.join(DEPLOY_DIR, deploy_name),
                                         os.path.join(ROOT, 'configs', model_name))
    before = [dict(t) for t in model_cfg.test_dataloader.dataset.pipeline]
    fit_test_pipeline_to_static_input(deploy_cfg, model_cfg)
    after = [dict(t) for t in model_cfg.test_dataloader.dataset.pipeline]
    resizes = [t for t in after if t['type'] == 'Resize']
    assert resizes
    if size is None:
        assert after == before
    else:
        assert all(t['scale'] == size and t['keep_ratio'] is False for t in resizes)
        assert [t['type'] for t in after] == [t['type'] for t in before]


def test_deploy_tools_refuse_missing_files_and_bad_numbers(tmp_path):
    import deploy_test
    deploy_cfg = os.path.join(DEPLOY_DIR, 'detection_onnxruntime_dynamic.py')
    model_cfg = os.path.join(ROOT, 'configs', 'retinanet_laplacian_tiny_1x_coco.py')
    model = tmp_path / 'end2end.onnx'
    with pytest.raises(SystemExit, match="--model .*end2end.onnx' does not exist"):
        deploy_test.check_inputs(deploy_test.parse_args([deploy_cfg, model_cfg, '--model', str(model)]))
    model.write_bytes(b'')
    with pytest.raises(SystemExit, match='--threads must be a positive number, got 0'):
        deploy_test.check_inputs(deploy_test.parse_args([deploy_cfg, model_cfg, '--model', str(model),
                                                         '--threads', '0']))
