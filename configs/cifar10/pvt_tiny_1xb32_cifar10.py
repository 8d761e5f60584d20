# Baseline: mmdet's PVT-Tiny (softmax spatial-reduction attention) as a CIFAR-10 classifier, from
# scratch, on a CPU. mmpretrain has no PVT v1; mmdet's returns a list, which TupleOutputs hands to
# mmpretrain's pooling neck as a tuple.
_base_ = ['../_base_/cifar10_adamw_cpu.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmlinattn.TupleOutputs',
        backbone=dict(type='mmdet.PyramidVisionTransformer', num_layers=[2, 2, 2, 2], drop_path_rate=0.0,
                      out_indices=(3, ))),
    head=dict(in_channels=512))
