# RetinaNet + FPN, COCO detection, 1x schedule, AdamW lr 1e-4 wd 0.05, 2 images per GPU x 8 GPUs.
# Leaf configs replace `model.backbone` and set `model.neck.in_channels`.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
    './plugin.py',
    './optimizers.py',
]
default_hooks = dict(safe_checkpoint_loading={{_base_.safe_checkpoint_loading_hook}})
train_dataloader = dict(batch_size=2, num_workers=2)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={{_base_.no_decay_keys}}, bias_decay_mult=0.0))
auto_scale_lr = dict(enable=False, base_batch_size=16)
