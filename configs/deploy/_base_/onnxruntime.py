# mmdeploy's settings for an onnxruntime end-to-end model (tools/deploy.py writes end2end.onnx):
# the TorchScript exporter at opset 11 (mmdeploy's rewriters target it), the backend, and how the
# Laplacian kernel is exported (mmlinattn/deploy/mmdeploy.py): one mmlinattn::LaplacianKernel node
# for the project's onnxruntime op library. The *_standard-ops configs export it from standard
# ONNX operators instead, for an onnxruntime without the library (slower: docs/deployment.md).
onnx_config = dict(
    type='onnx',
    export_params=True,
    keep_initializers_as_inputs=False,
    opset_version=11,
    save_file='end2end.onnx',
    input_names=['input'],
    output_names=['output'],
    input_shape=None,
    optimize=True)
backend_config = dict(type='onnxruntime')
mmlinattn_export = dict(laplacian_kernel='custom_op')
