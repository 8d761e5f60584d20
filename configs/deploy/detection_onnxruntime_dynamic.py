# Detectors (RetinaNet, Faster R-CNN) for onnxruntime, any batch and image size.
_base_ = ['./_base_/detection.py']
onnx_config = dict(dynamic_axes=dict(
    input=dict({0: 'batch', 2: 'height', 3: 'width'}),
    dets=dict({0: 'batch', 1: 'num_dets'}),
    labels=dict({0: 'batch', 1: 'num_dets'})))
