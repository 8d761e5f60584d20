# Baseline: Mask R-CNN + FPN with mmdet's Swin-Tiny (the backbone of its mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py)
# on coco128-seg, from scratch (init_cfg=None: no ImageNet weights here), on a CPU.
_base_ = ['../_base_/mask_rcnn_coco128_cpu.py']
model = dict(
    backbone=dict(_delete_=True, type='mmdet.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                  num_heads=[3, 6, 12, 24], window_size=7, drop_path_rate=0.2, out_indices=(0, 1, 2, 3),
                  init_cfg=None),
    neck=dict(in_channels=[96, 192, 384, 768]))
