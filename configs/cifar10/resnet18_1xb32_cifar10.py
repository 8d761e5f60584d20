# Baseline: mmpretrain's CIFAR ResNet-18 (3x3 stem, no max-pool: the model of its
# resnet18_8xb16_cifar10.py) under the same AdamW budget, from scratch, on a CPU.
_base_ = ['../_base_/cifar10_adamw_cpu.py']
model = dict(
    backbone=dict(_delete_=True, type='mmpretrain.ResNet_CIFAR', depth=18, num_stages=4,
                  out_indices=(3, ), style='pytorch'),
    head=dict(in_channels=512))
