"""Deployment latency: ``python tools/benchmark.py deploy [--tasks ...] [--models ...] [--threads 2]``.

Per image, real validation images (two of ``data/coco/val2017``, :func:`test_images`; the first of
``data/ade/ADEChallengeData2016/images/validation`` and of ``data/imagenet/val``) through the model
config's own test pipeline (COCO: 1333x800 keep-ratio; ADE20K: 2048x512 keep-ratio; ImageNet: short
edge 256 (248 for Swin-T), centre crop 224), the same input tensor for every backend:

- **onnxruntime**: the end-to-end graph ``tools/deploy.py`` writes with the task's dynamic deploy
  config (mmdeploy 1.3.1: pre-processed image in, boxes/masks/class map out, NMS inside), run with
  ``onnxruntime.InferenceSession.run`` on ``--threads`` intra-op threads. The plugin's rows twice:
  with the Laplacian kernel as the op library's custom node, and exported from standard ONNX
  operators (no op library);
- **PyTorch fp32** and **PyTorch bf16**: the same model's ``forward(mode='predict')`` on the
  pre-processed batch (eager, ``torch.set_num_threads(--threads)``), post-processing included, as in
  the graph; bf16 is ``torch.autocast('cpu', dtype=torch.bfloat16)`` with mmcv's ops in fp32, as
  ``tools/test.py --amp`` runs it, and channels-last for the ResNet-50 rows (their fastest setting).

Time: median of ``--repeats`` calls after one warm-up. Random weights (seed 0; the baselines'
``init_cfg`` dropped: no pretrained weights here): the backbones' and heads' cost does not depend on
them; NMS's does a little, through the candidate counts, which the configs cap. The baselines are the
libraries' own configs (mmdet's RetinaNet / Mask R-CNN with ResNet-50, PVT-T and Swin-T, mmseg's
UperNet with Swin-T, mmpretrain's ResNet-50 and DeiT-T classifiers; not its Swin-T: mmdeploy 1.3.1's
rewrite of mmpretrain's window attention does not fit mmpretrain 1.2, ``get_attn_mask() got multiple
values for argument 'window_size'``); Mask R-CNN with PVT-T, which mmdet has no config of, is our
Mask R-CNN config with mmdet's PVT-T backbone.
"""
import argparse
import json
import math
import os
import os.path as osp
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .common import REPO_ROOT, Section, environment, publish, time_call

# rows whose export needs a later opset than the deploy config's (mmdet's PVT calls
# torch.unflatten, exported from opset 13 on)
OPSET = {'PVT-T (mmdet)': 13}
# rows whose graph is right at the traced size only (mmdet's PVT: its reshapes keep the traced sizes
# as constants): exported once per image, as a static deploy per size would be
TRACED_SIZE_ONLY = {'PVT-T (mmdet)'}
DEPLOY_CONFIGS = {'custom_op': '{task}_onnxruntime_dynamic.py',
                  'standard_ops': '{task}_onnxruntime-standard-ops_dynamic.py'}
# image set -> (folder, the dataset tool's name for it)
IMAGES = {'coco': ('data/coco/val2017', 'coco2017'),
          'ade': ('data/ade/ADEChallengeData2016/images/validation', 'ade20k'),
          'imagenet': ('data/imagenet/val', 'imagenet')}
MMDET_PVT_T = dict(_delete_=True, type='mmdet.PyramidVisionTransformer', num_layers=[2, 2, 2, 2],
                   out_indices=(0, 1, 2, 3), init_cfg=None)

