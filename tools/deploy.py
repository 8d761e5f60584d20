"""Export an mmdet / mmseg / mmpretrain model with mmdeploy to an onnxruntime end-to-end model.

    python tools/deploy.py DEPLOY_CFG MODEL_CFG CHECKPOINT IMG --work-dir DIR
        [--device cpu] [--test-img IMG ...] [--dump-info] [--unsafe-trust-checkpoint]

mmdeploy's own ``tools/deploy.py`` command line (its wheel ships no tools), for the onnxruntime
backend, with what this project's models need (:mod:`mmlinattn.deploy.mmdeploy`: the TorchScript
exporter on torch >= 2.9, the custom ops in their exportable form):

- writes ``DIR/end2end.onnx`` (the deploy config's ``onnx_config.save_file``), traced on ``IMG``
  through the model config's test pipeline; with ``--dump-info`` also mmdeploy's SDK files
  (``deploy.json``, ``pipeline.json``, ``detail.json``);
- ``--test-img`` (default ``IMG``): runs each image through PyTorch and onnxruntime and draws both
  results, ``DIR/output_pytorch.jpg`` and ``DIR/output_onnxruntime.jpg`` (one pair per image,
  numbered when there are several; a segmentor's as mmseg's visualiser names them,
  ``output_pytorch_0.png``, with its step counter);
- CHECKPOINT is read as the project's tools read checkpoints: tensors and plain data only, unless
  ``--unsafe-trust-checkpoint``.

Deploy configs for onnxruntime ship in ``configs/deploy/`` (docs/deployment.md); evaluate the
result with ``tools/deploy_test.py``.
"""
import argparse
import contextlib
import copy
import logging
import os
import os.path as osp

SUPPORTED_BACKENDS = ('onnxruntime', )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Export a model to onnxruntime with mmdeploy')
    parser.add_argument('deploy_cfg', help='deploy config (configs/deploy/*.py)')
    parser.add_argument('model_cfg', help='model config (mmdet, mmseg or mmpretrain)')
    parser.add_argument('checkpoint', help='checkpoint of the model config')
    parser.add_argument('img', help='image the model is traced on')
    parser.add_argument('--test-img', nargs='+', help='images to run in PyTorch and onnxruntime and '
                        'draw (default: IMG)')
    parser.add_argument('--work-dir', default=os.getcwd(), help='folder for the model and drawings')
    parser.add_argument('--device', default='cpu', help='device to export on (cpu, cuda:0)')
    parser.add_argument('--dump-info', action='store_true', help="write mmdeploy's SDK files")
    parser.add_argument('--unsafe-trust-checkpoint', action='store_true',
                        help='fully unpickle CHECKPOINT, which can run any code the file holds; only '
                        'for files you trust. Default: tensors and plain data only')
    parser.add_argument('--log-level', default='INFO', choices=list(logging._nameToLevel))
    return parser.parse_args(argv)


def check_inputs(args) -> None:
    for name in ('deploy_cfg', 'model_cfg', 'checkpoint', 'img'):
        path = getattr(args, name)
        if not osp.isfile(path):
            raise SystemExit(f'error: {name.upper()} {path!r} does not exist')
    for path in args.test_img or ():
        if not osp.isfile(path):
            raise SystemExit(f'error: --test-img {path!r} does not exist')


def load_configs(deploy_cfg_path: str, model_cfg_path: str):
    """mmdeploy's ``load_config`` of both, with the backend checked."""
    import mmlinattn  # noqa: F401  (the model config's types)
    from mmdeploy.utils import get_backend, load_config
    deploy_cfg, model_cfg = load_config(deploy_cfg_path, model_cfg_path)
    backend = get_backend(deploy_cfg).value
    if backend not in SUPPORTED_BACKENDS:
        raise SystemExit(f'error: {deploy_cfg_path}: backend_config.type must be one of '
                         f'{SUPPORTED_BACKENDS}, got {backend!r}')
    return deploy_cfg, model_cfg


