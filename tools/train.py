"""Train any mmdet / mmseg / mmpretrain config (the library is the config's ``default_scope``).

    python tools/train.py configs/mask_rcnn_laplacian_tiny_1x_coco.py
    python tools/train.py CONFIG --toy-data --cfg-options train_cfg.max_epochs=2
    python tools/train.py CONFIG --resume                  # the latest checkpoint in the work dir
    python tools/train.py CONFIG --resume work_dirs/x/iter_2.pth
    python tools/train.py CONFIG --resume FILE --unsafe-trust-checkpoint  # FILE may run code: trusted
    python tools/train.py CONFIG --amp                     # bf16 autocast on the CPU, fp16 AMP on CUDA
    bash tools/dist_train.sh CONFIG 8                      # torchrun, --launcher pytorch
"""
import argparse

from _common import (add_common_args, build_runner, check_data_roots, close_distributed,
                     load_config, refused_checkpoint_ends_the_command, use_safe_checkpoint_loading)

MIXED_PRECISION_WRAPPER = 'mmlinattn.MixedPrecisionOptimWrapper'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model from an OpenMMLab config')
    parser.add_argument('config', help='config file')
    parser.add_argument('--resume', nargs='?', const='auto', default=None,
                        help='resume from the given checkpoint, or with no value from the latest '
                        'checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision training and validation (mmlinattn.MixedPrecisionOptimWrapper): '
                        'bf16 autocast on the CPU, fp16 with dynamic loss scaling on CUDA; parameters and '
                        'checkpoints stay fp32')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate by total batch size / auto_scale_lr.base_batch_size')
    add_common_args(parser)
    return parser.parse_args(argv)


def enable_amp(cfg) -> None:
    """--amp: the plugin's MixedPrecisionOptimWrapper in place of mmengine's OptimWrapper or
    AmpOptimWrapper (it is AmpOptimWrapper on a GPU and also runs on the CPU); validation under
    mmengine's autocast too (the wrapper has readied the model's mmcv ops for bf16 by then)."""
    wrapper_type = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if wrapper_type not in ('OptimWrapper', 'AmpOptimWrapper', MIXED_PRECISION_WRAPPER):
        raise SystemExit(f'error: --amp replaces optim_wrapper.type OptimWrapper or AmpOptimWrapper; '
                         f'this config has {wrapper_type!r}')
    cfg.optim_wrapper.type = MIXED_PRECISION_WRAPPER  # its loss_scale defaults to 'dynamic' (CUDA fp16)
    if cfg.get('val_cfg'):
        cfg.val_cfg.fp16 = True


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args)
    if args.amp:
        enable_amp(cfg)
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise SystemExit('error: --auto-scale-lr needs auto_scale_lr.base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    check_data_roots(cfg, ('train', 'val'))
    use_safe_checkpoint_loading(cfg, args.unsafe_trust_checkpoint)
    with refused_checkpoint_ends_the_command():
        runner = build_runner(cfg)
        runner.train()
    close_distributed()


if __name__ == '__main__':
    main()
