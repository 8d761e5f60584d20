"""mmdeploy's command lines (tools/deploy.py, tools/deploy_test.py) on a detector that has learned
something, on real photographs: the balloon set from the shared archive, Mask R-CNN with
LaplacianFormer-T trained a few epochs here (bf16 on the CPU), exported with the project's deploy
configs. onnxruntime against PyTorch: COCO bbox/segm AP within 0.002 on the val photos, and each
photo's detections matched one by one; the standard-operator fallback gives the same detections."""
import json
import os
import sys

import numpy as np
import pytest
import torch

from e2e_utils import ROOT, SHARED_ARCHIVES, run_checked, shared_archive

pytestmark = pytest.mark.slow
pytest.importorskip('mmdeploy')

MODEL_CFG = os.path.join(ROOT, 'configs', 'balloon', 'mask_rcnn_laplacian_tiny_balloon.py')
DEPLOY_CFG = os.path.join(ROOT, 'configs', 'deploy', 'instance-seg_onnxruntime_dynamic.py')
STANDARD_OPS_CFG = os.path.join(ROOT, 'configs', 'deploy',
                                'instance-seg_onnxruntime-standard-ops_dynamic.py')
EPOCHS = 4


def tool(name, *args, cwd):
    return run_checked([sys.executable, os.path.join(ROOT, 'tools', name), *args], cwd=cwd,
                       env=dict(os.environ, OMP_NUM_THREADS='2'))


def train(user):
    """data/balloon in ``user``, and the checkpoint of EPOCHS epochs of tools/train.py --amp."""
    from misc import download_dataset
    download_dataset.prepare('balloon', str(user / 'data'), shared_archive(SHARED_ARCHIVES['balloon']),
                             max_size=256)
    tool('train.py', MODEL_CFG, '--amp', '--work-dir', 'train', '--cfg-options',
         'randomness.seed=0', f'train_cfg.max_epochs={EPOCHS}', f'train_cfg.val_interval={EPOCHS}',
         f'param_scheduler.1.end={EPOCHS}', cwd=user)
    return user, str(user / 'train' / f'epoch_{EPOCHS}.pth')


def val_images(user):
    folder = user / 'data' / 'balloon' / 'val'
    return sorted(str(p) for p in folder.glob('*.jpg'))


def rewritten_and_onnxruntime_outputs(deploy_cfg, onnx_file, checkpoint, images):
    """Per image, the outputs (dets, labels, masks) of the PyTorch model as mmdeploy rewrites it for
    export (its NMS and post-processing, eager) and of the exported graph in onnxruntime, on the
    same input tensor: what the export and the op library must reproduce."""
    import onnxruntime
    from mmdeploy.apis import build_task_processor
    from mmdeploy.core import RewriterContext, patch_model
    from mmdeploy.utils import IR, load_config

    from mmlinattn.checkpoint import safe_checkpoint_loading
    from mmlinattn.deploy.onnxruntime import session_options
    deploy, model = load_config(deploy_cfg, MODEL_CFG)
    processor = build_task_processor(model, deploy, 'cpu')
    with safe_checkpoint_loading():
        torch_model = processor.build_pytorch_model(checkpoint)
    patched = patch_model(torch_model, cfg=deploy, backend='onnxruntime', ir=IR.ONNX)
    session = onnxruntime.InferenceSession(onnx_file, session_options(threads=2),
                                           providers=['CPUExecutionProvider'])
    pairs = []
    for image in images:
        data, inputs = processor.create_input(image, None, data_preprocessor=torch_model.data_preprocessor)
        with RewriterContext(cfg=deploy, backend='onnxruntime', opset=11), torch.no_grad():
            expected = patched(inputs, data_samples=data['data_samples'], mode='predict')
        got = session.run(None, {'input': inputs.numpy()})
        pairs.append(([t.numpy() for t in expected], got))
    return pairs


