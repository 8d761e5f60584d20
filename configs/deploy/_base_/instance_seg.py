# mmdet instance segmentation (Mask R-CNN): boxes, labels and per-box masks at the mask head's
# 28x28 (pasted into the image outside the graph, as mmdet does). Opset 16: ONNX's RoiAlign gains
# coordinate_transformation_mode='half_pixel', mmcv's aligned=True; at opset 11 mmdeploy shifts the
# boxes instead, and the masks came out up to 0.48 (in probability) off mmcv's on the balloon photos,
# 0.04 at opset 16 (docs/deployment.md).
_base_ = ['./detection.py']
onnx_config = dict(output_names=['dets', 'labels', 'masks'], opset_version=16)
codebase_config = dict(post_processing=dict(export_postprocess_mask=False))
