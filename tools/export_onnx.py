"""Export a backbone (or a whole mmpretrain classifier) to ONNX and check it against PyTorch.

    python tools/export_onnx.py CONFIG [CHECKPOINT] --out FILE.onnx [--classifier]
        [--exporter dynamo|torchscript] [--shape H W] [--check-shape H W ...] [--atol 1e-4]
        [--opset N]

- The model is the config's backbone (outputs ``out{i}``, one per ``out_indices`` entry,
  ``[B, C_i, H_i, W_i]``) or, with ``--classifier``, the mmpretrain classifier from the normalised
  image to the logits (``logits [B, num_classes]``; the data preprocessor's mean/std
  normalisation is not part of the graph). Random weights without CHECKPOINT; with it, the
  backbone loads it as its ``init_cfg`` Pretrained does (whole-model and official PolaFormer files
  included), the classifier loads it strictly (an official PolaFormer file is converted with
  its head).
- The custom ops run in their pure-PyTorch reference form while exporting and checking
  (``MMLINATTN_OPS=reference`` for the duration), so the graph holds standard ONNX operators
  only: the Laplacian kernel's ``cdist(p=1)``, which has no ONNX translation, is exported as
  ``l1_distance_exportable`` (``mmlinattn/ops/laplacian_kernel/reference.py``: one broadcast
  subtraction per 8 channels), the Newton–Schulz iteration unrolled, LaplacianFormer's ``max_landmark_grid`` pooling as
  size-following matrix products (``capped_avg_pool2d_exportable``).
- Exporter (``--exporter``): ``torchscript`` (the default: the legacy tracer,
  ``torch.onnx.export(..., dynamo=False)``, opset 17) or ``dynamo`` (``dynamo=True``: the model
  is captured with torch.export, opset 18 unless ``--opset``), both with dynamic batch, height and
  width. The TorchScript path is the default because its graphs are the ones checked in
  docs/compile_export.md, and it is the one torch versions without a usable dynamo exporter (or without
  onnxscript) have. The dynamo exporter records the size-dependent branches as guards: an export
  whose traced size lies on a boundary of one fails with the guard's message instead of writing
  a graph that is wrong elsewhere.
- The graph is traced at ``--shape`` (default 256x320). Python branches on sizes are fixed at that
  shape, so trace at a size where every stage takes its general path: not the pretraining size
  (the position embeddings are resized only when the sizes differ). Pola-Swin switches the shift
  off in a stage whose padded map is a single 7x7 window (stage 4 up to 224 pixels per side,
  stage 3 up to 112), so its graph is right for inputs in the traced size's regime only (the
  TorchScript graph traced at 256x320 is 0.43 off at 224x224; traced at 192x192 it matches at
  160x200 and 224x224).
- Check: onnxruntime (CPU) against PyTorch (reference ops) on the same seeded random input, batch
  2, at the trace shape and each ``--check-shape`` (default 224x224 and 320x256); prints the max
  abs difference per output and exits with 1 if any exceeds ``--atol`` or a shape differs.
"""
import argparse
import os
import os.path as osp
import sys
import warnings
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from mmlinattn.ops.dispatch import forced

from analysis.model_loading import build_backbone, build_classifier, load_config

OPSET = {'dynamo': 18, 'torchscript': 17}


