"""mmdeploy's command lines (tools/deploy.py, tools/deploy_test.py) on models that have learned
something, on real photographs from the shared archives, each trained here a little (bf16 where
the CPU has bf16 instructions, else fp32) and exported with the project's deploy configs;
onnxruntime against PyTorch on the same images:

- Mask R-CNN with LaplacianFormer-T on balloon: COCO bbox/segm AP within 0.002 on the val photos and
  each photo's detections matched one by one; the standard-operator fallback gives the same detections;
- the LaplacianFormer-T classifier on CIFAR-10 (top-1) and Semantic FPN with LaplacianFormer-T on
  CamVid (mIoU): the metric within 0.1 point, each image's class scores / class map matched."""
import json
import os
import sys

import numpy as np
import pytest
import torch

from e2e_utils import ROOT, SHARED_ARCHIVES, TOOL_THREADS, amp_args, run_checked, shared_archive

pytestmark = pytest.mark.slow
pytest.importorskip('mmdeploy')

MODEL_CFG = os.path.join(ROOT, 'configs', 'balloon', 'mask_rcnn_laplacian_tiny_balloon.py')
DEPLOY_CFG = os.path.join(ROOT, 'configs', 'deploy', 'instance-seg_onnxruntime_dynamic.py')
STANDARD_OPS_CFG = os.path.join(ROOT, 'configs', 'deploy',
                                'instance-seg_onnxruntime-standard-ops_dynamic.py')
EPOCHS = 4


def short_schedule(iters, warmup):
    """--cfg-options of an iteration-based config's run of ``iters`` iterations, validated at the end."""
    return [f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
            f'param_scheduler.0.end={warmup}', f'param_scheduler.1.begin={warmup}',
            f'param_scheduler.1.end={iters}']


# set -> (model config, deploy config, a short training run, the metric, the test images (glob under
# data/), what the trained model must at least score (chance: top-1 10; mIoU of one class everywhere ~2))
CLASSIFIER_AND_SEGMENTOR = {
    'cifar10': ('cifar10/laplacianformer_tiny_1xb32_cifar10.py', 'classification_onnxruntime_dynamic.py',
                short_schedule(100, 20), 'accuracy/top1', 'cifar10/test/*/*.jpg', 15.0),
    'camvid': ('camvid/fpn_laplacian_tiny_camvid.py', 'segmentation_onnxruntime_dynamic.py',
               short_schedule(40, 10), 'mIoU', 'camvid/img_dir/val/*.png', 8.0),
}


def tool(name, *args, cwd):
    return run_checked([sys.executable, os.path.join(ROOT, 'tools', name), *args], cwd=cwd,
                       env=dict(os.environ, OMP_NUM_THREADS=TOOL_THREADS))


def train(user, set_name, model_cfg, options, max_size=None):
    """data/<set> in ``user`` from the shared archive, and the last checkpoint of tools/train.py
    (``--amp`` where bf16 is native) with ``options``."""
    from misc import download_dataset
    download_dataset.prepare(set_name, str(user / 'data'), shared_archive(SHARED_ARCHIVES[set_name]),
                             max_size=max_size)
    tool('train.py', model_cfg, *amp_args(), '--work-dir', 'train', '--cfg-options', 'randomness.seed=0',
         *options, cwd=user)
    return os.path.join(user, (user / 'train' / 'last_checkpoint').read_text().strip())


def val_images(user):
    folder = user / 'data' / 'balloon' / 'val'
    return sorted(str(p) for p in folder.glob('*.jpg'))


def deploy_and_evaluate(deploy_cfg, model_cfg, checkpoint, images, user, work):
    """tools/deploy.py (with two test images and the SDK files), then tools/deploy_test.py and
    tools/test.py on the config's test set: the exported graph and the two metric dicts."""
    tool('deploy.py', deploy_cfg, model_cfg, checkpoint, images[0], '--work-dir', str(work),
         '--test-img', *images[:2], '--dump-info', cwd=user)
    for name in ('end2end.onnx', 'deploy.json', 'pipeline.json', 'detail.json'):
        assert (work / name).is_file(), name
    for backend in ('pytorch', 'onnxruntime'):  # one picture per test image (mmseg's visualiser adds _0.png)
        assert len(list(work.glob(f'output_{backend}_[01]*'))) == 2, sorted(os.listdir(work))
    tool('deploy_test.py', deploy_cfg, model_cfg, '--model', str(work / 'end2end.onnx'),
         '--threads', TOOL_THREADS, '--work-dir', str(work / 'ort_test'), '--out-json', str(work / 'ort.json'),
         cwd=user)
    tool('test.py', model_cfg, checkpoint, '--work-dir', str(work / 'pt_test'), '--out-json',
         str(work / 'pt.json'), cwd=user)
    ort_metrics, pt_metrics = (json.loads((work / f'{n}.json').read_text()) for n in ('ort', 'pt'))
    print('PyTorch', pt_metrics, '\nonnxruntime', ort_metrics)
    return str(work / 'end2end.onnx'), pt_metrics, ort_metrics