# task -> (deploy config task, image set, {row: (model config, model edits)}); 'lib::' configs are
# the libraries' own.
TASKS: Dict[str, Tuple[str, str, Dict[str, Tuple[str, Optional[dict]]]]] = {
    'RetinaNet': ('detection', 'coco', {
        'LaplacianFormer-T': ('configs/retinanet_laplacian_tiny_1x_coco.py', None),
        'Pola-PVT-T': ('configs/retinanet_pola_pvt_tiny_1x_coco.py', None),
        'ResNet-50 (mmdet)': ('mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', None),
        'PVT-T (mmdet)': ('mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py', None),
        'Swin-T (mmdet)': ('mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py', None),
    }),
    'Mask R-CNN': ('instance-seg', 'coco', {
        'LaplacianFormer-T': ('configs/mask_rcnn_laplacian_tiny_1x_coco.py', None),
        'Pola-PVT-T': ('configs/mask_rcnn_pola_pvt_tiny_1x_coco.py', None),
        'ResNet-50 (mmdet)': ('mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', None),
        'PVT-T (mmdet)': ('configs/mask_rcnn_laplacian_tiny_1x_coco.py',
                          dict(backbone=MMDET_PVT_T, neck=dict(in_channels=[64, 128, 320, 512]))),
        'Swin-T (mmdet)': ('mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py', None),
    }),
    'UperNet': ('segmentation', 'ade', {
        'LaplacianFormer-T': ('configs/upernet_laplacian_tiny_512x512_160k_ade20k.py', None),
        'Pola-Swin-T': ('configs/upernet_pola_swin_tiny_512x512_160k_ade20k.py', None),
        'Swin-T (mmseg)': ('mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
                           None),
    }),
    'Classifier': ('classification', 'imagenet', {
        'LaplacianFormer-T': ('configs/laplacianformer_tiny_8xb128_in1k.py', None),
        'Pola-PVT-T': ('configs/pola_pvt_tiny_8xb128_in1k.py', None),
        'Pola-Swin-T': ('configs/pola_swin_tiny_8xb128_in1k.py', None),
        'Pola-DeiT-T': ('configs/pola_deit_tiny_8xb128_in1k.py', None),
        'ResNet-50 (mmpretrain)': ('mmpretrain::resnet/resnet50_8xb32_in1k.py', None),
        'DeiT-T (mmpretrain)': ('mmpretrain::deit/deit-tiny_4xb256_in1k.py', None),
    }),
}


def config_path(spec: str) -> str:
    """A repository config, or ``lib::rel`` in the library's shipped configs (``lib/.mim/configs``)."""
    if '::' not in spec:
        return osp.join(REPO_ROOT, spec)
    library, rel = spec.split('::')
    return osp.join(osp.dirname(__import__(library).__file__), '.mim', 'configs', rel)


def model_config(spec: str, edits: Optional[dict]):
    """The config with random-init backbones (no ``init_cfg`` download) and ``edits`` merged."""
    from mmengine.config import Config
    cfg = Config.fromfile(config_path(spec))
    cfg.model.backbone.init_cfg = None
    if edits:
        cfg.merge_from_dict({f'model.{key}': value for key, value in edits.items()})
    return cfg


def test_images(image_set: str) -> List[str]:
    """The images a task is timed on: the set's first; for COCO two photos, the first of 640x480
    (COCO's commonest shape; input 800x1088) and the one nearest the test scale's 1333:800 aspect
    (its input fills the scale: 1344x800)."""
    from PIL import Image
    folder, dataset_name = IMAGES[image_set]
    folder = osp.join(REPO_ROOT, folder)
    paths = [osp.join(folder, name) for name in sorted(os.listdir(folder))] if osp.isdir(folder) else []
    if not paths:
        raise SystemExit(f'error: no images in {folder}: prepare the set first (tools/misc/download_dataset.py '
                         f'--dataset-name {dataset_name}, docs/datasets.md)')
    if image_set != 'coco':
        return paths[:1]
    sizes = {path: Image.open(path).size for path in paths}  # reads the headers only
    common = next((path for path in paths if sizes[path] == (640, 480)), paths[0])
    filling = min(paths, key=lambda path: abs(math.log(max(sizes[path]) / min(sizes[path]) / (1333 / 800))))
    return list(dict.fromkeys((common, filling)))


def bf16_predict(model) -> Callable[[torch.Tensor, list], Any]:
    """``model``'s predict as ``tools/test.py --amp`` runs it on the CPU (bf16 autocast, mmcv's ops in
    fp32), channels-last for ResNets (their fastest setting). Changes ``model`` in place: time its fp32
    predict before."""
    from mmlinattn.cpu_autocast import run_mmcv_ops_in_fp32
    run_mmcv_ops_in_fp32(model)
    memory_format = torch.channels_last if type(model.backbone).__name__.startswith('ResNet') else None
    if memory_format:
        model.to(memory_format=memory_format)

    def predict(inputs, data_samples):
        if memory_format:
            inputs = inputs.contiguous(memory_format=memory_format)
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
            return model(inputs, data_samples, mode='predict')
    return predict


