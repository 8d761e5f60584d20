# Mask R-CNN + FPN with Pola-Swin-Tiny, COCO 1x, AdamW; drop path 0.2 as Swin-T.
_base_ = ['./_base_/mask_rcnn_adamw_1x_coco.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.PolaSwin',
        arch='tiny',
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[96, 192, 384, 768]))