def rewritten_and_onnxruntime_outputs(deploy_cfg, model_cfg, onnx_file, checkpoint, images):
    """Per image, the outputs (a list of arrays: detections, labels and masks; class scores; the class
    map) of the PyTorch model as mmdeploy rewrites it for export (its NMS and post-processing, eager)
    and of the exported graph in onnxruntime, on the same input tensor: what the export and the op
    library must reproduce."""
    import onnxruntime
    from mmdeploy.apis import build_task_processor
    from mmdeploy.core import RewriterContext, patch_model
    from mmdeploy.utils import IR, load_config

    from mmlinattn.checkpoint import safe_checkpoint_loading
    from mmlinattn.deploy.onnxruntime import session_options
    deploy, model = load_config(deploy_cfg, model_cfg)
    processor = build_task_processor(model, deploy, 'cpu')
    with safe_checkpoint_loading():
        torch_model = processor.build_pytorch_model(checkpoint)
    patched = patch_model(torch_model, cfg=deploy, backend='onnxruntime', ir=IR.ONNX)
    session = onnxruntime.InferenceSession(onnx_file, session_options(threads=int(TOOL_THREADS)),
                                           providers=['CPUExecutionProvider'])
    pairs = []
    for image in images:
        data, inputs = processor.create_input(image, None, data_preprocessor=torch_model.data_preprocessor)
        with RewriterContext(cfg=deploy, backend='onnxruntime', opset=deploy.onnx_config.opset_version), \
                torch.no_grad():
            expected = patched(inputs, data_samples=data['data_samples'], mode='predict')
        got = session.run(None, {'input': inputs.numpy()})
        expected = [expected] if isinstance(expected, torch.Tensor) else expected
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


def has_laplacian_kernel_node(onnx_file):
    import onnx
    graph = onnx.load(onnx_file, load_external_data=False).graph
    return any(n.domain == 'mmlinattn' and n.op_type == 'LaplacianKernel' for n in graph.node)


def test_deploy_and_evaluate_match_pytorch_on_the_val_photos(tmp_path):
    """One training run for both exports: with the op library, then with standard operators."""
    user = tmp_path / 'user'
    checkpoint = train(user, 'balloon', MODEL_CFG, [f'train_cfg.max_epochs={EPOCHS}',
                                                    f'train_cfg.val_interval={EPOCHS}',
                                                    f'param_scheduler.1.end={EPOCHS}'], max_size=256)
    images = val_images(user)
    onnx_file, pt_metrics, ort_metrics = deploy_and_evaluate(DEPLOY_CFG, MODEL_CFG, checkpoint, images, user,
                                                             tmp_path / 'ort')
    assert has_laplacian_kernel_node(onnx_file)
    for key in ('coco/bbox_mAP', 'coco/segm_mAP'):  # COCO AP, printed to 3 decimals
        assert abs(ort_metrics[key] - pt_metrics[key]) <= 0.002 + 1e-9, key
    assert pt_metrics['coco/bbox_mAP_50'] > 0, 'the checkpoint should have learned something'

    assert_same_outputs(rewritten_and_onnxruntime_outputs(DEPLOY_CFG, MODEL_CFG, onnx_file, checkpoint, images))

    # the standard-operator fallback: no op library, the same outputs
    work = tmp_path / 'standard'
    tool('deploy.py', STANDARD_OPS_CFG, MODEL_CFG, checkpoint, images[0], '--work-dir', str(work),
         cwd=user)
    assert not has_laplacian_kernel_node(str(work / 'end2end.onnx'))
    assert_same_outputs(rewritten_and_onnxruntime_outputs(STANDARD_OPS_CFG, MODEL_CFG, str(work / 'end2end.onnx'),
                                                          checkpoint, images[:4]))


@pytest.mark.parametrize('set_name', sorted(CLASSIFIER_AND_SEGMENTOR))
def test_deployed_classifier_and_segmentor_match_pytorch(tmp_path, set_name):
    """Top-1 (CIFAR-10 test images) and mIoU (CamVid val frames) within 0.1 point of PyTorch's;
    per image, the class scores within 1e-5 (softmax probabilities; 4e-7 measured) and the class
    maps equal but for 0.1% of the pixels (0.03% measured: where two classes' logits nearly tie)."""
    config, deploy_config, options, metric, pattern, learned = CLASSIFIER_AND_SEGMENTOR[set_name]
    model_cfg = os.path.join(ROOT, 'configs', config)
    deploy_cfg = os.path.join(ROOT, 'configs', 'deploy', deploy_config)
    user = tmp_path / 'user'
    checkpoint = train(user, set_name, model_cfg, options)
    images = sorted(str(p) for p in (user / 'data').glob(pattern))
    onnx_file, pt_metrics, ort_metrics = deploy_and_evaluate(deploy_cfg, model_cfg, checkpoint, images, user,
                                                             tmp_path / 'ort')
    assert has_laplacian_kernel_node(onnx_file)
    assert abs(ort_metrics[metric] - pt_metrics[metric]) <= 0.1 + 1e-9, metric
    assert pt_metrics[metric] > learned, 'the checkpoint should have learned something'

    for (expected, ), (got, ) in rewritten_and_onnxruntime_outputs(deploy_cfg, model_cfg, onnx_file, checkpoint,
                                                                   images[::len(images) // 13]):
        assert got.shape == expected.shape
        if set_name == 'cifar10':
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
        else:
            assert (got != expected).mean() <= 1e-3
