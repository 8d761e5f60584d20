"""Pure-PyTorch reference of ``roi_align``: mmcv's ``RoIAlign`` (``pool_mode='avg'``), one roi at
a time, differentiable by autograd. It is the tests' ground truth and what runs where the op has no
kernel. It reads the rois on the host (their sampling grids set the shapes)."""
import math
from typing import Tuple

import torch

from ..validation import compute_dtype


def _axis_taps(start: float, bin_size: float, bins: int, grid: int, size: int, dtype):
    """Indices and weights [bins, grid] of the two neighbours of each sample along one axis:
    sample i of bin b at ``start + b * bin + (i + 0.5) * bin / grid``; 0 weight outside
    [-1, size]; clamped to [0, size - 1] as mmcv's ``bilinear_interpolate``."""
    offsets = torch.arange(bins, dtype=dtype)[:, None] * bin_size
    v = start + offsets + (torch.arange(grid, dtype=dtype)[None] + 0.5) * bin_size / grid
    inside = ((v >= -1) & (v <= size)).to(dtype)
    v = v.clamp(min=0)
    low = v.floor().long()
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low)
    high = torch.where(at_edge, size - 1, low + 1)
    frac = torch.where(at_edge, torch.zeros_like(v), v - low.to(dtype))
    return low, high, (1 - frac) * inside, frac * inside


def _grid(roi_size: float, bins: int, sampling_ratio: int) -> int:
    return sampling_ratio if sampling_ratio > 0 else max(math.ceil(roi_size / bins), 0)


def roi_align_reference(input: torch.Tensor, rois: torch.Tensor, output_size: Tuple[int, int],
                        spatial_scale: float = 1.0, sampling_ratio: int = 0,
                        aligned: bool = True) -> torch.Tensor:
    """input [B, C, H, W], rois [K, 5] (batch index, x1, y1, x2, y2 in input pixels /
    spatial_scale) -> [K, C, ph, pw]: each bin the mean of gh x gw bilinear samples
    (gh = sampling_ratio, or ceil(roi height / ph) when it is 0)."""
    pooled_h, pooled_w = output_size
    dtype = compute_dtype(input.dtype)
    feats = input.to(dtype)
    _, channels, height, width = input.shape
    offset = 0.5 if aligned else 0.0
    outputs = []
    for batch, x1, y1, x2, y2 in rois.double().tolist():
        start_x, start_y = x1 * spatial_scale - offset, y1 * spatial_scale - offset
        roi_w, roi_h = x2 * spatial_scale - offset - start_x, y2 * spatial_scale - offset - start_y
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        grid_h = _grid(roi_h, pooled_h, sampling_ratio)
        grid_w = _grid(roi_w, pooled_w, sampling_ratio)
        if height == 0 or width == 0 or grid_h == 0 or grid_w == 0:
            outputs.append(feats.new_zeros(channels, pooled_h, pooled_w))
            continue
        y_low, y_high, wy_low, wy_high = _axis_taps(start_y, roi_h / pooled_h, pooled_h, grid_h,
                                                    height, dtype)
        x_low, x_high, wx_low, wx_high = _axis_taps(start_x, roi_w / pooled_w, pooled_w, grid_w,
                                                    width, dtype)
        image = feats[int(batch)]
        samples = 0
        for ys, wy in ((y_low, wy_low), (y_high, wy_high)):
            for xs, wx in ((x_low, wx_low), (x_high, wx_high)):
                # [C, ph, gh, pw, gw]
                taps = image[:, ys[:, :, None, None], xs[None, None]]
                samples = samples + wy[:, :, None, None] * wx[None, None] * taps
        outputs.append(samples.sum((2, 4)) / max(grid_h * grid_w, 1))
    if not outputs:
        return input.new_zeros(0, channels, pooled_h, pooled_w)
    return torch.stack(outputs).to(input.dtype)