class ClassifierLogits(nn.Module):
    """An mmpretrain classifier as ``image [B, 3, H, W] -> logits [B, num_classes]``."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(image, mode='tensor')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?', help='weights (default: random initialisation)')
    parser.add_argument('--out', required=True, help='the .onnx file to write')
    parser.add_argument('--classifier',
                        action='store_true',
                        help='export the whole mmpretrain classifier (image -> logits)')
    parser.add_argument('--shape',
                        nargs=2,
                        type=int,
                        default=(256, 320),
                        metavar=('H', 'W'),
                        help='input size the graph is traced at (default: 256 320)')
    parser.add_argument('--check-shape',
                        nargs=2,
                        type=int,
                        action='append',
                        metavar=('H', 'W'),
                        help='another input size to compare onnxruntime with PyTorch on '
                        '(repeatable; default: 224 224 and 320 256)')
    parser.add_argument('--atol',
                        type=float,
                        default=1e-4,
                        help='largest accepted max abs difference (default: 1e-4)')
    parser.add_argument('--exporter', choices=sorted(OPSET), default='torchscript',
                        help='torchscript (the default) or dynamo (torch.export based)')
    parser.add_argument('--opset', type=int, help=f'(default: {OPSET})')
    parser.add_argument(
        '--seed',
        type=int,
        default=0,
        help='seed of the random weights (without CHECKPOINT) and inputs (default: 0)')
    return parser.parse_args(argv)


def build_model(config: str,
                checkpoint: str = None,
                classifier: bool = False,
                seed: int = 0) -> Tuple[nn.Module, List[str]]:
    """The module to export and its output names; random weights are drawn after
    ``torch.manual_seed(seed)``."""
    cfg = load_config(config)
    torch.manual_seed(seed)
    if classifier:
        return ClassifierLogits(build_classifier(cfg, checkpoint)).eval(), ['logits']
    backbone = build_backbone(cfg, checkpoint)
    out_indices = getattr(backbone, 'out_indices', None)
    if out_indices is None:
        raise ValueError(f'{type(backbone).__name__} has no out_indices; cannot name its outputs')
    return backbone, [f'out{i}' for i in out_indices]


def export(model: nn.Module,
           output_names: Sequence[str],
           path: str,
           shape: Tuple[int, int],
           exporter: str = 'torchscript',
           opset: int = None) -> None:
    """Export ``model`` traced at ``[1, 3, *shape]`` with the reference ops; batch, H and W
    dynamic."""
    example = torch.zeros(1, 3, *shape)
    opset = opset or OPSET[exporter]
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with forced('reference'), torch.no_grad(), warnings.catch_warnings():
        if exporter == 'dynamo':
            torch.onnx.export(model, (example, ), path, dynamo=True, opset_version=opset,
                              input_names=['image'], output_names=list(output_names),
                              dynamic_shapes=({0: 'batch', 2: 'height', 3: 'width'}, ),
                              verbose=False)
        else:
            warnings.filterwarnings('ignore', category=torch.jit.TracerWarning)
            warnings.filterwarnings('ignore', message='You are using the legacy TorchScript-based')
            dynamic_axes = {'image': {0: 'batch', 2: 'height', 3: 'width'}}
            dynamic_axes.update({name: {0: 'batch'} for name in output_names})
            torch.onnx.export(model, (example, ), path, dynamo=False, opset_version=opset,
                              input_names=['image'], output_names=list(output_names),
                              dynamic_axes=dynamic_axes)
    import onnx
    onnx.checker.check_model(path)


def compare(model: nn.Module,
            path: str,
            shapes: Sequence[Tuple[int, int]],
            batch: int = 2,
            seed: int = 0) -> List[Dict]:
    """Max abs difference between onnxruntime and PyTorch (reference ops) per shape and output,
    on a seeded random ``[batch, 3, H, W]`` input (batch 2 by default; the trace used 1)."""
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    names = [o.name for o in session.get_outputs()]
    results = []
    for shape in shapes:
        image = torch.randn(batch, 3, *shape, generator=torch.Generator().manual_seed(seed))
        with forced('reference'), torch.no_grad():
            expected = model(image)
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        got = session.run(None, {'image': image.numpy()})
        for name, ref, out in zip(names, expected, got):
            ref = ref.numpy()
            same_shape = ref.shape == out.shape
            diff = float(np.abs(ref - out).max()) if same_shape else float('inf')
            results.append(
                dict(shape=tuple(shape),
                     output=name,
                     torch_shape=ref.shape,
                     onnx_shape=out.shape,
                     max_abs_diff=diff))
    return results


def report(results: Sequence[Dict], atol: float) -> int:
    """Print one line per compared output; 0 if every difference is within ``atol``, else 1."""
    failures = 0
    for row in results:
        ok = row['max_abs_diff'] <= atol
        failures += not ok
        print(
            f'{row["shape"][0]}x{row["shape"][1]} {row["output"]}: onnx {list(row["onnx_shape"])} '
            f'torch {list(row["torch_shape"])} max abs diff {row["max_abs_diff"]:.3g}' +
            ('' if ok else f'  > atol {atol:g}'))
    if failures:
        print(f'FAILED: {failures} output(s) differ from PyTorch by more than {atol:g}')
        return 1
    sizes = len({row['shape'] for row in results})
    print(f'OK: onnxruntime matches PyTorch within {atol:g} on {sizes} input sizes')
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    model, output_names = build_model(args.config, args.checkpoint, args.classifier, args.seed)
    export(model, output_names, args.out, tuple(args.shape), args.exporter, args.opset)
    print(f'wrote {args.out} ({osp.getsize(args.out) / 2**20:.1f} MiB; {args.exporter} exporter, '
          f'opset {args.opset or OPSET[args.exporter]}, dynamic batch/height/width, traced at '
          f'{args.shape[0]}x{args.shape[1]})')
    check_shapes = [tuple(args.shape)
                    ] + [tuple(s) for s in (args.check_shape or [(224, 224), (320, 256)])]
    return report(compare(model, args.out, check_shapes, seed=args.seed), args.atol)


if __name__ == '__main__':
    sys.exit(main())
