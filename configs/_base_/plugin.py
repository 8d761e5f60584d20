# Every config of this project imports the plugin, so the stock train/test scripts of mmdet, mmseg and
# mmpretrain find the `mmlinattn.*` backbones and the checkpoint-loading fix.
custom_imports = dict(imports=['mmlinattn'], allow_failed_imports=False)
