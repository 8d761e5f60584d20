"""Parameters and FLOPs of the model of any mmdet / mmseg / mmpretrain config, custom ops counted.

    python tools/get_flops.py configs/laplacianformer_medium_8xb128_in1k.py [--shape 224 224]

Convention (mmengine's FlopAnalyzer, i.e. fvcore, as in the Swin / PVT / SOFT papers): one
multiply-add is one FLOP; element-wise ops (activations, exp, softmax, additions) are not counted;
normalisation layers are. The custom ops, traced either as their compiled ``autograd.Function``
(``prim::PythonOp.<Function>``) or as their reference implementation, are counted alike:

- ``laplacian_kernel`` q [.., N, D] against k [.., M, D]: ``N*M*D``, one |q - k| accumulation per
  term, the unit of a multiply-add (counting subtract, abs and add separately would be 3x this;
  the by-operator breakdown shows the term so either convention can be read off).
- ``newton_schulz_inverse`` of [.., M, M] with ``iters`` steps: ``iters * 2 * M^3`` (two M x M
  products per step). The reference path's products are traced as ``aten::matmul`` and counted by
  the default matmul handle, to the same total.
- ``polarity_linear_attention`` q [.., N, d], k [.., n, d], v [.., n, dv]: the products of the
  reference, ``2*n*d*dv`` (the two [2d, dv/2] key-value states) ``+ 2*N*d*dv`` (queries against
  them) ``+ 4*N*d`` (the two normalisers), per batch and head; powers and the key mean are
  element-wise and not counted.

Add a custom op by adding its trace names to ``OP_HANDLES`` (handle signature: jit input values,
jit output values -> Counter of FLOPs by op name).

Detectors are traced through ``mode='tensor'`` (backbone, neck, RPN with its proposals, RoI heads),
segmentors and classifiers likewise; the data preprocessor (normalisation) is not counted.
"""
import argparse
import importlib
import os.path as osp
from collections import Counter
from math import prod
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import get_shape
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope
from torch import nn

Handle = Callable[[List[Any], List[Any]], Counter]
DEFAULT_SHAPES = {'mmpretrain': (224, 224), 'mmseg': (512, 512), 'mmdet': (800, 1333)}


def _tensor_shapes(values) -> List[List[int]]:
    return [shape for shape in (get_shape(v) for v in values) if shape is not None]


def laplacian_kernel_flops(inputs: List[Any], outputs: List[Any]) -> Counter:
    """q [.., N, D], k [.., M, D] -> out [.., N, M]: ``prod(out) * D``."""
    q_shape = _tensor_shapes(inputs)[0]
    return Counter({'laplacian_kernel': prod(_tensor_shapes(outputs)[0]) * q_shape[-1]})


def newton_schulz_flops(inputs: List[Any], outputs: List[Any]) -> Counter:
    """a [.., M, M] with ``iters`` steps (the op's first non-tensor argument): ``iters * 2 * M^3``."""
    a_shape = _tensor_shapes(inputs)[0]
    node = outputs[0].node()
    scalars = node.scalar_args() if node.kind() == 'prim::PythonOp' else [
        v.toIValue() for v in inputs if get_shape(v) is None]
    iters = int(next(s for s in scalars if isinstance(s, int) and not isinstance(s, bool)))
    batch = prod(a_shape[:-2])
    return Counter({'newton_schulz_inverse': iters * 2 * batch * a_shape[-1]**3})


def polarity_linear_attention_flops(inputs: List[Any], outputs: List[Any]) -> Counter:
    """q [.., N, d], k [.., n, d], v [.., n, dv]: ``batch * (2*n*d*dv + 2*N*d*dv + 4*N*d)``."""
    q_shape, k_shape, v_shape = _tensor_shapes(inputs)[:3]
    num_q, head_dims, num_kv, value_dims = q_shape[-2], q_shape[-1], k_shape[-2], v_shape[-1]
    per_head = (2 * num_kv * head_dims * value_dims + 2 * num_q * head_dims * value_dims
                + 4 * num_q * head_dims)
    return Counter({'polarity_linear_attention': prod(q_shape[:-2]) * per_head})


def depthwise_conv2d_flops(inputs: List[Any], outputs: List[Any]) -> Counter:
    """x [B, C, H, W], weight [C, 1, k, k]: ``B*C*H*W*k*k``, mmengine's count of the same conv."""
    x_shape, w_shape = _tensor_shapes(inputs)[:2]
    return Counter({'conv': prod(x_shape) * w_shape[-2] * w_shape[-1]})