def onnxruntime_op_times(onnx_file: str, feed: dict, threads: int, runs: int, work_dir: str) -> Dict[str, float]:
    """Milliseconds per run that onnxruntime's profiler puts in each op type, largest first: its node
    events in ``runs`` runs, after a warm-up run left out of the sum."""
    import onnxruntime

    from mmlinattn.deploy.onnxruntime import session_options
    options = session_options(threads, ops_library=None)
    options.enable_profiling = True
    options.profile_file_prefix = osp.join(work_dir, 'onnxruntime_profile')
    session = onnxruntime.InferenceSession(onnx_file, options, providers=['CPUExecutionProvider'])
    for _ in range(runs + 1):
        session.run(None, feed)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    warm_up = min((e for e in events if e.get('name') == 'model_run'), key=lambda e: e['ts'])
    timed_from = warm_up['ts'] + warm_up['dur']
    times: Dict[str, float] = {}
    for event in events:
        op_type = event.get('args', {}).get('op_name')
        if event.get('cat') == 'Node' and op_type and event['ts'] >= timed_from:
            times[op_type] = times.get(op_type, 0.0) + event['dur'] / 1e3 / runs
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def measure(task: str, label: str, threads: int, repeats: int, work_dir: str,
            profile: bool = False) -> List[dict]:
    """The model's rows, one per test image: exported once per form with tools/deploy.py's function
    (traced on the first image; the graphs take any size; :data:`TRACED_SIZE_ONLY` rows once per
    image), then onnxruntime and PyTorch timed on each image; with ``profile``, the first row also
    holds onnxruntime's time per op type on the first image (:func:`onnxruntime_op_times`)."""
    import onnxruntime
    from mmdeploy.apis import build_task_processor
    from mmdeploy.utils import load_config

    from deploy import export
    from mmlinattn.deploy.onnxruntime import session_options
    deploy_task, image_set, models = TASKS[task]
    spec, edits = models[label]
    cfg = model_config(spec, edits)
    images = test_images(image_set)
    ours = cfg.model.backbone.type.startswith('mmlinattn.')
    deploy_cfgs = {}
    for form in ('custom_op', 'standard_ops') if ours else ('custom_op', ):
        deploy_cfgs[form], _ = load_config(osp.join(REPO_ROOT, 'configs', 'deploy',
                                                    DEPLOY_CONFIGS[form].format(task=deploy_task)), cfg)
        if label in OPSET:
            onnx_config = deploy_cfgs[form].onnx_config
            onnx_config.opset_version = max(OPSET[label], onnx_config.opset_version)
    torch.manual_seed(0)
    processor = build_task_processor(cfg, deploy_cfgs['custom_op'], 'cpu')
    model = processor.build_pytorch_model(None).eval()
    checkpoint = osp.join(work_dir, 'random.pth')
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, checkpoint)
    batches = [processor.create_input(image, None, data_preprocessor=model.data_preprocessor) for image in images]
    rows = [dict(task=task, model=label, input=f'{inputs.shape[2]}x{inputs.shape[3]}') for _, inputs in batches]
    options = session_options(threads, ops_library=None)
    for form, deploy_cfg in deploy_cfgs.items():
        traced = images if label in TRACED_SIZE_ONLY else images[:1]
        onnx_files = {image: export(deploy_cfg, cfg, checkpoint, image, osp.join(work_dir, form, str(index)))
                      for index, image in enumerate(traced)}
        sessions = {image: onnxruntime.InferenceSession(onnx_file, options, providers=['CPUExecutionProvider'])
                    for image, onnx_file in onnx_files.items()}
        for row, image, (_, inputs) in zip(rows, images, batches):
            session = sessions.get(image, sessions[images[0]])
            feed = {session.get_inputs()[0].name: inputs.numpy()}
            row[f'onnxruntime {form}'] = time_call(lambda: session.run(None, feed), 'cpu', repeats)
        if profile and form == 'custom_op':
            feed = {sessions[images[0]].get_inputs()[0].name: batches[0][1].numpy()}
            rows[0]['profile'] = onnxruntime_op_times(onnx_files[images[0]], feed, threads, repeats, work_dir)
    with torch.no_grad():
        for row, (data, inputs) in zip(rows, batches):
            row['PyTorch fp32'] = time_call(lambda: model(inputs, data['data_samples'], mode='predict'),
                                            'cpu', repeats)
    predict = bf16_predict(model)
    for row, (data, inputs) in zip(rows, batches):
        row['PyTorch bf16'] = time_call(lambda: predict(inputs, data['data_samples']), 'cpu', repeats)
        print(f'  {task} {label}, {row["input"]}: ' + ', '.join(f'{k} {v:.0f} ms' for k, v in row.items()
                                                               if isinstance(v, float)), flush=True)
    return rows


