# The toolchain check of the foundation: stock mmdet Mask R-CNN with a ResNet-18 backbone (random init),
# iteration-based so a test can run 2 iterations, checkpoint every iteration and resume.
_base_ = ['../../configs/_base_/mask_rcnn_adamw_1x_coco.py']
model = dict(
    backbone=dict(depth=18, init_cfg=None, norm_cfg=dict(type='BN', requires_grad=True)),
    neck=dict(in_channels=[64, 128, 256, 512]))
train_dataloader = dict(batch_size=2, num_workers=0, sampler=dict(type='InfiniteSampler', shuffle=True))
val_dataloader = dict(batch_size=1, num_workers=0)
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=2, val_interval=1000)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=1000)]
default_hooks = dict(
    logger=dict(interval=1),
    checkpoint=dict(type='CheckpointHook', interval=1, by_epoch=False))
log_processor = dict(by_epoch=False)
