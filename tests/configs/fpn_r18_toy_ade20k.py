# The toolchain check for mmseg: Semantic FPN with a ResNet-18 (V1c) backbone, random init, 2 iterations.
_base_ = ['../../configs/_base_/fpn_adamw_80k_ade20k.py']
model = dict(
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]))
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False)
test_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False)
# No validation during the 2 training iterations; tools/test.py evaluates the checkpoint.
val_dataloader = val_cfg = val_evaluator = None
train_cfg = dict(type='IterBasedTrainLoop', max_iters=2)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=1000)]
default_hooks = dict(
    logger=dict(interval=1),
    checkpoint=dict(type='CheckpointHook', interval=1, by_epoch=False))
