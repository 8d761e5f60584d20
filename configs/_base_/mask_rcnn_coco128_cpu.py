# Mask R-CNN on coco128-seg (tools/misc/download_dataset.py --dataset-name coco128-seg -> data/coco128:
# the first 128 COCO train2017 images, 929 instances, COCO's 80 categories), trained and validated on
# the same 128 images (the usual sanity check: can the model fit real COCO images at all?), on a CPU:
# the balloon recipe (mask_rcnn_balloon_cpu.py: 256 px, batch 2, lr 5e-4, reduced sampling) with the
# 80-class heads, for 2 epochs (126 iterations: the two images without objects are left out of
# training), so that six backbones x two seeds train and validate in under an hour on 2 cores.
# Leaf configs replace `model.backbone` and set `model.neck.in_channels`.
_base_ = ['./mask_rcnn_balloon_cpu.py']
data_root = 'data/coco128/'
model = dict(roi_head=dict(bbox_head=dict(num_classes=80), mask_head=dict(num_classes=80)))
train_dataloader = dict(
    dataset=dict(data_root=data_root, metainfo=None, ann_file='annotations/instances_train2017.json',
                 data_prefix=dict(img='train2017/')))
val_dataloader = dict(
    dataset=dict(data_root=data_root, metainfo=None, ann_file='annotations/instances_train2017.json',
                 data_prefix=dict(img='train2017/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_train2017.json')
test_evaluator = val_evaluator
max_epochs = 2
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=0, end=max_epochs,
         convert_to_iter_based=True),
]
