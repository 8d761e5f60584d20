# Baseline: Mask R-CNN + FPN with mmdet's PVT-Tiny (softmax spatial-reduction attention) on coco128-seg,
# from scratch (init_cfg=None: no ImageNet weights here), on a CPU.
_base_ = ['../_base_/mask_rcnn_coco128_cpu.py']
model = dict(
    backbone=dict(_delete_=True, type='mmdet.PyramidVisionTransformer', num_layers=[2, 2, 2, 2],
                  drop_path_rate=0.1, out_indices=(0, 1, 2, 3), init_cfg=None),
    neck=dict(in_channels=[64, 128, 320, 512]))