def assert_same_outputs(pairs, min_score=0.1, box_atol=0.5, score_atol=5e-3, mask_atol=0.05):
    """Every detection scoring >= ``min_score`` in PyTorch has an onnxruntime twin (the best-IoU
    box): same label, box within ``box_atol`` px, score within ``score_atol``, 28x28 mask
    probabilities within ``mask_atol``; and as many detections score >= min_score, give or take
    one. The slack is the heads' (ONNX's RoiAlign and NMS against mmcv's; the backbone's outputs
    agree to 1e-5): detections near a threshold can come and go."""
    from mmdet.structures.bbox import bbox_overlaps
    compared = 0
    for (dets, labels, masks), (got_dets, got_labels, got_masks) in pairs:
        dets, labels, masks = dets[0], labels[0], masks[0]
        got_dets, got_labels, got_masks = got_dets[0], got_labels[0], got_masks[0]
        strong = np.flatnonzero(dets[:, 4] >= min_score)
        assert abs(int((got_dets[:, 4] >= min_score).sum()) - len(strong)) <= 1
        if not len(strong):
            continue
        iou = bbox_overlaps(torch.from_numpy(dets[strong, :4]), torch.from_numpy(got_dets[:, :4]))
        for row, index in enumerate(strong):
            twin = int(iou[row].argmax())
            assert got_labels[twin] == labels[index]
            assert np.abs(got_dets[twin, :4] - dets[index, :4]).max() <= box_atol
            assert abs(got_dets[twin, 4] - dets[index, 4]) <= score_atol
            assert np.abs(got_masks[twin] - masks[index]).max() <= mask_atol
            compared += 1
    assert compared > 0


def test_deploy_and_evaluate_match_pytorch_on_the_val_photos(tmp_path):
    """One training run for both exports: with the op library, then with standard operators."""
    user, checkpoint = train(tmp_path / 'user')
    images = val_images(user)
    work = tmp_path / 'ort'
    tool('deploy.py', DEPLOY_CFG, MODEL_CFG, checkpoint, images[0], '--work-dir', str(work),
         '--test-img', *images[:2], '--dump-info', cwd=user)
    for name in ('end2end.onnx', 'output_pytorch_0.jpg', 'output_onnxruntime_1.jpg', 'deploy.json',
                 'pipeline.json', 'detail.json'):
        assert (work / name).is_file(), name
    import onnx
    graph = onnx.load(str(work / 'end2end.onnx'), load_external_data=False).graph
    assert [n for n in graph.node if n.domain == 'mmlinattn' and n.op_type == 'LaplacianKernel']

    tool('deploy_test.py', DEPLOY_CFG, MODEL_CFG, '--model', str(work / 'end2end.onnx'),
         '--threads', '2', '--work-dir', str(tmp_path / 'ort_test'), '--out-json',
         str(tmp_path / 'ort.json'), cwd=user)
    tool('test.py', MODEL_CFG, checkpoint, '--work-dir', str(tmp_path / 'pt_test'), '--out-json',
         str(tmp_path / 'pt.json'), cwd=user)
    ort_metrics, pt_metrics = (json.loads((tmp_path / f'{n}.json').read_text()) for n in ('ort', 'pt'))
    print('PyTorch', pt_metrics, '\nonnxruntime', ort_metrics)
    for key in ('coco/bbox_mAP', 'coco/segm_mAP'):  # COCO AP, printed to 3 decimals
        assert abs(ort_metrics[key] - pt_metrics[key]) <= 0.002 + 1e-9, key
    assert pt_metrics['coco/bbox_mAP_50'] > 0, 'the checkpoint should have learned something'

    assert_same_outputs(rewritten_and_onnxruntime_outputs(DEPLOY_CFG, str(work / 'end2end.onnx'),
                                                          checkpoint, images))

    # the standard-operator fallback: no op library, the same outputs
    work = tmp_path / 'standard'
    tool('deploy.py', STANDARD_OPS_CFG, MODEL_CFG, checkpoint, images[0], '--work-dir', str(work),
         cwd=user)
    graph = onnx.load(str(work / 'end2end.onnx'), load_external_data=False).graph
    assert not [n for n in graph.node if n.domain == 'mmlinattn']
    assert_same_outputs(rewritten_and_onnxruntime_outputs(STANDARD_OPS_CFG, str(work / 'end2end.onnx'),
                                                          checkpoint, images))
