# classification_onnxruntime_dynamic.py with the Laplacian kernel in standard ONNX operators: runs in any
# onnxruntime, without the project's op library (slower: docs/deployment.md).
_base_ = ['./classification_onnxruntime_dynamic.py']
mmlinattn_export = dict(laplacian_kernel='standard_ops')
