"""Pure-PyTorch reference of ``depthwise_conv2d``: ``F.conv2d`` with ``groups = C``, differentiable
by autograd. It is the tests' ground truth and what runs where the op has no kernel (CUDA, where
cuDNN's depthwise gradients are fast; the ONNX exporters)."""
from typing import Optional

import torch
import torch.nn.functional as F


def depthwise_conv2d_reference(x: torch.Tensor, weight: torch.Tensor,
                               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [B, C, H, W], weight [C, 1, k, k] (k odd), bias [C] or None -> [B, C, H, W]."""
    return F.conv2d(x, weight, bias, padding=weight.shape[-1] // 2, groups=x.shape[1])
