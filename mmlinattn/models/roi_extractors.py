"""mmdet's RoI extractor with a RoIAlign that is fast on the CPU. Needs mmdet; a config imports
it (``custom_imports``), ``import mmlinattn`` does not:

    custom_imports = dict(imports=['mmlinattn', 'mmlinattn.models.roi_extractors'])
    fast_roi = dict(type='mmlinattn.SingleRoIExtractor', roi_layer=dict(type='mmlinattn.RoIAlign'))
    model = dict(roi_head=dict(bbox_roi_extractor=fast_roi, mask_roi_extractor=fast_roi))

mmcv's CPU RoIAlign runs on one thread, in fp32 only, and misreads channels-last maps; on a CPU,
:class:`RoIAlign` runs :func:`mmlinattn.ops.roi_align` instead (every core, bf16 read as bf16, any
memory format), the same numbers (docs/ops/roi_align.md). On other devices, and while exporting
to ONNX (mmdeploy's symbolic), it is mmcv's RoIAlign.
"""
import torch
from mmcv import ops as mmcv_ops
from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor as MMDetSingleRoIExtractor

from ..ops import roi_align
from ..registry import MODELS

__all__ = ['RoIAlign', 'SingleRoIExtractor']


@MODELS.register_module()
class RoIAlign(mmcv_ops.RoIAlign):
    """``mmcv.ops.RoIAlign`` (same arguments) whose CPU forward and backward are
    :func:`mmlinattn.ops.roi_align` for ``pool_mode='avg'``."""

    def forward(self, input: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        if (input.device.type != 'cpu' or self.pool_mode != 'avg' or self.use_torchvision
                or torch.onnx.is_in_onnx_export()):
            return super().forward(input, rois)
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio,
                         self.aligned)



@MODELS.register_module()
class SingleRoIExtractor(MMDetSingleRoIExtractor):
    """mmdet's ``SingleRoIExtractor`` whose ``roi_layer`` may also be a layer of this plugin,
    ``dict(type='mmlinattn.RoIAlign', ...)`` (the arguments of ``mmcv.ops.RoIAlign``); other
    types are ``mmcv.ops`` names, as in mmdet."""

    def build_roi_layers(self, layer_cfg, featmap_strides) -> torch.nn.ModuleList:
        cfg = dict(layer_cfg)
        layer_type = cfg['type']
        if isinstance(layer_type, str) and layer_type.startswith('mmlinattn.'):
            layer_cls = MODELS.get(layer_type.split('.', 1)[1])
            if layer_cls is None:
                raise KeyError(f'roi_layer type {layer_type!r} is not registered by mmlinattn')
            cfg['type'] = layer_cls
        return super().build_roi_layers(cfg, featmap_strides)