def export(deploy_cfg, model_cfg, checkpoint: str, img: str, work_dir: str, device: str = 'cpu',
           trusted_checkpoint=None) -> str:
    """mmdeploy's ``torch2onnx`` in this project's export context; the ONNX file's path."""
    from mmdeploy.apis import torch2onnx
    from mmdeploy.utils import get_ir_config

    from mmlinattn.checkpoint import safe_checkpoint_loading
    from mmlinattn.deploy.mmdeploy import mmdeploy_export
    save_file = get_ir_config(deploy_cfg)['save_file']
    with safe_checkpoint_loading(trusted_checkpoint), mmdeploy_export(deploy_cfg):
        torch2onnx(img, work_dir, save_file, deploy_cfg=deploy_cfg, model_cfg=model_cfg,
                   model_checkpoint=checkpoint, device=device)
    return osp.join(work_dir, save_file)


def draw(deploy_cfg, model_cfg, checkpoint: str, onnx_file: str, images, work_dir: str,
         device: str = 'cpu', trusted_checkpoint=None) -> None:
    """Each image's PyTorch and onnxruntime results, drawn by the codebase's visualiser."""
    from mmdeploy.apis import visualize_model
    from mmdeploy.utils import Backend

    from mmlinattn.checkpoint import safe_checkpoint_loading
    from mmlinattn.deploy.mmdeploy import onnxruntime_sessions

    # mmdeploy's segmentation visualiser saves each picture after its first one into the working
    # directory (it resets its saver's folder to '.' once the saver has started): draw from work_dir.
    work_dir, checkpoint, onnx_file = map(osp.abspath, (work_dir, checkpoint, onnx_file))
    images = [osp.abspath(image) for image in images]
    trusted_checkpoint = trusted_checkpoint and osp.abspath(trusted_checkpoint)
    with contextlib.chdir(work_dir):
        for index, image in enumerate(images):
            suffix = '' if len(images) == 1 else f'_{index}'
            with onnxruntime_sessions():
                visualize_model(model_cfg, deploy_cfg, [onnx_file], image, device,
                                output_file=osp.join(work_dir, f'output_onnxruntime{suffix}.jpg'))
            with safe_checkpoint_loading(trusted_checkpoint):
                visualize_model(model_cfg, deploy_cfg, checkpoint, image, device,
                                backend=Backend.PYTORCH,
                                output_file=osp.join(work_dir, f'output_pytorch{suffix}.jpg'))


def main(argv=None):
    args = parse_args(argv)
    check_inputs(args)
    from mmdeploy.utils import get_root_logger
    logger = get_root_logger()
    logger.setLevel(logging.getLevelName(args.log_level))
    deploy_cfg, model_cfg = load_configs(args.deploy_cfg, args.model_cfg)
    os.makedirs(args.work_dir, exist_ok=True)
    trusted = args.checkpoint if args.unsafe_trust_checkpoint else None
    if args.dump_info:
        from mmdeploy.backend.sdk.export_info import export2SDK

        from mmlinattn.checkpoint import safe_checkpoint_loading
        with safe_checkpoint_loading(trusted):  # copies: export2SDK rewrites the pipeline in place
            export2SDK(copy.deepcopy(deploy_cfg), copy.deepcopy(model_cfg), args.work_dir,
                       pth=args.checkpoint, device=args.device)
    onnx_file = export(deploy_cfg, model_cfg, args.checkpoint, args.img, args.work_dir, args.device,
                       trusted)
    logger.info(f'wrote {onnx_file}')
    draw(deploy_cfg, model_cfg, args.checkpoint, onnx_file, args.test_img or [args.img],
         args.work_dir, args.device, trusted)
    logger.info(f'drew PyTorch and onnxruntime results into {args.work_dir}')


if __name__ == '__main__':
    main()
