# CIFAR-10 classification on a CPU, drop path off in every leaf (a short budget needs no regularisation) (tools/misc/download_dataset.py --dataset-name cifar10 -> data/cifar10):
# the project's ImageNet recipe (AdamW, wd 0.05, no decay on norms/biases/position embeddings, gradient
# clipping, label smoothing) with CIFAR's 32 px images, random crop with 4 px padding + flip, no Mixup/
# CutMix/RandAugment, batch 32 and a 300-iteration budget (linear warm-up then cosine decay), evaluated
# at the end on 2000 test images (200 per class: the tool writes meta/test.txt class-interleaved).
# Leaf configs replace `model.backbone` and set `model.head.in_channels`; the stride-32 map is 1x1.
_base_ = ['./imagenet_adamw_300e.py']
data_root = 'data/cifar10'
data_preprocessor = dict(num_classes=10, mean=[125.307, 122.961, 113.8575], std=[51.5865, 50.847, 51.255],
                         to_rgb=True)
model = dict(head=dict(num_classes=10), train_cfg=None)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomCrop', crop_size=32, padding=4),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size=32, num_workers=1, persistent_workers=True,
    dataset=dict(_delete_=True, type='CustomDataset', data_root=data_root, ann_file='meta/train.txt',
                 data_prefix='train', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=100, num_workers=1, persistent_workers=True,
    dataset=dict(_delete_=True, type='CustomDataset', data_root=data_root, ann_file='meta/test.txt',
                 data_prefix='test', pipeline=test_pipeline, indices=2000))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_evaluator = val_evaluator
optim_wrapper = dict(optimizer=dict(fused=True))  # as mask_rcnn_balloon_cpu.py
max_iters = 300
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=40),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=40, end=max_iters),
]
default_hooks = dict(logger=dict(interval=20),
                     checkpoint=dict(by_epoch=False, interval=-1, save_last=True, save_optimizer=False))
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False, base_batch_size=32)
