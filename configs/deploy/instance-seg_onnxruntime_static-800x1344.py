# Mask R-CNN for onnxruntime at a fixed 800x1344 input (height x width).
_base_ = ['./_base_/instance_seg.py']
onnx_config = dict(input_shape=[1344, 800])
