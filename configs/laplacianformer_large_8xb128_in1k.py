# LaplacianFormer-Large ImageNet-1k classifier: the stride-32 output, global average
# pooling and a linear head; 300 epochs, 8 GPUs x 128 images.
_base_ = ['./_base_/imagenet_adamw_300e.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.LaplacianFormer',
        arch='large',
        drop_path_rate=0.4,
        out_indices=(3, )),
    head=dict(in_channels=512))
