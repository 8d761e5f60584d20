# The demo's fine-tuning (tools/dev/run_demo.sh): configs/mask_rcnn_laplacian_tiny_1x_coco.py on the toy
# COCO-format set (run with --toy-data: 256 px, heads for its 3 hue-coded shape classes), its backbone initialised
# from the toy classifier of laplacianformer_tiny_toy_imagenet.py
# (`--cfg-options model.backbone.init_cfg.checkpoint=...`). The model is the 1x config's; only the
# schedule and the sampling are sized for a CPU: batch 2, AdamW lr 1e-3 (gradient norm clipped at 10)
# with a 50-iteration warm-up and cosine decay, 64 sampled RoIs per image (of 512: the mask head runs
# on up to a quarter of them), 600/300 RPN proposals before/after NMS in training (of 2000/1000), 100
# at test time (of 1000) and at most 10 detections per image (a toy image holds at most 6 shapes).
_base_ = ['../mask_rcnn_laplacian_tiny_1x_coco.py']
classifier_checkpoint = 'work_dirs/toy_demo/pretrain/epoch_20.pth'
model = dict(
    backbone=dict(init_cfg=dict(type='Pretrained', checkpoint=classifier_checkpoint, prefix='backbone.')),
    train_cfg=dict(rpn_proposal=dict(nms_pre=600, max_per_img=300), rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=100), rcnn=dict(max_per_img=10)))
train_dataloader = dict(batch_size=2, num_workers=1)
val_dataloader = dict(num_workers=1)
test_dataloader = val_dataloader
optim_wrapper = dict(optimizer=dict(lr=1e-3, fused=True), clip_grad=dict(max_norm=10.0))  # as ../_base_/mask_rcnn_balloon_cpu.py
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    # no `end`: the Runner ends it at train_cfg.max_epochs
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=0, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=4, val_interval=2)
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=-1, save_last=True, save_optimizer=False))
