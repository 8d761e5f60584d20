# Mask R-CNN + FPN with LaplacianFormer-Small, COCO 1x, AdamW (DESIGN.md §7).
_base_ = ['./_base_/mask_rcnn_adamw_1x_coco.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.LaplacianFormer',
        arch='small',
        drop_path_rate=0.2,
        # At most 7x7 landmarks per head (the 224^2 grid): linear cost at detection/segmentation
        # resolutions, identical to the ImageNet model at 224^2 (see README, LaplacianFormer).
        max_landmark_grid=7,
        out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[64, 128, 320, 512]))
