# Classifiers for onnxruntime at a fixed 224x224 input (ImageNet's test size).
_base_ = ['./_base_/classification.py']
onnx_config = dict(input_shape=[224, 224])
