# UperNet with Pola-Swin-Tiny, ADE20K 512x512, 160k iterations; drop path 0.3 as Swin-T UperNet.
_base_ = ['./_base_/upernet_adamw_160k_ade20k.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.PolaSwin',
        arch='tiny',
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3)),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
