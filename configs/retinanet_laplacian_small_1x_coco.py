# RetinaNet + FPN with LaplacianFormer-Small, COCO 1x. The FPN starts at stride 8, so the
# backbone returns stages 1-3 only (no unused stride-4 norm under DDP).
_base_ = ['./_base_/retinanet_adamw_1x_coco.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.LaplacianFormer',
        arch='small',
        drop_path_rate=0.2,
        out_indices=(1, 2, 3)),
    neck=dict(in_channels=[128, 320, 512], start_level=0, num_outs=5))
