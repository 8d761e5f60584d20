"""Point an mmdet / mmseg / mmpretrain config at the bundled toy data set.

The overlays live in ``configs/_base_/datasets/toy_*.py``: per split a dict of dataset fields
(``train_dataset``, ``val_dataset``, ``test_dataset``), optionally ``evaluator`` fields and
``train_pipeline`` / ``test_pipeline`` and ``num_classes=dict(real=R, toy=T)``. :func:`use_toy_data`
writes them into the innermost dataset of each dataloader (through wrappers such as
``RepeatDataset``) and into the evaluators, and resizes every head with ``num_classes == R`` to T.
"""
import copy
import os.path as osp

from mmengine.config import Config

TOY_OVERLAYS = {
    'mmdet': 'toy_coco_instance.py',
    'mmseg': 'toy_ade20k.py',
    'mmpretrain': 'toy_imagenet.py',
}


def toy_overlay_path(configs_dir: str, default_scope: str) -> str:
    if default_scope not in TOY_OVERLAYS:
        raise ValueError(f'--toy-data supports configs with default_scope in {sorted(TOY_OVERLAYS)}, '
                         f'got {default_scope!r}')
    return osp.join(configs_dir, '_base_', 'datasets', TOY_OVERLAYS[default_scope])


def _innermost_dataset(dataset: dict) -> dict:
    while isinstance(dataset.get('dataset'), dict):
        dataset = dataset['dataset']
    return dataset


def _with_mask(pipeline) -> bool:
    return any(t.get('type') == 'LoadAnnotations' and t.get('with_mask', False) for t in pipeline or [])


def _adapt_pipeline(toy_pipeline, original):
    """The toy pipeline, loading masks only if the original one did (RetinaNet does not)."""
    pipeline = copy.deepcopy(toy_pipeline)
    with_mask = _with_mask(original)
    for transform in pipeline:
        if transform.get('type') == 'LoadAnnotations':
            transform['with_mask'] = with_mask
    return pipeline


def _resize_heads(node, real: int, toy: int) -> None:
    if isinstance(node, dict):
        if node.get('num_classes') == real:
            node['num_classes'] = toy
        for value in node.values():
            _resize_heads(value, real, toy)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _resize_heads(value, real, toy)


def use_toy_data(cfg: Config, configs_dir: str) -> Config:
    """Rewrite ``cfg`` in place so that it trains and evaluates on the toy set; returns ``cfg``."""
    overlay = Config.fromfile(toy_overlay_path(configs_dir, cfg.get('default_scope')))
    for split in ('train', 'val', 'test'):
        loader = cfg.get(f'{split}_dataloader')
        if not loader or f'{split}_dataset' not in overlay:
            continue
        dataset = _innermost_dataset(loader['dataset'])
        dataset.update(copy.deepcopy(overlay[f'{split}_dataset']))
        pipeline_key = 'train_pipeline' if split == 'train' else 'test_pipeline'
        if pipeline_key in overlay:
            dataset['pipeline'] = _adapt_pipeline(overlay[pipeline_key], dataset.get('pipeline'))
    if 'evaluator' in overlay:
        for key in ('val_evaluator', 'test_evaluator'):
            evaluators = cfg.get(key)
            for evaluator in (evaluators if isinstance(evaluators, list) else [evaluators]):
                if isinstance(evaluator, dict) and 'ann_file' in evaluator:
                    evaluator.update(copy.deepcopy(overlay['evaluator']))
    if 'num_classes' in overlay:
        _resize_heads(cfg.model, overlay.num_classes['real'], overlay.num_classes['toy'])
    return cfg
