# Pola-PVT-Tiny classifier on CIFAR-10 (32 px), from scratch, on a CPU.
_base_ = ['../_base_/cifar10_adamw_cpu.py']
model = dict(
    backbone=dict(_delete_=True, type='mmlinattn.PolaPVT', arch='tiny', drop_path_rate=0.0, out_indices=(3, )),
    head=dict(in_channels=512))
