# Mask R-CNN + FPN with LaplacianFormer-Tiny on balloon, on a CPU.
_base_ = ['../_base_/mask_rcnn_balloon_cpu.py']
model = dict(
    backbone=dict(_delete_=True, type='mmlinattn.LaplacianFormer', arch='tiny', drop_path_rate=0.1,
                  out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[64, 128, 320, 512]))
