"""The config walk: every config under configs/ (subfolders too, not _base_/) builds through its
library's registry and runs one loss step (with backward) and one predict step on a small synthetic
batch, made the way the library's data preprocessor expects it (images of 80-128 px at odd sizes
instead of 800x1333 or 512^2). The real sets' configs (configs/<set>/: the top-level configs'
models with the task's heads, and the libraries' backbones) are not walked: test_real_set_configs.py
builds them. The model is the config's own, heads and class counts included; only
sampling and test-time sizes of the detectors are reduced (see ``_build``) and a Pretrained
backbone init, whose file does not exist here, is replaced by the default one. A new config is
walked without being listed here (the slow tier walks every config; the fast one a config per
backbone family and head, ``FAST_WALK``).

Per config (built once, by the module-scoped ``walk`` fixture), the tests assert what a training
run relies on: every loss finite; every trainable parameter of the backbone and the neck gets a
finite gradient (an unused one also stops DistributedDataParallel; parameters a config freezes are
not trainable, and no config leaves one unused by design, so there is no exception list); the
backbone's outputs have the channels the neck or heads are built for, at power-of-two strides
(4/8/16/32 by stage for detection and segmentation); the neck's levels have the strides the heads'
anchors and RoI extractors assume; the predictions have the task's shapes.
"""
import importlib
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import pytest
import torch

from e2e_utils import ROOT, load_config, model_configs, real_set_of

CONFIGS_DIR = os.path.join(ROOT, 'configs')
CONFIGS = model_configs()
SCOPES = ('mmdet', 'mmseg', 'mmpretrain')
# (C, H, W) of the two training images and of the predicted one: odd sizes, padded by the libraries'
# data preprocessors (mmdet to a multiple of 32, mmseg to the crop size set below).
TRAIN_SHAPES = {'mmdet': [(3, 112, 128), (3, 128, 96)], 'mmseg': [(3, 120, 128), (3, 128, 100)],
                'mmpretrain': [(3, 96, 96), (3, 96, 96)]}
PREDICT_SHAPE = {'mmdet': (3, 100, 120), 'mmseg': (3, 100, 120), 'mmpretrain': (3, 80, 112)}
SEG_CROP = (128, 128)


def _config_id(path):
    return os.path.relpath(path, CONFIGS_DIR)[:-3]


def _load(path):
    return load_config(path)


def test_configs_exist():
    assert CONFIGS, 'configs/ holds no config'


@pytest.mark.parametrize('path', CONFIGS, ids=_config_id)
def test_config_declares_plugin_and_backbone(path):
    cfg = _load(path)
    assert cfg.default_scope in SCOPES
    assert 'mmlinattn' in cfg.custom_imports['imports']
    assert cfg.custom_imports.get('allow_failed_imports') is False
    if real_set_of(path) is None:  # the real sets compare the plugin's backbones with the libraries'
        assert cfg.model.backbone.type.startswith('mmlinattn.'), cfg.model.backbone.type
    # the stock tools load this config's checkpoints through the plugin's safe loader
    assert cfg.default_hooks.safe_checkpoint_loading == dict(type='mmlinattn.SafeCheckpointLoadingHook')


# ---------------------------------------------------------------- synthetic batches


def _det_batch(shapes, num_classes, with_mask):
    from mmdet.testing import demo_mm_inputs
    data = demo_mm_inputs(len(shapes), list(shapes), num_items=[3] * len(shapes),
                          num_classes=num_classes, with_mask=with_mask)
    for sample in data['data_samples']:
        sample.set_metainfo(dict(scale_factor=(1.0, 1.0)))  # as if the pipeline had not resized
    return data


def _seg_batch(shapes, num_classes, gen):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    inputs, samples = [], []
    for c, h, w in shapes:
        inputs.append(torch.randint(0, 256, (c, h, w), dtype=torch.uint8, generator=gen))
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, h, w), generator=gen))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _cls_batch(shapes, num_classes, gen):
    from mmpretrain.structures import DataSample
    inputs = [torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen) for shape in shapes]
    labels = torch.randint(0, num_classes, (len(shapes), ), generator=gen).tolist()
    return dict(inputs=inputs, data_samples=[DataSample().set_gt_label(label) for label in labels])


def _num_classes(scope, model):
    if scope == 'mmdet':
        return model.roi_head.bbox_head.num_classes if hasattr(model, 'roi_head') \
            else model.bbox_head.num_classes
    if scope == 'mmseg':
        return model.decode_head.num_classes
    return model.head.num_classes


def _batch(scope, model, shapes, gen):
    num_classes = _num_classes(scope, model)
    if scope == 'mmdet':
        return _det_batch(shapes, num_classes, with_mask=getattr(model, 'with_mask', False))
    if scope == 'mmseg':
        return _seg_batch(shapes, num_classes, gen)
    return _cls_batch(shapes, num_classes, gen)


# ---------------------------------------------------------------- the walk, once per config


