# Mask R-CNN + FPN with LaplacianFormer-Tiny, COCO 1x, AdamW.
_base_ = ['./_base_/mask_rcnn_adamw_1x_coco.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.LaplacianFormer',
        arch='tiny',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[64, 128, 320, 512]))
