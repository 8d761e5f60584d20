"""What tools/dev/run_demo.sh shows: a config's training schedule, and the demo's pictures and summary.

    python tools/dev/demo_report.py schedule CONFIG [--cfg-options k=v ...]
    python tools/dev/demo_report.py report WORK_DIR

``schedule`` prints the config's schedule as epochs x iterations at the batch the config was
written for (``auto_scale_lr.base_batch_size``, e.g. 8 GPUs x 2 images) and at one process; it
builds the training set to count its images, so the data must be there.

``report`` reads the work dir of the demo (``--data toy``: the synthetic sets; ``--data balloon``:
CIFAR-10 pretraining, balloon fine-tuning) (``pretrain/`` and ``finetune/`` training runs, no
``pretrain/`` when the detector started from random weights,
``metrics.json`` and ``predictions/`` from ``tools/test.py --show-dir``, ``stage_seconds.txt``),
writes ``curves.png`` (training losses with the validation top-1 accuracy and COCO AP per epoch)
and ``predictions.png`` (a handful of the drawn validation images), and prints a one-screen summary.
"""
import argparse
import glob
import json
import os.path as osp
import re

BACKBONE_LOADED = re.compile(r'LaplacianFormer: loaded (\S+); missing keys: (.*?); unexpected keys: (.*)$')
AP_KEYS = ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50')
NUM_SHOWN = 6
# --data -> (pretraining set, fine-tuning set, what the sets are)
SETS = {'toy': ('toy-ImageNet', 'toy-COCO', 'toy sets'),
        'balloon': ('CIFAR-10', 'balloon', 'real photos')}


# ------------------------------------------------------------------------------------ schedule

