# Baseline: Mask R-CNN + FPN with mmdet's ResNet-50 on coco128-seg, from scratch (no ImageNet weights here,
# so no frozen stem and BN statistics that train), on a CPU.
_base_ = ['../_base_/mask_rcnn_coco128_cpu.py']
model = dict(backbone=dict(frozen_stages=-1, norm_eval=False, init_cfg=None))
