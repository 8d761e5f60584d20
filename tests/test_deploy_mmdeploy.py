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


def image_mismatch(ref, got, min_score=0.1, box_atol=0.25, score_atol=1e-3, mask_atol=0.02):
    """Why one image's onnxruntime outputs differ from PyTorch's, or None: as many detections score
    >= ``min_score``, each PyTorch one has a twin (the best-IoU onnxruntime box) with its label, its
    box within ``box_atol`` px, its score within ``score_atol`` and its 28x28 mask probabilities
    within ``mask_atol``."""
    from mmdet.structures.bbox import bbox_overlaps
    (dets, labels, masks), (got_dets, got_labels, got_masks) = [[t[0] for t in out] for out in (ref, got)]
    strong = np.flatnonzero(dets[:, 4] >= min_score)
    if int((got_dets[:, 4] >= min_score).sum()) != len(strong):
        return f'{len(strong)} against {int((got_dets[:, 4] >= min_score).sum())} detections'
    if not len(strong):
        return None
    twins = bbox_overlaps(torch.from_numpy(dets[strong, :4]), torch.from_numpy(got_dets[:, :4])).argmax(1)
    for index, twin in zip(strong, twins.numpy()):
        errors = (abs(got_dets[twin, :4] - dets[index, :4]).max(), abs(got_dets[twin, 4] - dets[index, 4]),
                  abs(got_masks[twin] - masks[index]).max())
        if got_labels[twin] != labels[index] or any(e > tol for e, tol in zip(errors, (box_atol, score_atol,
                                                                                        mask_atol))):
            return f'detection {index}: label {got_labels[twin]} / {labels[index]}, box, score, mask off by {errors}'
    return None


def assert_same_outputs(pairs):
    """All photos but at most one match (:func:`image_mismatch`). The exception is a discrete one: a
    proposal or box kept on one side and dropped on the other at an NMS or top-k boundary (ONNX's
    NonMaxSuppression and RoiAlign against mmcv's), after which that photo's detections differ; on
    the others boxes agree to hundredths of a pixel and scores to 1e-4 (the backbone to 1e-5)."""
    mismatches = [m for m in (image_mismatch(ref, got) for ref, got in pairs) if m]
    assert len(mismatches) <= 1, mismatches
    assert sum(int((ref[0][0][:, 4] >= 0.1).sum()) for ref, _ in pairs) > 0


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
                                                          checkpoint, images[:4]))
