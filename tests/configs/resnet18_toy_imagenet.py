# The toolchain check for mmpretrain: a ResNet-18 ImageNet classifier (random init), 2 iterations.
_base_ = ['../../configs/_base_/imagenet_adamw_300e.py']
model = dict(
    backbone=dict(_delete_=True, type='ResNet', depth=18, num_stages=4, out_indices=(3, )),
    head=dict(in_channels=512),
    init_cfg=None)
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True))
test_dataloader = dict(batch_size=8, num_workers=0, persistent_workers=False)
# No validation during the 2 training iterations; tools/test.py evaluates the checkpoint.
val_dataloader = val_cfg = val_evaluator = None
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=2)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=1000)]
default_hooks = dict(
    logger=dict(interval=1),
    checkpoint=dict(type='CheckpointHook', interval=1, by_epoch=False))
log_processor = dict(by_epoch=False)
