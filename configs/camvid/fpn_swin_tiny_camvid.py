# Baseline: Semantic FPN with mmseg's Swin-Tiny (softmax window attention) on CamVid, from scratch,
# on a CPU.
_base_ = ['../_base_/fpn_camvid_cpu.py']
model = dict(
    backbone=dict(_delete_=True, type='mmseg.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                  num_heads=[3, 6, 12, 24], window_size=7, drop_path_rate=0.2, out_indices=(0, 1, 2, 3),
                  init_cfg=None),
    neck=dict(in_channels=[96, 192, 384, 768]))
