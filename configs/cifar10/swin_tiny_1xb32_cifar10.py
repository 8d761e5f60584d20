# Baseline: mmpretrain's Swin-Tiny (softmax window attention) as a CIFAR-10 classifier, from scratch,
# on a CPU. Its stride-16 and -32 maps (2x2, 1x1) are smaller than the 7x7 window: padded to it, as
# Pola-Swin does.
_base_ = ['../_base_/cifar10_adamw_cpu.py']
model = dict(
    backbone=dict(_delete_=True, type='mmpretrain.SwinTransformer', arch='tiny', img_size=32, drop_path_rate=0.0,
                  pad_small_map=True),
    head=dict(in_channels=768))
