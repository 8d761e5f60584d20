# Baseline: Semantic FPN with mmseg's ResNet-50-V1c (the backbone of its fpn_r50 configs) on CamVid,
# from scratch (no ImageNet weights here), on a CPU.
_base_ = ['../_base_/fpn_camvid_cpu.py']
