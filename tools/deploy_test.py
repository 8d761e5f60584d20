"""Evaluate an onnxruntime model written by ``tools/deploy.py`` on the model config's test set, with
the config's metric, as mmdeploy's ``tools/test.py`` does (its wheel ships no tools).

    python tools/deploy_test.py DEPLOY_CFG MODEL_CFG --model DIR/end2end.onnx [--device cpu]
        [--work-dir DIR] [--cfg-options KEY=VALUE ...] [--speed-test [--warmup N]
        [--log-interval N]] [--threads N] [--batch-size N] [--out-json FILE]

- The sessions load the project's onnxruntime op library (``mmlinattn::LaplacianKernel``) next to
  mmdeploy's (RoIAlign, NMS): :func:`mmlinattn.deploy.mmdeploy.onnxruntime_sessions`.
- ``--threads``: onnxruntime's intra-op threads (default: onnxruntime's, one per core).
- ``--speed-test``: mmdeploy's timer around the backend's forward (``--warmup`` images first),
  logged every ``--log-interval`` images and at the end.
- ``--cfg-options`` changes the model config, e.g. the test set:
  ``test_dataloader.dataset.indices=20``.
- A static deploy config (``onnx_config.input_shape``): the test pipeline's ``Resize`` gives that
  size (``keep_ratio=False``), as mmdeploy resized the image it exported with; mmdeploy's own
  ``tools/test.py`` leaves that to the user, and the graph then refuses every other size.
"""
import argparse
import json
import os
import os.path as osp
from copy import deepcopy

from mmengine.config import DictAction

from deploy import load_configs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Evaluate an onnxruntime model with mmdeploy')
    parser.add_argument('deploy_cfg', help='deploy config the model was exported with')
    parser.add_argument('model_cfg', help='model config (its test set and metric are used)')
    parser.add_argument('--model', required=True, nargs='+', help='the backend model file(s)')
    parser.add_argument('--device', default='cpu', help='device to run on (cpu, cuda:0)')
    parser.add_argument('--work-dir', default='./work_dirs/deploy_test',
                        help='folder for the evaluation log')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of the model config')
    parser.add_argument('--batch-size', type=int, default=1, help='images per forward')
    parser.add_argument('--threads', type=int, help="onnxruntime's intra-op threads")
    parser.add_argument('--speed-test', action='store_true', help='time the backend forward')
    parser.add_argument('--warmup', type=int, default=10, help='images before timing starts')
    parser.add_argument('--log-interval', type=int, default=100, help='images between speed logs')
    parser.add_argument('--log2file', help='write the speed log to this file too')
    parser.add_argument('--out-json', help='also write the metrics to this JSON file')
    return parser.parse_args(argv)


def check_inputs(args) -> None:
    for name in ('deploy_cfg', 'model_cfg'):
        if not osp.isfile(getattr(args, name)):
            raise SystemExit(f'error: {name.upper()} {getattr(args, name)!r} does not exist')
    for path in args.model:
        if not osp.isfile(path):
            raise SystemExit(f'error: --model {path!r} does not exist')
    for name in ('batch_size', 'threads', 'warmup', 'log_interval'):
        value = getattr(args, name)
        if value is not None and value < (0 if name == 'warmup' else 1):
            raise SystemExit(f'error: --{name.replace("_", "-")} must be a positive number, '
                             f'got {value}')


def fit_test_pipeline_to_static_input(deploy_cfg, model_cfg) -> None:
    """Under a static deploy config, each ``Resize`` of the test set's pipeline resizes to the
    graph's input size, ignoring the aspect ratio, and each ``Pad`` with a size pads to it: mmdeploy's
    rule for the image it exports with (its codebases' ``process_model_config``)."""
    from mmdeploy.utils import get_input_shape
    input_shape = get_input_shape(deploy_cfg)  # (width, height), or None: dynamic
    if input_shape is None:
        return
    for transform in model_cfg.test_dataloader.dataset.pipeline:
        if transform['type'] == 'Resize':
            transform.update(scale=tuple(input_shape), keep_ratio=False)
        elif transform['type'] == 'Pad' and 'size' in transform:
            transform['size'] = tuple(input_shape)


def build_dataloader(task_processor, model_cfg, batch_size: int):
    loader = deepcopy(model_cfg['test_dataloader'])
    loader['batch_size'] = batch_size
    loader['dataset'] = task_processor.build_dataset(loader['dataset'])
    return task_processor.build_dataloader(loader)


def evaluate(deploy_cfg, model_cfg, model_files, device='cpu', work_dir='./work_dirs/deploy_test',
             batch_size=1, threads=None, speed_test=False, warmup=10, log_interval=100,
             log_file=None) -> dict:
    """The test set's metrics of the backend model (mmdeploy's test runner)."""
    from mmdeploy.apis import build_task_processor
    from mmdeploy.utils.timer import TimeCounter

    from mmlinattn.deploy.mmdeploy import onnxruntime_sessions
    from mmlinattn.deploy.onnxruntime import require_ops_library
    if any(_uses_our_ops(path) for path in model_files):
        require_ops_library()
    task_processor = build_task_processor(model_cfg, deploy_cfg, device)
    dataloader = build_dataloader(task_processor, model_cfg, batch_size)
    with onnxruntime_sessions(threads):
        model = task_processor.build_backend_model(
            model_files, data_preprocessor_updater=task_processor.update_data_preprocessor)
    runner = task_processor.build_test_runner(model, work_dir, log_file=log_file,
                                              dataloader=dataloader)
    if not speed_test:
        return runner.test()
    with TimeCounter.activate(warmup=warmup, log_interval=log_interval,
                              with_sync=device != 'cpu', file=log_file, batch_size=batch_size):
        return runner.test()


def _uses_our_ops(onnx_file: str) -> bool:
    import onnx
    from mmlinattn.ops.laplacian_kernel.onnx import DOMAIN
    if not onnx_file.endswith('.onnx'):
        return False
    model = onnx.load(onnx_file, load_external_data=False)
    return any(opset.domain == DOMAIN for opset in model.opset_import)


def main(argv=None):
    args = parse_args(argv)
    check_inputs(args)
    deploy_cfg, model_cfg = load_configs(args.deploy_cfg, args.model_cfg)
    if args.cfg_options:
        model_cfg.merge_from_dict(args.cfg_options)
    fit_test_pipeline_to_static_input(deploy_cfg, model_cfg)
    os.makedirs(args.work_dir, exist_ok=True)
    metrics = evaluate(deploy_cfg, model_cfg, args.model, args.device, args.work_dir,
                       args.batch_size, args.threads, args.speed_test, args.warmup,
                       args.log_interval, args.log2file)
    print(json.dumps(metrics, indent=1, default=float))
    if args.out_json:
        with open(args.out_json, 'w') as f:
            json.dump(metrics, f, indent=1, default=float)


if __name__ == '__main__':
    main()