@dataclass
class Walk:
    scope: str
    model: Any
    step: str = ''
    inputs: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # step -> padded batch H, W
    shapes: Dict[Tuple[str, str], List[tuple]] = field(default_factory=dict)  # (step, part) -> outputs
    losses: Dict[str, float] = field(default_factory=dict)
    trainable: int = 0
    no_finite_grad: List[str] = field(default_factory=list)
    predictions: list = field(default_factory=list)


def _build(cfg):
    from mmengine.model.utils import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    importlib.import_module('mmlinattn')
    registry = importlib.import_module(f'{cfg.default_scope}.registry')
    if 'data_preprocessor' in cfg and 'data_preprocessor' not in cfg.model:
        cfg.model.data_preprocessor = cfg.data_preprocessor  # mmpretrain keeps it at the top level
    if cfg.default_scope == 'mmseg':
        cfg.model.data_preprocessor.size = SEG_CROP  # pad to a small crop instead of 512^2
    if cfg.default_scope == 'mmdet':
        # Sampling and test-time sizes only (the model is the config's): no score threshold, so a
        # random model still predicts boxes and masks; 64 sampled RoIs and 10 detections instead of
        # 512 and 100, which would make the mask head (4 convs on each positive RoI) the walk's cost.
        if 'rcnn' in cfg.model.train_cfg:
            cfg.model.train_cfg.rcnn.sampler.num = 64
            cfg.model.test_cfg.rpn.max_per_img = 100
        test_cfg = cfg.model.test_cfg.get('rcnn', cfg.model.test_cfg)
        test_cfg.update(score_thr=0.0, max_per_img=10)
    if (cfg.model.backbone.get('init_cfg') or {}).get('type') == 'Pretrained':
        cfg.model.backbone.init_cfg = None  # no weights here; loading is test_backbones_base's
    model = revert_sync_batchnorm(registry.MODELS.build(cfg.model))
    model.init_weights()
    return model


def _record_shapes(walk, model, part):
    def hook(_, __, outputs):
        walk.shapes[walk.step, part] = [tuple(t.shape) for t in outputs]
    return getattr(model, part).register_forward_hook(hook)


def run_walk(cfg) -> Walk:
    """Build ``cfg``'s model, run one loss step with backward and one predict step; record them."""
    scope = cfg.default_scope
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = _build(cfg)
    walk = Walk(scope, model)
    hooks = [_record_shapes(walk, model, part) for part in ('backbone', 'neck')
             if getattr(model, part, None) is not None]

    walk.step = 'train'
    model.train()
    data = model.data_preprocessor(_batch(scope, model, TRAIN_SHAPES[scope], gen), training=True)
    walk.inputs['train'] = tuple(data['inputs'].shape[-2:])
    loss, log_vars = model.parse_losses(model(**data, mode='loss'))  # what the training loop sums
    loss.backward()
    walk.losses = {name: float(value.detach()) for name, value in log_vars.items()}
    trained = [(f'{part}.{name}', p) for part in ('backbone', 'neck') if hasattr(model, part)
               for name, p in getattr(model, part).named_parameters() if p.requires_grad]
    walk.trainable = len(trained)
    walk.no_finite_grad = [name for name, p in trained
                           if p.grad is None or not torch.isfinite(p.grad).all()]
    model.zero_grad(set_to_none=True)

    walk.step = 'predict'
    model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(_batch(scope, model, [PREDICT_SHAPE[scope]], gen), False)
        walk.inputs['predict'] = tuple(data['inputs'].shape[-2:])
        walk.predictions = model(**data, mode='predict')
    for hook in hooks:
        hook.remove()
    return walk


# The fast tier walks one config per backbone family and per head (the smallest variants); the slow
# tier walks every config. A config's tests share its walk (a module fixture), so they share a
# pytest-xdist worker too.
FAST_WALK = ('mask_rcnn_laplacian_tiny_1x_coco', 'retinanet_pola_pvt_tiny_1x_coco',
             'upernet_pola_swin_tiny_512x512_160k_ade20k', 'fpn_pola_pvt_tiny_512x512_80k_ade20k',
             'laplacianformer_tiny_8xb128_in1k', 'pola_deit_tiny_8xb128_in1k',
             'pola_swin_tiny_8xb128_in1k', 'pola_pvt_tiny_8xb128_in1k')
WALKS = [pytest.param(path, id=_config_id(path),
                      marks=(pytest.mark.xdist_group(_config_id(path)),
                             *(() if _config_id(path) in FAST_WALK else (pytest.mark.slow, ))))
         for path in CONFIGS if real_set_of(path) is None]


@pytest.fixture(scope='module', params=WALKS)
def walk(request):
    return run_walk(_load(request.param))


def test_losses_are_finite(walk):
    assert any('loss' in k for k in walk.losses), walk.losses
    for name, value in walk.losses.items():
        assert math.isfinite(value), f'{name} = {value}'


def test_every_trainable_backbone_and_neck_parameter_gets_a_finite_gradient(walk):
    assert walk.trainable > 0
    assert not walk.no_finite_grad, (f'{len(walk.no_finite_grad)} of {walk.trainable} trainable '
                                     f'parameters got no finite gradient: {walk.no_finite_grad}')


