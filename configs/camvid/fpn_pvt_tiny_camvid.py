# Baseline: Semantic FPN with mmdet's PVT-Tiny (softmax spatial-reduction attention; mmseg has no
# PVT v1, and its FPN neck takes mmdet's list of stage outputs) on CamVid, from scratch, on a CPU.
_base_ = ['../_base_/fpn_camvid_cpu.py']
model = dict(
    backbone=dict(_delete_=True, type='mmdet.PyramidVisionTransformer', num_layers=[2, 2, 2, 2],
                  drop_path_rate=0.1, out_indices=(0, 1, 2, 3), init_cfg=None),
    neck=dict(in_channels=[64, 128, 320, 512]))
