"""The deploy configs of configs/deploy/: each loads with mmdeploy, targets onnxruntime, names a
codebase and task mmdeploy has, and says how the Laplacian kernel is exported; static ones fix the
input, dynamic ones free batch, height and width."""
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