def describe_schedule(cfg, num_images: int) -> str:
    """'12 epochs x 7330 iterations at 8 GPUs x 2 images (...)' from a config and its set size."""
    per_gpu = cfg.train_dataloader.batch_size
    reference = cfg.get('auto_scale_lr', {}).get('base_batch_size', per_gpu)
    gpus = max(reference // per_gpu, 1)
    epochs = cfg.train_cfg.max_epochs
    per_epoch = -(-num_images // (gpus * per_gpu))
    one_process = -(-num_images // per_gpu)
    return (f'{epochs} epochs x {per_epoch} iterations at {gpus} GPUs x {per_gpu} images '
            f'({epochs * per_epoch} iterations, {num_images} training images); this single-process '
            f'run: {epochs} x {one_process} iterations of {per_gpu} images')


def schedule(args) -> None:
    from mmengine.config import Config
    from mmengine.registry import DATASETS, init_default_scope

    import mmlinattn  # noqa: F401
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    init_default_scope(cfg.default_scope)
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    print(f'[demo] schedule of {args.config}: {describe_schedule(cfg, len(dataset))}', flush=True)


# ------------------------------------------------------------------------------------ report

def read_scalars(run_dir: str):
    """(train rows, val rows) of the latest run in an mmengine work dir (vis_data/scalars.json)."""
    paths = sorted(glob.glob(osp.join(run_dir, '*', 'vis_data', 'scalars.json')))
    if not paths:
        raise SystemExit(f'error: no */vis_data/scalars.json under {run_dir}; did the training run?')
    with open(paths[-1]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if 'loss' in r], [r for r in rows if 'loss' not in r]


def epoch_end_iters(train_rows) -> dict:
    """{validation step: last logged iteration before it}: the epoch's for an epoch-based run, the
    iteration itself for an iteration-based one (its rows have no epoch)."""
    ends = {}
    for row in train_rows:
        step = row.get('epoch', row['iter'])
        ends[step] = max(ends.get(step, 0), row['iter'])
    return ends


def length(train_rows) -> str:
    last = train_rows[-1]
    return (f"{last['epoch']} epochs, " if 'epoch' in last else '') + f"{last['iter']} iterations"


def backbone_load_line(run_dir: str):
    """(checkpoint, missing keys) from the fine-tuning log's Pretrained line, or None."""
    for path in sorted(glob.glob(osp.join(run_dir, '*', '*.log')))[-1:]:
        with open(path) as f:
            for line in f:
                match = BACKBONE_LOADED.search(line.strip())
                if match:
                    return match.group(1), match.group(2)
    return None


def plot_curves(pretrain, finetune, sets, out_path: str) -> None:
    """One panel per training run: the pretraining's (when there was one) and the fine-tuning's."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    ap_curves = tuple((key, key.split('/')[1].replace('_mAP', ' mAP')) for key in AP_KEYS)
    if pretrain is None:
        panels = [(finetune, f'Mask R-CNN from random weights, {sets[1]}', ap_curves)]
    else:
        panels = [(pretrain, f'pretraining: LaplacianFormer-T classifier, {sets[0]}',
                   (('accuracy/top1', 'val top-1 (%)'),)),
                  (finetune, f'fine-tuning: Mask R-CNN from the classifier, {sets[1]}', ap_curves)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.6), squeeze=False)
    for axis, ((train_rows, val_rows), title, metrics) in zip(axes[0], panels):
        axis.plot([r['iter'] for r in train_rows], [r['loss'] for r in train_rows], color='0.35',
                  label='training loss')
        axis.set_xlabel('iteration')
        axis.set_ylabel('loss')
        axis.set_title(title, fontsize=10)
        ends = epoch_end_iters(train_rows)
        metric_axis = axis.twinx()
        for key, label in metrics:
            points = [(ends[r['step']], r[key]) for r in val_rows if key in r and r['step'] in ends]
            if points:
                metric_axis.plot(*zip(*points), marker='o', label=label)
        metric_axis.set_ylabel('validation')
        lines = axis.get_legend_handles_labels()
        more = metric_axis.get_legend_handles_labels()
        axis.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc='center right')
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def predictions_grid(image_paths, out_path: str, width: int = 640) -> None:
    """The drawn images (ground truth | prediction each) stacked in two columns, ``width`` px each."""
    from PIL import Image
    tiles = []
    for path in image_paths:
        image = Image.open(path).convert('RGB')
        tiles.append(image.resize((width, round(image.height * width / image.width))))
    columns = 2
    rows = [tiles[i:i + columns] for i in range(0, len(tiles), columns)]
    heights = [max(t.height for t in row) for row in rows]
    grid = Image.new('RGB', (columns * width, sum(heights)), 'white')
    top = 0
    for row, height in zip(rows, heights):
        for k, tile in enumerate(row):
            grid.paste(tile, (k * width, top))
        top += height
    grid.save(out_path)


def minutes(seconds: float) -> str:
    return f'{int(seconds) // 60}m {int(seconds) % 60:02d}s'


def summary_lines(work_dir, sets, pretrain, finetune, metrics, stages, loaded, num_val, pictures) -> list:
    """The one-screen summary; ``pretrain`` is None for a detector trained from random weights."""
    ft_train, _ = finetune
    rule = '=' * 92
    start = 'pretrained as a classifier, then fine-tuned as' if pretrain else 'from random weights,'
    lines = [rule, f' mmlinattn demo: LaplacianFormer-T {start} Mask R-CNN ({sets[2]})', '-' * 92]
    if pretrain:
        pre_train, pre_val = pretrain
        top1 = pre_val[-1].get('accuracy/top1') if pre_val else None
        lines.append(f" 1. pretrain   classifier, {sets[0]:<14} {length(pre_train)}"
                     f"   loss {pre_train[0]['loss']:.2f} -> "
                     f"{pre_train[-1]['loss']:.2f}   val top-1 "
                     + (f'{top1:.1f} %' if top1 is not None else 'n/a')
                     + f"   {minutes(stages.get('pretrain', 0))}")
    else:
        lines.append(' 1. pretrain   none: the detector starts from random weights')
    lines.append(f" 2. {'fine-tune' if pretrain else 'train':<9}  Mask R-CNN, {sets[1]:<14} {length(ft_train)}"
                 f"   loss {ft_train[0]['loss']:.2f} -> "
                 f"{ft_train[-1]['loss']:.2f}   {minutes(stages.get('finetune', 0))}")
    if pretrain and loaded:
        lines.append(f'    backbone initialised from {loaded[0]} (init_cfg Pretrained; not in the '
                     f'classifier: {loaded[1]})')
    elif pretrain:
        lines.append('    WARNING: the fine-tuning log has no "LaplacianFormer: loaded" line: the '
                     'backbone was NOT initialised from the classifier')
    lines.append(f" 3. test       mmdet CocoMetric on {num_val} validation images   "
                 f"{minutes(stages.get('test', 0))}")
    lines.append('                  mAP     mAP_50')
    for task in ('bbox', 'segm'):
        values = [metrics.get(f'coco/{task}_mAP'), metrics.get(f'coco/{task}_mAP_50')]
        lines.append(f'    {task:<10}  ' + '  '.join(f'{v:7.3f}' if isinstance(v, (int, float)) else '    n/a'
                                                  for v in values))
    lines.append(' pictures')
    lines.append(f"    {pictures['curves']:<44} losses, {'val top-1 and ' if pretrain else ''}AP")
    lines.append(f"    {pictures['grid']:<44} {pictures['shown']} validation images: ground "
                 'truth | prediction')
    lines.append(f"    {osp.join(work_dir, 'predictions', ''):<44} all {num_val} drawn validation "
                 'images')
    lines.append(f" total {minutes(sum(stages.values()))} after set-up "
                 f"({', '.join(f'{k} {minutes(v)}' for k, v in stages.items())})")
    lines.append(rule)
    return lines


def report(args) -> None:
    work_dir = args.work_dir
    pretrain = read_scalars(osp.join(work_dir, 'pretrain')) if osp.isdir(osp.join(work_dir, 'pretrain')) else None
    finetune = read_scalars(osp.join(work_dir, 'finetune'))
    with open(osp.join(work_dir, 'metrics.json')) as f:
        metrics = json.load(f)
    stages = {}
    stage_file = osp.join(work_dir, 'stage_seconds.txt')
    if osp.isfile(stage_file):
        with open(stage_file) as f:
            for line in f:
                name, seconds = line.split()
                stages[name] = int(seconds)
    drawn = sorted(glob.glob(osp.join(work_dir, 'predictions', '*')))
    if not drawn:
        raise SystemExit(f'error: no drawn predictions in {osp.join(work_dir, "predictions")}')
    pictures = dict(curves=osp.join(work_dir, 'curves.png'), grid=osp.join(work_dir, 'predictions.png'),
                    shown=min(NUM_SHOWN, len(drawn)))
    sets = SETS[args.data]
    plot_curves(pretrain, finetune, sets, pictures['curves'])
    predictions_grid(drawn[:NUM_SHOWN], pictures['grid'])
    loaded = backbone_load_line(osp.join(work_dir, 'finetune'))
    print('\n'.join(summary_lines(work_dir, sets, pretrain, finetune, metrics, stages, loaded, len(drawn),
                                  pictures)), flush=True)


def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    commands = parser.add_subparsers(dest='command', required=True)
    sched = commands.add_parser('schedule', help="print a config's schedule (epochs x iterations)")
    sched.add_argument('config')
    sched.add_argument('--cfg-options', nargs='+', action=DictAction)
    rep = commands.add_parser('report', help="the demo's curves, prediction grid and summary")
    rep.add_argument('work_dir')
    rep.add_argument('--data', choices=sorted(SETS), default='toy', help='the sets the demo ran on')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.command == 'schedule':
        schedule(args)
    else:
        report(args)


if __name__ == '__main__':
    main()
