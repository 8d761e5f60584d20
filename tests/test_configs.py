"""Every config in configs/ loads, names an mmlinattn backbone with the plugin import, builds through
its library's registry, and runs one loss step (with backward) and one predict step on the toy data."""
import glob
import importlib
import math
import os

import pytest
import torch

from e2e_utils import ROOT, require_toy_data

CONFIGS = sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py')))
TOY_SET = {'mmdet': 'coco', 'mmseg': 'ade', 'mmpretrain': 'imagenet'}


def _config_id(path):
    return os.path.basename(path)[:-3]


def test_configs_exist():
    assert CONFIGS, 'configs/ holds no config'


def _load(path):
    from mmengine.config import Config
    return Config.fromfile(path)


@pytest.mark.parametrize('path', CONFIGS, ids=_config_id)
def test_config_declares_plugin_and_backbone(path):
    cfg = _load(path)
    assert cfg.default_scope in TOY_SET
    assert 'mmlinattn' in cfg.custom_imports['imports']
    assert cfg.custom_imports.get('allow_failed_imports') is False
    assert cfg.model.backbone.type.startswith('mmlinattn.'), cfg.model.backbone.type


def _one_batch(dataset, indices):
    from mmengine.dataset import pseudo_collate
    return pseudo_collate([dataset[i] for i in indices])


def _finite_loss_total(losses):
    total = 0
    for name, value in losses.items():
        if 'loss' not in name:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            assert torch.isfinite(v).all(), f'{name} is not finite: {v}'
            total = total + v.sum()
    return total


@pytest.mark.parametrize('path', CONFIGS, ids=_config_id)
def test_config_builds_and_runs_loss_and_predict(path):
    from mmengine.model.utils import revert_sync_batchnorm
    from mmengine.registry import init_default_scope

    from toy_data import use_toy_data

    cfg = _load(path)
    require_toy_data(TOY_SET[cfg.default_scope])
    use_toy_data(cfg, os.path.join(ROOT, 'configs'))
    init_default_scope(cfg.default_scope)
    importlib.import_module('mmlinattn')
    registry = importlib.import_module(f'{cfg.default_scope}.registry')
    if 'data_preprocessor' in cfg and 'data_preprocessor' not in cfg.model:
        cfg.model.data_preprocessor = cfg.data_preprocessor  # mmpretrain keeps it at the top level
    torch.manual_seed(0)
    model = revert_sync_batchnorm(registry.MODELS.build(cfg.model))
    model.init_weights()

    train_set = registry.DATASETS.build(cfg.train_dataloader.dataset)
    model.train()
    data = model.data_preprocessor(_one_batch(train_set, [0, 1]), training=True)
    losses = model(**data, mode='loss')
    total = _finite_loss_total(losses)
    total.backward()
    backbone_grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in backbone_grads), 'no gradient reached the backbone'

    test_set = registry.DATASETS.build(cfg.test_dataloader.dataset)
    model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(_one_batch(test_set, [0]), training=False)
        predictions = model(**data, mode='predict')
    assert len(predictions) == 1
    pred = predictions[0]
    if cfg.default_scope == 'mmdet':
        assert pred.pred_instances.bboxes.shape[-1] == 4
        assert torch.isfinite(pred.pred_instances.scores).all()
    elif cfg.default_scope == 'mmseg':
        assert pred.pred_sem_seg.data.shape[-2:] == pred.gt_sem_seg.data.shape[-2:]
    else:
        assert pred.pred_score.shape == (cfg.model.head.num_classes, )
        assert math.isclose(float(pred.pred_score.sum()), 1.0, rel_tol=1e-4)
