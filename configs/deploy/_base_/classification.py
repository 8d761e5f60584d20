# mmpretrain classifiers: the class scores.
_base_ = ['./onnxruntime.py']
codebase_config = dict(type='mmpretrain', task='Classification')
