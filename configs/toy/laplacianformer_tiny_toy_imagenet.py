# The demo's pretraining (tools/dev/run_demo.sh): LaplacianFormer-Tiny as an ImageNet classifier on the
# toy ImageNet-layout set (run with --toy-data; 10 classes, 300 training images). The classifier
# config's model, optimiser and evaluator with a CPU-sized recipe: a 10-class head (the set's labels
# are ImageNet-1k classes 0-9), 64 px inputs, batch 32, AdamW lr 5e-4 with a 20-iteration warm-up
# then cosine decay, 200 iterations; no Mixup/CutMix/RandAugment or stochastic depth (a few hundred
# images need no regularisation).
_base_ = ['../laplacianformer_tiny_8xb128_in1k.py']
image_size = 64
model = dict(backbone=dict(drop_path_rate=0.0), head=dict(num_classes=10), train_cfg=None)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size)),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size)),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=32, num_workers=1, persistent_workers=True,
                        dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=100, num_workers=1, persistent_workers=True,
                      dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
optim_wrapper = dict(optimizer=dict(lr=5e-4, fused=True))  # as ../_base_/mask_rcnn_balloon_cpu.py
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    # no `end`: the Runner ends it at train_cfg.max_epochs
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=0, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=20, val_interval=4)
default_hooks = dict(logger=dict(interval=5), checkpoint=dict(interval=-1, save_last=True, save_optimizer=False))