def summarise(rows: List[dict], threads: int) -> Section:
    """Per task and input size, each model's latencies and its onnxruntime speed against the first
    library baseline (ResNet-50; Swin-T for UperNet) on the same input and against its own PyTorch
    fp32 and bf16."""
    out = []
    for task, size in dict.fromkeys((r['task'], r['input']) for r in rows):
        mine = [r for r in rows if (r['task'], r['input']) == (task, size)]
        baseline = next((r for r in mine if '(mm' in r['model']), None)
        for r in mine:
            ort = r['onnxruntime custom_op']
            out.append({'task': task, 'model': r['model'], 'input': size,
                        'onnxruntime ms': ort, 'onnxruntime, standard ops ms': r.get('onnxruntime standard_ops'),
                        'PyTorch fp32 ms': r['PyTorch fp32'], 'PyTorch bf16 ms': r['PyTorch bf16'],
                        'onnxruntime speed vs PyTorch fp32': r['PyTorch fp32'] / ort,
                        'onnxruntime speed vs PyTorch bf16': r['PyTorch bf16'] / ort,
                        'onnxruntime speed vs the baseline':
                            (baseline['onnxruntime custom_op'] / ort) if baseline else None})
    columns = list(dict.fromkeys(key for r in out for key in r))
    return Section(title=f'Deployment latency per image (onnxruntime and PyTorch, {threads} threads)',
                   columns=columns, rows=out,
                   notes=['onnxruntime ms: the plugin\'s rows with the Laplacian kernel as the op library\'s '
                          'custom node (other rows: no custom node of ours); standard ops: exported from '
                          'standard ONNX operators, no op library.',
                          'PyTorch bf16 ms: autocast to bf16 with mmcv\'s ops in fp32 (tools/test.py --amp), '
                          'channels-last for ResNet-50.',
                          'the baseline: the task\'s first library model (ResNet-50; Swin-T for UperNet), '
                          'in onnxruntime; speed ratios > 1: faster.'])


def summarise_profiles(rows: List[dict], top: int = 8) -> Section:
    """Per profiled model, onnxruntime's ``top`` op types by time (the rest summed) and their share."""
    out = []
    for r in rows:
        if 'profile' not in r:
            continue
        total = sum(r['profile'].values())
        ops = list(r['profile'].items())
        ops = ops[:top] + ([('(other)', sum(ms for _, ms in ops[top:]))] if len(ops) > top else [])
        out += [{'task': r['task'], 'model': r['model'], 'input': r['input'], 'op type': op, 'ms': ms,
                 'share %': 100 * ms / total} for op, ms in ops]
    return Section(title="Where onnxruntime's time goes (its profiler, node time per image)",
                   columns=['task', 'model', 'input', 'op type', 'ms', 'share %'], rows=out,
                   notes=['node time summed per op type; the session\'s own overhead between nodes is '
                          'not in it.'])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--tasks', nargs='+', choices=list(TASKS), help=f'subset of {list(TASKS)}')
    parser.add_argument('--models', nargs='+', metavar='NAME', help='row labels to run (default: all)')
    parser.add_argument('--threads', type=int, default=2, help='onnxruntime intra-op and torch threads')
    parser.add_argument('--repeats', type=int, default=3, help='timed calls per backend (median)')
    parser.add_argument('--profile', action='store_true',
                        help="also profile each model's onnxruntime run on the first image (time per op type)")
    parser.add_argument('--out', help='write the results as JSON to this file')


def main(args: argparse.Namespace) -> int:
    tasks = args.tasks or list(TASKS)
    unknown = set(args.models or ()) - {label for t in tasks for label in TASKS[t][2]}
    if unknown:
        print(f'--models: no row named {sorted(unknown)} in {tasks}', file=sys.stderr)
        return 2
    # only once the arguments hold: it changes the process (and breaks MKL's batched LU after it)
    torch.set_num_threads(args.threads)
    meta = dict(environment(), threads=args.threads, repeats=args.repeats, load_average=os.getloadavg())
    print('# deploy benchmark: ' + ', '.join(f'{k}={v}' for k, v in meta.items()))
    rows, failed = [], []
    for task in tasks:
        for label in TASKS[task][2]:
            if args.models and label not in args.models:
                continue
            with tempfile.TemporaryDirectory(prefix='deploy_bench-') as work_dir:
                try:
                    rows += measure(task, label, args.threads, args.repeats, work_dir, args.profile)
                except Exception as err:  # one row's export failing is a result, not the end
                    print(f'  {task} {label}: failed: {type(err).__name__}: {err}', flush=True)
                    failed.append(f'{task}, {label}: {type(err).__name__}: {str(err).splitlines()[0][:200]}')
    section = summarise(rows, args.threads)
    section.notes += [f'not measured: {reason}' for reason in failed]
    publish([section] + ([summarise_profiles(rows)] if args.profile else []), args.out, meta)
    return 1 if failed else 0
