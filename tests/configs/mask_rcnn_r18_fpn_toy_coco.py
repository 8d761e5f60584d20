# The toolchain check of the foundation: stock mmdet Mask R-CNN with a ResNet-18 backbone (random init),
# iteration-based so a test can run 2 iterations, checkpoint every iteration and resume.
_base_ = ['../../configs/_base_/mask_rcnn_adamw_1x_coco.py']
model = dict(
    backbone=dict(depth=18, init_cfg=None, norm_cfg=dict(type='BN', requires_grad=True)),
    neck=dict(in_channels=[64, 128, 256, 512]),
    # Few proposals and no score threshold: an untrained model still yields detections to evaluate.
    test_cfg=dict(rpn=dict(nms_pre=200, max_per_img=100), rcnn=dict(score_thr=0.0, max_per_img=20)))
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True))
test_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False)
# No validation during the 2 training iterations; tools/test.py evaluates the checkpoint.
val_dataloader = val_cfg = val_evaluator = None
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=2)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=1000)]
default_hooks = dict(
    logger=dict(interval=1),
    checkpoint=dict(type='CheckpointHook', interval=1, by_epoch=False))
log_processor = dict(by_epoch=False)
