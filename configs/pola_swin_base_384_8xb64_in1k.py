# Pola-Swin-Base at 384^2 ImageNet-1k classifier, as the official `pola_swin_b_384` model: positional
# encodings of the polarity stages on the 384^2 grids (96^2 and 48^2 tokens), window 12 in the window
# stages; the stride-32 output after its norm, averaged, and a linear head. 8 GPUs x 64 images at 384^2
# with the Swin recipe (mmpretrain's Swin-B model settings, its 384^2 data pipeline, AdamW, 300 epochs);
# the official weights convert with `tools/convert_checkpoint.py --arch pola_swin_base`, which reads the
# image and window size from the file.
_base_ = [
    'mmpretrain::_base_/models/swin_transformer/base_224.py',
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_384.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
    './_base_/plugin.py',
    './_base_/optimizers.py',
]
default_hooks = dict(safe_checkpoint_loading={{_base_.safe_checkpoint_loading_hook}})
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.PolaSwin',
        arch='base',
        pretrain_img_size=384,
        window_size=12,
        drop_path_rate=0.5,
        out_indices=(3, )),
    head=dict(in_channels=1024))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={{_base_.no_decay_keys}}))
auto_scale_lr = dict(base_batch_size=1024)
