"""Deployment latency: ``python tools/benchmark.py deploy [--tasks ...] [--models ...] [--threads 2]``.

Per image, one real validation image (the first of ``data/coco/val2017``, of
``data/ade/ADEChallengeData2016/images/validation``) through the model config's own test pipeline
(COCO: 1333x800 keep-ratio; ADE20K: 2048x512 keep-ratio), the same input tensor for every backend:

- **onnxruntime**: the end-to-end graph ``tools/deploy.py`` writes with the task's dynamic deploy
  config (mmdeploy 1.3.1: pre-processed image in, boxes/masks/class map out, NMS inside), run with
  ``onnxruntime.InferenceSession.run`` on ``--threads`` intra-op threads. The plugin's rows twice:
  with the Laplacian kernel as the op library's custom node, and exported from standard ONNX
  operators (no op library);
- **PyTorch fp32**: the same model's ``forward(mode='predict')`` on the pre-processed batch (eager,
  ``torch.set_num_threads(--threads)``), post-processing included, as in the graph.

Time: median of ``--repeats`` calls after one warm-up. Random weights (seed 0; the baselines'
``init_cfg`` dropped: no pretrained weights here): the backbones' and heads' cost does not depend on
them; NMS's does a little, through the candidate counts, which the configs cap. The baselines are the
libraries' own configs (mmdet's RetinaNet / Mask R-CNN with ResNet-50, PVT-T and Swin-T, mmseg's
UperNet with Swin-T); Mask R-CNN with PVT-T, which mmdet has no config of, is our Mask R-CNN config
with mmdet's PVT-T backbone.
"""
import argparse
import os
import os.path as osp
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import torch

from .common import REPO_ROOT, Section, environment, publish, time_call

# rows whose export needs a later opset than the deploy config's (mmdet's PVT calls
# torch.unflatten, exported from opset 13 on)
OPSET = {'PVT-T (mmdet)': 13}
DEPLOY_CONFIGS = {'custom_op': '{task}_onnxruntime_dynamic.py',
                  'standard_ops': '{task}_onnxruntime-standard-ops_dynamic.py'}
IMAGES = {'coco': 'data/coco/val2017', 'ade': 'data/ade/ADEChallengeData2016/images/validation'}
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


def first_image(image_set: str) -> str:
    folder = osp.join(REPO_ROOT, IMAGES[image_set])
    names = sorted(os.listdir(folder)) if osp.isdir(folder) else []
    if not names:
        raise SystemExit(f'error: no images in {folder}: prepare the set first (tools/misc/download_dataset.py '
                         f'--dataset-name {"coco2017" if image_set == "coco" else "ade20k"}, docs/datasets.md)')
    return osp.join(folder, names[0])


def measure(task: str, label: str, threads: int, repeats: int, work_dir: str) -> dict:
    """One row: export with tools/deploy.py's function, time onnxruntime and PyTorch."""
    import onnxruntime
    from mmdeploy.apis import build_task_processor
    from mmdeploy.utils import load_config

    from deploy import export
    from mmlinattn.deploy.onnxruntime import ops_library_path, session_options
    deploy_task, image_set, rows = TASKS[task]
    spec, edits = rows[label]
    cfg = model_config(spec, edits)
    image = first_image(image_set)
    ours = cfg.model.backbone.type.startswith('mmlinattn.')
    forms = ('custom_op', 'standard_ops') if ours else ('custom_op', )
    torch.manual_seed(0)
    deploy_cfg, _ = load_config(osp.join(REPO_ROOT, 'configs', 'deploy',
                                         DEPLOY_CONFIGS['custom_op'].format(task=deploy_task)), cfg)
    processor = build_task_processor(cfg, deploy_cfg, 'cpu')
    model = processor.build_pytorch_model(None).eval()
    checkpoint = osp.join(work_dir, 'random.pth')
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, checkpoint)
    data, inputs = processor.create_input(image, None, data_preprocessor=model.data_preprocessor)
    row = dict(task=task, model=label, input=f'{inputs.shape[2]}x{inputs.shape[3]}')
    for form in forms:
        deploy_cfg, _ = load_config(osp.join(REPO_ROOT, 'configs', 'deploy',
                                             DEPLOY_CONFIGS[form].format(task=deploy_task)), cfg)
        if label in OPSET:
            deploy_cfg.onnx_config.opset_version = max(OPSET[label], deploy_cfg.onnx_config.opset_version)
        onnx_file = export(deploy_cfg, cfg, checkpoint, image, osp.join(work_dir, form))
        options = session_options(threads, ops_library=ops_library_path() is not None)
        session = onnxruntime.InferenceSession(onnx_file, options, providers=['CPUExecutionProvider'])
        feed = {session.get_inputs()[0].name: inputs.numpy()}
        row[f'onnxruntime {form}'] = time_call(lambda: session.run(None, feed), 'cpu', repeats)
    with torch.no_grad():
        row['PyTorch fp32'] = time_call(
            lambda: model(inputs, data['data_samples'], mode='predict'), 'cpu', repeats)
    print(f'  {task} {label}: ' + ', '.join(f'{k} {v:.0f} ms' for k, v in row.items()
                                             if isinstance(v, float)), flush=True)
    return row


