# Semantic FPN, ADE20K 512x512 crops, 80k iterations, AdamW lr 6e-5 wd 0.01, poly decay after a
# 1500-iter linear warm-up, 2 images per GPU x 8 GPUs. Leaf configs replace `model.backbone` and set
# `model.neck.in_channels`.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
    './plugin.py',
    './optimizers.py',
]
default_hooks = dict(safe_checkpoint_loading={{_base_.safe_checkpoint_loading_hook}})
crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=None,
    decode_head=dict(num_classes=150))
train_dataloader = dict(batch_size=2, num_workers=2)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={{_base_.no_decay_keys}}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=80000, by_epoch=False),
]
