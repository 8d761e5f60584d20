# Segmentors (UperNet, Semantic FPN) for onnxruntime, any batch and image size.
_base_ = ['./_base_/segmentation.py']
onnx_config = dict(dynamic_axes=dict(
    input=dict({0: 'batch', 2: 'height', 3: 'width'}),
    output=dict({0: 'batch', 2: 'height', 3: 'width'})))
