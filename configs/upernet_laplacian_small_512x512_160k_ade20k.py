# UperNet with LaplacianFormer-Small, ADE20K 512x512, 160k iterations.
_base_ = ['./_base_/upernet_adamw_160k_ade20k.py']
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
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
