"""The real sets' configs (configs/<set>/): each task holds the learning benchmark's six backbones
(the plugin's three, the libraries' PVT-T, Swin-T and ResNet), every config builds through its
library's registry with the task's class count, its backbone's outputs have the channels the neck
or head is built for, and its datasets read the layout tools/misc/download_dataset.py writes."""
import os

import pytest
import torch

from dev.benchmarks.learning import TASKS
from e2e_utils import REAL_SETS, ROOT, load_config, model_configs, real_set_of

REAL_CONFIGS = [path for path in model_configs() if real_set_of(path)]
NUM_CLASSES = {'balloon': 1, 'coco128': 80, 'camvid': 11, 'cifar10': 10}
# what the configs read, relative to the set's folder (the tool's layout, docs/datasets.md)
LAYOUT = {'balloon': {'annotations/instances_train.json', 'annotations/instances_val.json', 'train/', 'val/'},
          'coco128': {'annotations/instances_train2017.json', 'train2017/'},
          'camvid': {'img_dir/train', 'ann_dir/train', 'img_dir/val', 'ann_dir/val'},
          'cifar10': {'meta/train.txt', 'train', 'meta/test.txt', 'test'}}


def _id(path):
    return os.path.relpath(path, os.path.join(ROOT, 'configs'))[:-3]


def test_every_task_of_the_benchmark_has_its_six_backbones():
    for name in REAL_SETS:
        configs = [os.path.join(ROOT, spec) for spec in TASKS[name]['runs'].values() if isinstance(spec, str)]
        assert len(configs) == 6, name
        assert set(configs) == {p for p in REAL_CONFIGS if real_set_of(p) == name}, name


def test_the_cifar10_table_holds_one_ablation_row_per_switch():
    runs = TASKS['cifar10']['runs']
    options = [spec[1] for spec in runs.values() if not isinstance(spec, str)]
    assert sorted(options) == ['model.backbone.attn_cfg.inverse=exact', 'model.backbone.attn_cfg.kernel=gaussian',
                               'model.backbone.attn_cfg.polarity=same']
    for spec in runs.values():
        assert os.path.isfile(os.path.join(ROOT, spec if isinstance(spec, str) else spec[0]))


def _dataset_paths(dataset):
    prefix = dataset.get('data_prefix', '')
    prefixes = prefix.values() if isinstance(prefix, dict) else [prefix]
    return {dataset.get('ann_file', ''), *prefixes} - {''}


@pytest.mark.parametrize('path', REAL_CONFIGS, ids=_id)
def test_real_set_config_builds_with_the_task_heads_and_channels(path):
    """Registry build (no weights: every start is random), class count, the fused AdamW, and one
    backbone forward at a small odd size whose channels are those of the neck (or the classifier head)."""
    import importlib

    from mmengine.registry import init_default_scope
    cfg = load_config(path)
    name = real_set_of(path)
    assert 'mmlinattn' in cfg.custom_imports['imports']
    assert cfg.default_hooks.safe_checkpoint_loading == dict(type='mmlinattn.SafeCheckpointLoadingHook')
    for loader in ('train_dataloader', 'val_dataloader'):
        dataset = cfg[loader].dataset
        assert dataset.data_root.rstrip('/') == f'data/{name}', (loader, dataset.data_root)
        assert _dataset_paths(dataset) <= LAYOUT[name], (loader, _dataset_paths(dataset))
    init_default_scope(cfg.default_scope)
    for module in cfg.custom_imports['imports']:  # as the Runner does
        importlib.import_module(module)
    registry = importlib.import_module(f'{cfg.default_scope}.registry')
    torch.manual_seed(0)
    model = registry.MODELS.build(cfg.model)
    model.init_weights()
    model.eval()
    if cfg.default_scope == 'mmdet':
        heads = (model.roi_head.bbox_head, model.roi_head.mask_head)
        assert [head.num_classes for head in heads] == [NUM_CLASSES[name]] * 2
        extractors = (model.roi_head.bbox_roi_extractor, model.roi_head.mask_roi_extractor)
        assert {type(layer).__qualname__ for e in extractors for layer in e.roi_layers} == {'RoIAlign'}
        assert {type(layer).__module__ for e in extractors for layer in e.roi_layers} == {
            'mmlinattn.models.roi_extractors'}, 'a CPU recipe runs the plugin\'s RoIAlign'
    elif cfg.default_scope == 'mmseg':
        assert model.decode_head.num_classes == NUM_CLASSES[name]
    else:
        assert model.head.num_classes == NUM_CLASSES[name]
    from mmengine.optim import build_optim_wrapper
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    assert type(optimizer).__name__ == 'AdamW' and optimizer.defaults['fused'], \
        'a CPU recipe steps AdamW fused (docs/tools.md)'
    size = (40, 36) if cfg.default_scope == 'mmpretrain' else (100, 92)
    with torch.no_grad():
        outputs = model.backbone(torch.randn(1, 3, *size))
    channels = [out.shape[1] for out in outputs]
    if cfg.default_scope == 'mmpretrain':
        assert isinstance(outputs, tuple) and channels[-1] == model.head.in_channels
    else:
        assert channels == list(model.neck.in_channels)
