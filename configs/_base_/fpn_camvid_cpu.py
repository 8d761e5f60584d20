# Semantic FPN on CamVid (tools/misc/download_dataset.py --dataset-name camvid -> data/camvid: mmseg's
# img_dir/ann_dir layout, 11 classes, void = 255) on a CPU: the project's Semantic FPN recipe
# (fpn_adamw_80k_ade20k.py: AdamW) with the 11-class head, the 360x480 frames at scale 0.75-1.5 with
# 256x256 random crops and flips, batch 4, 120 iterations (480 crops, 1.3 epochs of the 367 train
# frames: six backbones x two seeds train and validate in under an hour on 2 cores), lr 5e-4 with a
# 30-iteration warm-up then poly decay, and mIoU on the val frames at 360x480. Leaf configs replace
# `model.backbone` (the default is mmseg's ResNet-50-V1c) and set `model.neck.in_channels`.
_base_ = ['./fpn_adamw_80k_ade20k.py']
data_root = 'data/camvid/'
metainfo = dict(
    classes=('sky', 'building', 'pole', 'road', 'pavement', 'tree', 'sign_symbol', 'fence', 'car',
             'pedestrian', 'bicyclist'),
    palette=[[128, 128, 128], [128, 0, 0], [192, 192, 128], [128, 64, 128], [0, 0, 192], [128, 128, 0],
             [192, 128, 128], [64, 64, 128], [64, 0, 128], [64, 64, 0], [0, 128, 192]])
crop_size = (256, 256)
data_preprocessor = dict(size=crop_size)
model = dict(data_preprocessor=data_preprocessor, decode_head=dict(num_classes=11))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=(480, 360), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(480, 360), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo, img_suffix='.png',
               seg_map_suffix='.png', reduce_zero_label=False)
train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(_delete_=True, **dataset, pipeline=train_pipeline,
                 data_prefix=dict(img_path='img_dir/train', seg_map_path='ann_dir/train')))
val_dataloader = dict(
    batch_size=1, num_workers=1, persistent_workers=True,
    dataset=dict(_delete_=True, **dataset, pipeline=test_pipeline,
                 data_prefix=dict(img_path='img_dir/val', seg_map_path='ann_dir/val')))
test_dataloader = val_dataloader
max_iters = 120
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
optim_wrapper = dict(optimizer=dict(lr=5e-4, fused=True))  # as mask_rcnn_balloon_cpu.py
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=30, end=max_iters, by_epoch=False),
]
default_hooks = dict(logger=dict(interval=10),
                     checkpoint=dict(by_epoch=False, interval=-1, save_last=True, save_optimizer=False))
