"""``depthwise_conv2d``: a depthwise "same" convolution (stride 1, odd k x k kernel, zero padding
k // 2), the local branch of LaplacianFormer's and PolaFormer's attention.

Implementations: ``reference.py`` (``F.conv2d`` with ``groups = C``); the C++ operators
``torch.ops.mmlinattn.depthwise_conv2d_forward`` / ``..._backward`` (CPU: fp32, fp64, bf16; fake
kernels and autograd in ``compiled.py``), whose weight gradient is the project's own kernel:
oneDNN's is 20-50x slower than its forward on the CPU. Formulas and measurements:
``docs/ops/depthwise_conv2d.md``.
"""
from typing import Optional

import torch

from ..dispatch import choose, forward_operator, run_dtype
from ..torch_compat import autocast_dtype, autocast_enabled
from ..validation import check_same_device, check_tensor, promote, shape_str
from .reference import depthwise_conv2d_reference


def _check_args(x, weight, bias) -> None:
    check_tensor('x', x, rank=4)
    check_tensor('weight', weight, rank=4)
    channels = x.shape[1]
    size = weight.shape[-1]
    if tuple(weight.shape) != (channels, 1, size, size) or size % 2 == 0:
        raise ValueError(f'weight must be [C, 1, k, k] with C = x.shape[1] = {channels} and k odd, '
                         f'got shape [{shape_str(weight)}]')
    tensors = [('x', x), ('weight', weight)]
    if bias is not None:
        check_tensor('bias', bias, rank=1)
        if bias.shape[0] != channels:
            raise ValueError(f'bias must be [C] with C = x.shape[1] = {channels}, got shape '
                             f'[{shape_str(bias)}]')
        tensors.append(('bias', bias))
    check_same_device(*zip(*tensors))


def depthwise_conv2d(x: torch.Tensor, weight: torch.Tensor,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``out[b, c] = sum_{ky, kx} w[c, 0, ky, kx] x_pad[b, c, y + ky, x + kx] (+ bias[c])``.

    Args:
        x: [B, C, H, W] floating point, any memory format (channels-last is the fast one on the
            CPU; the output has x's format).
        weight: [C, 1, k, k], k odd; zero padding k // 2 keeps H x W.
        bias: [C] or None.

    Returns:
        [B, C, H, W]. Under autocast every input is cast to the autocast dtype, as ``F.conv2d``
        would be; otherwise mixed dtypes are promoted as in ``x + weight``.
    """
    _check_args(x, weight, bias)
    device_type = x.device.type
    tensors = (x, weight) + (() if bias is None else (bias, ))
    dtype = autocast_dtype(device_type) if autocast_enabled(device_type) else promote(*tensors)
    x, weight = x.to(dtype), weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    implementation = choose('depthwise_conv2d', device_type, dtype)
    if implementation == 'reference' or run_dtype('depthwise_conv2d', implementation, device_type,
                                                  dtype) != dtype:
        return depthwise_conv2d_reference(x, weight, bias)
    return forward_operator('depthwise_conv2d', implementation)(x, weight, bias)
