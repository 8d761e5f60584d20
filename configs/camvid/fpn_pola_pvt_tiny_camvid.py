# Semantic FPN with Pola-PVT-Tiny on CamVid, on a CPU.
_base_ = ['../_base_/fpn_camvid_cpu.py']
model = dict(
    backbone=dict(_delete_=True, type='mmlinattn.PolaPVT', arch='tiny', drop_path_rate=0.1,
                  out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[64, 128, 320, 512]))
