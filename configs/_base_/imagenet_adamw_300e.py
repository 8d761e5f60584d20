# ImageNet-1k classification, 300 epochs, 8 GPUs x 128 images, AdamW (lr 1e-3 for batch 1024, wd 0.05),
# cosine decay with warm-up, RandAugment + Mixup/CutMix + label smoothing (the Swin/PVT recipe from
# mmpretrain). Leaf configs replace `model.backbone` and set `model.head.in_channels`.
_base_ = [
    'mmpretrain::_base_/models/swin_transformer/tiny_224.py',
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
    './plugin.py',
    './optimizers.py',
]
default_hooks = dict(safe_checkpoint_loading={{_base_.safe_checkpoint_loading_hook}})
train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={{_base_.no_decay_keys}}))
auto_scale_lr = dict(base_batch_size=1024)
