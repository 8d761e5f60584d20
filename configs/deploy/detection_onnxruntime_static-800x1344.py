# Detectors for onnxruntime at a fixed 800x1344 input (height x width): the position embeddings are
# resized once, while exporting, and the graph holds no Resize for them.
_base_ = ['./_base_/detection.py']
onnx_config = dict(input_shape=[1344, 800])
