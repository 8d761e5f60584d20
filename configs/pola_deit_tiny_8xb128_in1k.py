# Pola-DeiT-Tiny ImageNet-1k classifier (our layout: the official PolaFormer code has no DeiT model;
# see docs/ablations.md): the stride-16 tokens after the final norm, averaged, and a linear head;
# 300 epochs, 8 GPUs x 128 images, drop path 0.1 (DeiT-T's setting).
_base_ = ['./_base_/imagenet_adamw_300e.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.PolaDeiT',
        arch='tiny',
        drop_path_rate=0.1),
    head=dict(in_channels=192))
