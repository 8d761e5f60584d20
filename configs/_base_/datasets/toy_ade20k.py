# The bundled synthetic ADE20K-layout semantic set (tools/dev/make_toy_data.py -> data/toy/ade), used by the
# demo and the tests when data/ade/ADEChallengeData2016 is absent. Labels follow ADE20K's raw
# convention (0 = ignore, k = class k-1), so the config's own pipeline and 150-class heads apply.
data_root = 'data/toy/ade/ADEChallengeData2016'
train_dataset = dict(
    data_root=data_root,
    data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'))
val_dataset = dict(
    data_root=data_root,
    data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'))
test_dataset = val_dataset
