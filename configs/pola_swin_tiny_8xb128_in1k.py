# Pola-Swin-Tiny ImageNet-1k classifier, as the official one: the stride-32 output after its norm,
# averaged, and a linear head; 300 epochs, 8 GPUs x 128 images, drop path 0.2 (Swin's setting).
_base_ = ['./_base_/imagenet_adamw_300e.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.PolaSwin',
        arch='tiny',
        drop_path_rate=0.2,
        out_indices=(3, )),
    head=dict(in_channels=768))
