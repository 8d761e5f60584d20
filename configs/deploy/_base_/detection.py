# mmdet detectors: boxes and labels out, mmdeploy's NMS inside the graph (mmdet's test_cfg values).
_base_ = ['./onnxruntime.py']
onnx_config = dict(output_names=['dets', 'labels'])
codebase_config = dict(
    type='mmdet',
    task='ObjectDetection',
    model_type='end2end',
    post_processing=dict(
        score_threshold=0.05,
        confidence_threshold=0.005,
        iou_threshold=0.5,
        max_output_boxes_per_class=200,
        pre_top_k=5000,
        keep_top_k=100,
        background_label_id=-1))
