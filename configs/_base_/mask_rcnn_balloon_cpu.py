# Mask R-CNN on the balloon set (tools/misc/download_dataset.py --dataset-name balloon --max-size 256
# -> data/balloon: 61 train / 13 val photos, one class) on a CPU: the project's Mask R-CNN recipe
# (mask_rcnn_adamw_1x_coco.py: FPN, AdamW, wd 0.05) with one-class heads, 256 px inputs, batch 2,
# lr 5e-4 (gradient norm clipped at 10) with a 50-iteration warm-up and cosine decay, 64 sampled RoIs
# per image, 600/300 RPN proposals in training and 100 at test time, and the plugin's CPU RoIAlign. Leaf
# configs replace `model.backbone` (the default is mmdet's ResNet-50) and set `model.neck.in_channels`.
_base_ = ['./mask_rcnn_adamw_1x_coco.py']
# mmcv's CPU RoIAlign runs on one thread and in fp32 only (a third of a bf16 training step here); the
# plugin's runs on every core and reads bf16. Its module needs mmdet, so `import mmlinattn` leaves it out.
custom_imports = dict(imports=['mmlinattn', 'mmlinattn.models.roi_extractors'], allow_failed_imports=False)
cpu_roi_extractor = dict(type='mmlinattn.SingleRoIExtractor', roi_layer=dict(type='mmlinattn.RoIAlign'))
data_root = 'data/balloon/'
metainfo = dict(classes=('balloon', ), palette=[(220, 20, 60)])
image_scale = (256, 256)
model = dict(
    roi_head=dict(bbox_roi_extractor=cpu_roi_extractor, mask_roi_extractor=cpu_roi_extractor,
                  bbox_head=dict(num_classes=1), mask_head=dict(num_classes=1)),
    train_cfg=dict(rpn_proposal=dict(nms_pre=600, max_per_img=300), rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=100)))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=2, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/'), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json', metric=['bbox', 'segm'])
test_evaluator = val_evaluator
max_epochs = 6
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
# fused AdamW: one pass over every parameter instead of torch's per-tensor loop on the CPU (10x faster
# there; torch >= 2.4), where a small model's optimizer step is a large part of its iteration
optim_wrapper = dict(optimizer=dict(lr=5e-4, fused=True), clip_grad=dict(max_norm=10.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=0, end=max_epochs,
         convert_to_iter_based=True),
]
default_hooks = dict(logger=dict(interval=10),
                     checkpoint=dict(interval=-1, save_last=True, save_optimizer=False))
