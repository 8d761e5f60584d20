# Segmentors for onnxruntime at a fixed 512x512 input (ADE20K's crop size).
_base_ = ['./_base_/segmentation.py']
onnx_config = dict(input_shape=[512, 512])
