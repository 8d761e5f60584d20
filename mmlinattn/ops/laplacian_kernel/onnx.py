"""The Laplacian kernel as one ONNX node, ``mmlinattn::LaplacianKernel``, for onnxruntime.

By default an exported model computes the kernel from standard ONNX operators
(``reference.l1_distance_exportable``): every runtime runs it, slowly (a [.., N, M, 8] broadcast
per 8 channels). Inside :func:`export_as_custom_node` the TorchScript exporter
(``torch.onnx.export(..., dynamo=False)``) writes one node instead::

    out = mmlinattn::LaplacianKernel(q [B,H,N,D], k [B,H,M,D]; lambda: float) -> [B,H,N,M]
    out[b,h,i,j] = exp(-sum_c |q[b,h,i,c] - k[b,h,j,c]| / lambda)

which the project's onnxruntime op library (``ops/onnxruntime``, loaded by
:func:`mmlinattn.deploy.onnxruntime.session_options`) runs with the torch operator's CPU kernels.
Eager results do not change: the node's forward is the reference.
"""
import contextlib

import torch

from .reference import laplacian_kernel_reference

DOMAIN, OP_TYPE, OPSET = 'mmlinattn', 'LaplacianKernel', 1
_custom_node = False


@contextlib.contextmanager
def export_as_custom_node():
    """Export ``laplacian_kernel`` as one ``mmlinattn::LaplacianKernel`` node for the duration."""
    global _custom_node
    saved, _custom_node = _custom_node, True
    try:
        yield
    finally:
        _custom_node = saved


def custom_node_requested() -> bool:
    """Whether a TorchScript ONNX export is running inside :func:`export_as_custom_node`."""
    return _custom_node and torch.onnx.is_in_onnx_export()


class LaplacianKernelNode(torch.autograd.Function):
    """The reference in eager mode; one ``mmlinattn::LaplacianKernel`` node in the exported graph."""

    @staticmethod
    def forward(ctx, q, k, lam: float):
        return laplacian_kernel_reference(q, k, lam)

    @staticmethod
    def symbolic(g, q, k, lam: float):
        return g.op(f'{DOMAIN}::{OP_TYPE}', q, k, lambda_f=lam)
