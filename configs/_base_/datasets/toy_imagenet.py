# The bundled synthetic ImageNet-layout set (tools/dev/make_toy_data.py -> data/toy/imagenet): 10 classes
# whose labels are ImageNet-1k indices 0-9, so the config's 1000-class head and pipeline apply unchanged.
data_root = 'data/toy/imagenet'
train_dataset = dict(data_root=data_root, split='train', ann_file='meta/train.txt', data_prefix='train')
val_dataset = dict(data_root=data_root, split='val', ann_file='meta/val.txt', data_prefix='val')
test_dataset = val_dataset