def test_the_gradient_check_names_a_parameter_the_loss_does_not_reach():
    """The check can fail: a stride-4 output that RetinaNet's FPN (start_level=1) never reads."""
    cfg = _load(os.path.join(ROOT, 'configs', 'retinanet_laplacian_tiny_1x_coco.py'))
    cfg.model.backbone.out_indices = (0, 1, 2, 3)
    cfg.model.neck.update(in_channels=[64, 128, 320, 512], start_level=1)
    assert run_walk(cfg).no_finite_grad == ['backbone.norm0.weight', 'backbone.norm0.bias']


def _expected_sizes(height, width, strides):
    return [(math.ceil(height / s), math.ceil(width / s)) for s in strides]


def _level_strides(model):
    """The strides the heads assume for the neck's levels (mmdet anchors and RoI extractor, mmseg
    Semantic FPN's head); None for UperNet (no neck) and classifiers (the neck pools)."""
    if hasattr(model, 'rpn_head'):  # two-stage: RPN anchors on every level, RoIs on the first four
        strides = [s[0] for s in model.rpn_head.prior_generator.strides]
        roi = model.roi_head.bbox_roi_extractor.featmap_strides
        assert list(roi) == strides[:len(roi)], (roi, strides)
        return strides
    if hasattr(model, 'bbox_head'):
        return [s[0] for s in model.bbox_head.prior_generator.strides]
    if getattr(model, 'neck', None) is not None and hasattr(model, 'decode_head'):
        return list(model.decode_head.feature_strides)
    return None


def _stride(height, width, size):
    """The power-of-two stride s with ``size == (ceil(H / s), ceil(W / s))``, None if there is none."""
    matches = [2**k for k in range(7) if (math.ceil(height / 2**k), math.ceil(width / 2**k)) == size]
    return matches[0] if matches else None


@pytest.mark.parametrize('step', ['train', 'predict'])
def test_feature_maps_have_the_channels_and_strides_the_heads_expect(walk, step):
    """Backbone outputs at power-of-two strides of the padded batch (ceil at odd sizes), rising
    from one output to the next, 4 * 2^i for stage i of a detector's or segmentor's pyramid, with
    the channels the neck (or UperNet's heads, or the classifier head) is built for; the neck's
    levels at the strides of the heads' anchors / RoI extractor / FPN head."""
    model, (height, width) = walk.model, walk.inputs[step]
    shapes = walk.shapes[step, 'backbone']
    batch = len(TRAIN_SHAPES[walk.scope]) if step == 'train' else 1
    assert [shape[0] for shape in shapes] == [batch] * len(shapes)
    strides = [_stride(height, width, shape[2:]) for shape in shapes]
    assert None not in strides and strides == sorted(set(strides)), (shapes, (height, width))
    if walk.scope != 'mmpretrain':
        assert strides == [4 * 2**i for i in model.backbone.out_indices], strides
    channels = [shape[1] for shape in shapes]
    if walk.scope == 'mmpretrain':
        assert model.head.in_channels == channels[-1]
    elif getattr(model, 'neck', None) is not None:
        assert list(model.neck.in_channels) == channels
    else:  # mmseg UperNet: the heads read the backbone's outputs by in_index
        for head in filter(None, (model.decode_head, getattr(model, 'auxiliary_head', None))):
            index = head.in_index
            wanted = [channels[i] for i in index] if isinstance(index, (list, tuple)) else channels[index]
            assert head.in_channels == wanted, type(head).__name__
    level_strides = _level_strides(model)
    if level_strides is not None:
        sizes = [shape[-2:] for shape in walk.shapes[step, 'neck']]
        assert sizes == _expected_sizes(height, width, level_strides), level_strides


def test_predictions_have_the_task_shapes(walk):
    assert len(walk.predictions) == 1
    pred = walk.predictions[0]
    height, width = PREDICT_SHAPE[walk.scope][1:]
    num_classes = _num_classes(walk.scope, walk.model)
    if walk.scope == 'mmdet':
        instances = pred.pred_instances
        count = len(instances)
        assert count > 0, 'no detections without a score threshold'
        assert instances.bboxes.shape == (count, 4) and instances.scores.shape == (count, )
        assert torch.isfinite(instances.bboxes).all() and torch.isfinite(instances.scores).all()
        assert ((instances.labels >= 0) & (instances.labels < num_classes)).all()
        if walk.model.with_mask:
            assert instances.masks.shape == (count, height, width)
    elif walk.scope == 'mmseg':
        assert pred.pred_sem_seg.data.shape == (1, height, width)
        assert pred.seg_logits.data.shape == (num_classes, height, width)
        labels = pred.pred_sem_seg.data
        assert ((labels >= 0) & (labels < num_classes)).all()
    else:
        assert pred.pred_score.shape == (num_classes, )
        assert math.isclose(float(pred.pred_score.sum()), 1.0, rel_tol=1e-4)
        assert 0 <= int(pred.pred_label) < num_classes
