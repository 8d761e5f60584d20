# mmseg segmentors: the class map (argmax inside the graph) at the input's size.
_base_ = ['./onnxruntime.py']
codebase_config = dict(type='mmseg', task='Segmentation', with_argmax=True)
