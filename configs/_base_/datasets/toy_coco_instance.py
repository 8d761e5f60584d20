# The bundled synthetic COCO-format instance set (tools/dev/make_toy_data.py -> data/toy/coco), used by the
# demo and the tests when data/coco is absent. `tools/train.py --toy-data` and `tools/test.py
# --toy-data` put these fields into the config's datasets and evaluators (tools/_toy_overlay.py).
# The toy images are 256-320 px, so they are trained and tested at 256 px instead of 1333x800.
data_root = 'data/toy/coco/'
metainfo = dict(classes=('circle', 'rectangle', 'triangle'))
# Heads sized for COCO's 80 classes predict the toy set's 3 (CocoMetric maps labels to its categories).
num_classes = dict(real=80, toy=3)
train_dataset = dict(
    data_root=data_root,
    ann_file='annotations/instances_train2017.json',
    data_prefix=dict(img='train2017/'),
    metainfo=metainfo)
val_dataset = dict(
    data_root=data_root,
    ann_file='annotations/instances_val2017.json',
    data_prefix=dict(img='val2017/'),
    metainfo=metainfo)
test_dataset = val_dataset
evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
toy_scale = (256, 256)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=toy_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=toy_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