def summarise(rows: List[dict], threads: int) -> Section:
    """Per task, each model's latencies and its onnxruntime speed against the task's first
    library baseline (ResNet-50; Swin-T for UperNet) and against its own PyTorch fp32."""
    out = []
    for task in dict.fromkeys(r['task'] for r in rows):
        mine = [r for r in rows if r['task'] == task]
        baseline = next((r for r in mine if '(mm' in r['model']), None)
        for r in mine:
            ort = r['onnxruntime custom_op']
            out.append({'task': task, 'model': r['model'], 'input': r['input'],
                        'onnxruntime ms': ort, 'onnxruntime, standard ops ms': r.get('onnxruntime standard_ops'),
                        'PyTorch fp32 ms': r['PyTorch fp32'],
                        'onnxruntime speed vs PyTorch': r['PyTorch fp32'] / ort,
                        'onnxruntime speed vs the baseline':
                            (baseline['onnxruntime custom_op'] / ort) if baseline else None})
    columns = list(dict.fromkeys(key for r in out for key in r))
    return Section(title=f'Deployment latency per image (onnxruntime and PyTorch, {threads} threads)',
                   columns=columns, rows=out,
                   notes=['onnxruntime ms: the plugin\'s rows with the Laplacian kernel as the op library\'s '
                          'custom node (other rows: no custom node of ours); standard ops: exported from '
                          'standard ONNX operators, no op library.',
                          'the baseline: the task\'s first library model (ResNet-50; Swin-T for UperNet), '
                          'in onnxruntime; speed ratios > 1: faster.'])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--tasks', nargs='+', choices=list(TASKS), help=f'subset of {list(TASKS)}')
    parser.add_argument('--models', nargs='+', metavar='NAME', help='row labels to run (default: all)')
    parser.add_argument('--threads', type=int, default=2, help='onnxruntime intra-op and torch threads')
    parser.add_argument('--repeats', type=int, default=3, help='timed calls per backend (median)')
    parser.add_argument('--out', help='write the results as JSON to this file')


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    tasks = args.tasks or list(TASKS)
    unknown = set(args.models or ()) - {label for t in tasks for label in TASKS[t][2]}
    if unknown:
        print(f'--models: no row named {sorted(unknown)} in {tasks}', file=sys.stderr)
        return 2
    meta = dict(environment(), threads=args.threads, repeats=args.repeats, load_average=os.getloadavg())
    print('# deploy benchmark: ' + ', '.join(f'{k}={v}' for k, v in meta.items()))
    rows, failed = [], []
    for task in tasks:
        for label in TASKS[task][2]:
            if args.models and label not in args.models:
                continue
            with tempfile.TemporaryDirectory(prefix='deploy_bench-') as work_dir:
                try:
                    rows.append(measure(task, label, args.threads, args.repeats, work_dir))
                except Exception as err:  # one row's export failing is a result, not the end
                    print(f'  {task} {label}: failed: {type(err).__name__}: {err}', flush=True)
                    failed.append(f'{task}, {label}: {type(err).__name__}: {str(err).splitlines()[0][:200]}')
    section = summarise(rows, args.threads)
    section.notes += [f'not measured: {reason}' for reason in failed]
    publish([section], args.out, meta)
    return 1 if failed else 0
