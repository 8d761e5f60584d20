"""``roi_align``: mmcv's ``RoIAlign`` with average pooling (torchvision's ``roi_align``), the RoI
feature extractor of the two-stage detectors.

Implementations: ``reference.py`` (pure PyTorch, one roi at a time); the C++ operators
``torch.ops.mmlinattn.roi_align_forward`` / ``..._backward`` (CPU: fp32, fp64, bf16; fake kernels
and autograd in ``compiled.py``), parallel over rois and channels. mmcv's CPU kernel runs on one
thread and in fp32 only. Formulas and measurements: ``docs/ops/roi_align.md``.
"""
import numbers
from typing import Tuple, Union

import torch

from ..dispatch import choose, forward_operator, run_dtype
from ..validation import check_positive_finite, check_same_device, check_tensor, shape_str
from .reference import roi_align_reference


def _output_size(output_size) -> Tuple[int, int]:
    size = (output_size, output_size) if isinstance(output_size, numbers.Integral) else output_size
    if (not isinstance(size, (tuple, list)) or len(size) != 2
            or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s > 0
                       for s in size)):
        raise ValueError(f'output_size must be a positive int or a pair of them, got '
                         f'{output_size!r}')
    return int(size[0]), int(size[1])


def _check_args(input, rois, spatial_scale, sampling_ratio, aligned) -> None:
    check_tensor('input', input, rank=4)
    check_tensor('rois', rois, rank=2)
    if rois.shape[1] != 5:
        raise ValueError(f'rois must be [K, 5] (batch index, x1, y1, x2, y2), got shape '
                         f'[{shape_str(rois)}]')
    check_same_device(('input', 'rois'), (input, rois))
    check_positive_finite('spatial_scale', spatial_scale)
    if (not isinstance(sampling_ratio, numbers.Integral) or isinstance(sampling_ratio, bool)
            or sampling_ratio < 0):
        raise ValueError(f'sampling_ratio must be an int >= 0 (0: ceil(bin size) samples per '
                         f'side), got {sampling_ratio!r}')
    if not isinstance(aligned, bool):
        raise ValueError(f'aligned must be a bool, got {aligned!r}')


def roi_align(input: torch.Tensor, rois: torch.Tensor, output_size: Union[int, Tuple[int, int]],
              spatial_scale: float = 1.0, sampling_ratio: int = 0,
              aligned: bool = True) -> torch.Tensor:
    """``out[k, c, py, px] = 1 / (gh gw) sum_{iy, ix} bilinear(input[b_k, c], y(py, iy), x(px, ix))``.

    Args:
        input: [B, C, H, W] floating point, any memory format.
        rois: [K, 5] (batch index, x1, y1, x2, y2) in the image's pixels; any floating dtype (the
            coordinates are read in fp32, fp64 for an fp64 input). The batch indices must be in
            [0, B) (the kernel raises IndexError otherwise).
        output_size: (ph, pw), or one int for both.
        spatial_scale: feature-map pixels per image pixel (1 / the stride).
        sampling_ratio: samples per bin side; 0 takes ceil(bin size), as mmcv.
        aligned: shift the roi by half a pixel (mmcv's default; False is the legacy mode).

    Returns:
        [K, C, ph, pw] in input's dtype; the gradient flows to input, not to rois.
    """
    pooled = _output_size(output_size)
    _check_args(input, rois, spatial_scale, sampling_ratio, aligned)
    device_type, dtype = input.device.type, input.dtype
    implementation = choose('roi_align', device_type, dtype)
    kernel_dtype = None if implementation == 'reference' else run_dtype(
        'roi_align', implementation, device_type, dtype)
    if kernel_dtype is None:
        return roi_align_reference(input, rois, pooled, spatial_scale, sampling_ratio, aligned)
    out = forward_operator('roi_align', implementation)(input.to(kernel_dtype), rois, *pooled,
                                                        float(spatial_scale), int(sampling_ratio),
                                                        aligned)
    return out.to(dtype)
