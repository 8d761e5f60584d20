# UperNet with LaplacianFormer-Small, ADE20K 512x512, 160k iterations.
_base_ = ['./_base_/upernet_adamw_160k_ade20k.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.LaplacianFormer',
        arch='small',
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3)),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