# trace name -> handle. Compiled ops appear as their autograd.Function (prim::PythonOp.<name>)
# or, when called directly, as mmlinattn::<op>; reference paths as the aten ops they use.
OP_HANDLES: Dict[str, Handle] = {
    'prim::PythonOp.LaplacianKernelFunction': laplacian_kernel_flops,
    'mmlinattn::laplacian_kernel_forward': laplacian_kernel_flops,
    'aten::cdist': laplacian_kernel_flops,  # the reference laplacian_kernel (p=1 distances)
    'prim::PythonOp.NewtonSchulzFunction': newton_schulz_flops,
    'mmlinattn::newton_schulz_inverse': newton_schulz_flops,
    'prim::PythonOp._PolarityLinearAttention': polarity_linear_attention_flops,
    'mmlinattn::polarity_linear_attention_forward': polarity_linear_attention_flops,
    'mmlinattn::depthwise_conv2d_forward': depthwise_conv2d_flops,
}


class TensorModeModel(nn.Module):
    """``forward(images)`` -> the model's raw outputs in ``mode='tensor'`` (traceable)."""

    def __init__(self, model: nn.Module, data_samples=None):
        super().__init__()
        self.model = model
        self.data_samples = data_samples

    def forward(self, images: torch.Tensor):
        return self.model(images, self.data_samples, mode='tensor')


def build_model(cfg: Config) -> nn.Module:
    scope = cfg.get('default_scope')
    if scope not in DEFAULT_SHAPES:
        raise SystemExit(f'error: default_scope must be one of {sorted(DEFAULT_SHAPES)}, got {scope!r}')
    init_default_scope(scope)
    import mmlinattn  # noqa: F401  (registers the backbones; configs also import it)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    return registry.build(cfg.model)


def detection_samples(height: int, width: int, batch: int) -> list:
    from mmdet.structures import DetDataSample
    meta = dict(img_shape=(height, width), ori_shape=(height, width), pad_shape=(height, width),
                batch_input_shape=(height, width), scale_factor=(1.0, 1.0))
    return [DetDataSample(metainfo=meta) for _ in range(batch)]


def analyse(cfg: Config, shape: Tuple[int, int], batch: int = 1) -> Tuple[nn.Module, FlopAnalyzer]:
    """The model (eval mode) and its FLOP analyser for a ``batch x 3 x H x W`` input."""
    model = build_model(cfg).eval()
    samples = detection_samples(*shape, batch) if cfg.default_scope == 'mmdet' else None
    images = torch.randn(batch, 3, *shape)
    analyzer = FlopAnalyzer(TensorModeModel(model, samples), (images, ))
    analyzer.set_op_handle(**OP_HANDLES)
    analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings('none')
    return model, analyzer


def parameter_counts(model: nn.Module) -> Dict[str, int]:
    counts = {'': sum(p.numel() for p in model.parameters())}
    for name, child in model.named_children():
        counts[name] = sum(p.numel() for p in child.parameters())
    return counts


def report(cfg_path: str, model: nn.Module, analyzer: FlopAnalyzer, shape: Sequence[int]) -> str:
    params = parameter_counts(model)
    flops_by_module = analyzer.by_module()
    lines = [f'config: {cfg_path}', f'input: 1x3x{shape[0]}x{shape[1]}',
             f'params: {params[""] / 1e6:.2f} M', f'FLOPs: {analyzer.total() / 1e9:.3f} G',
             '', f'{"module":<24}{"params (M)":>12}{"GFLOPs":>10}']
    for name in params:
        if name:
            lines.append(f'{name:<24}{params[name] / 1e6:>12.2f}'
                         f'{flops_by_module.get("model." + name, 0) / 1e9:>10.3f}')
    lines += ['', f'{"operator":<24}{"GFLOPs":>10}']
    for op, count in analyzer.by_operator().most_common():
        lines.append(f'{op:<24}{count / 1e9:>10.3f}')
    unsupported = analyzer.unsupported_ops()
    if unsupported:
        lines += ['', 'not counted (element-wise or unknown): ' +
                  ', '.join(f'{op} x{n}' for op, n in sorted(unsupported.items()))]
    return '\n'.join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='mmdet / mmseg / mmpretrain config file')
    parser.add_argument('--shape', type=int, nargs='+',
                        help='input H W (or one size for both); default 224x224 (mmpretrain), '
                        '512x512 (mmseg), 800x1333 (mmdet)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not osp.isfile(args.config):
        raise SystemExit(f'error: config file {args.config!r} does not exist')
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.shape is None:
        shape = DEFAULT_SHAPES.get(cfg.get('default_scope'), (224, 224))
    elif len(args.shape) in (1, 2):
        shape = (args.shape[0], args.shape[-1])
    else:
        raise SystemExit(f'error: --shape takes H W or one size, got {args.shape}')
    model, analyzer = analyse(cfg, shape)
    with torch.no_grad():
        print(report(args.config, model, analyzer, shape))


if __name__ == '__main__':
    main()
