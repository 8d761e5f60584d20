"""Evaluate a checkpoint with any mmdet / mmseg / mmpretrain config and print its metrics.

    python tools/test.py configs/mask_rcnn_laplacian_tiny_1x_coco.py work_dirs/x/epoch_12.pth
    python tools/test.py CONFIG CHECKPOINT --toy-data --out-json metrics.json
    python tools/test.py CONFIG CHECKPOINT --show-dir predictions   # mmdet: draw every test image
    python tools/test.py CONFIG CHECKPOINT --amp            # bf16 autocast on the CPU, fp16 on CUDA
    bash tools/dist_test.sh CONFIG CHECKPOINT 8
"""
import argparse
import json
import os.path as osp

from _common import (add_common_args, build_runner, check_data_roots, close_distributed,
                     load_config, refused_checkpoint_ends_the_command, use_safe_checkpoint_loading)

MIXED_PRECISION_TEST_LOOP = 'mmlinattn.MixedPrecisionTestLoop'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test a checkpoint of an OpenMMLab config')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out-json', help='also write the metrics to this JSON file')
    parser.add_argument('--amp', action='store_true',
                        help='test in mixed precision (mmlinattn.MixedPrecisionTestLoop: mmengine\'s '
                        'TestLoop with fp16=True): bf16 autocast on the CPU, fp16 on CUDA')
    parser.add_argument('--show-dir', help="mmdet configs: draw each test image's ground truth and "
                        "predictions (boxes, masks) with mmdet's visualiser into this folder")
    add_common_args(parser)
    return parser.parse_args(argv)


def format_metrics(metrics: dict) -> str:
    width = max((len(k) for k in metrics), default=0)
    lines = [f'{"metric".ljust(width)}  value', f'{"-" * width}  -----']
    for key, value in metrics.items():
        shown = f'{value:.4f}' if isinstance(value, float) else str(value)
        lines.append(f'{key.ljust(width)}  {shown}')
    return '\n'.join(lines)


def enable_amp(cfg) -> None:
    """--amp: the plugin's MixedPrecisionTestLoop in place of mmengine's TestLoop (autocast, and on
    the CPU mmcv's ops in fp32, which mmdet's detectors need)."""
    test_cfg = cfg.get('test_cfg') or {}
    loop_type = test_cfg.get('type', 'TestLoop')
    if loop_type not in ('TestLoop', MIXED_PRECISION_TEST_LOOP):
        raise SystemExit(f'error: --amp replaces test_cfg.type TestLoop; this config has {loop_type!r}')
    cfg.test_cfg = dict(test_cfg, type=MIXED_PRECISION_TEST_LOOP, fp16=True)


def enable_show_dir(cfg, show_dir: str) -> None:
    """Turn on the config's DetVisualizationHook, saving one PNG per test image into show_dir."""
    hook = cfg.get('default_hooks', {}).get('visualization')
    if cfg.get('default_scope') != 'mmdet' or not hook or hook.get('type') != 'DetVisualizationHook':
        raise SystemExit('error: --show-dir needs an mmdet config with '
                         'default_hooks.visualization=dict(type="DetVisualizationHook")')
    hook.update(draw=True, test_out_dir=osp.abspath(show_dir))  # absolute: the hook nests relative ones


def main(argv=None):
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        raise SystemExit(f'error: checkpoint {args.checkpoint!r} does not exist')
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    if args.amp:
        enable_amp(cfg)
    if args.show_dir:
        enable_show_dir(cfg, args.show_dir)
    check_data_roots(cfg, ('test',))
    use_safe_checkpoint_loading(cfg, args.unsafe_trust_checkpoint)
    with refused_checkpoint_ends_the_command():
        runner = build_runner(cfg)
        metrics = runner.test()
    close_distributed()
    if runner.rank == 0:
        print('\n' + format_metrics(metrics), flush=True)
        if args.out_json:
            with open(args.out_json, 'w') as f:
                json.dump({k: (v if isinstance(v, (int, float, str)) else str(v))
                           for k, v in metrics.items()}, f, indent=2)
    return metrics


if __name__ == '__main__':
    main()
