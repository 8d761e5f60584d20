# Every config of this project imports the plugin, so the stock train/test scripts of mmdet, mmseg and
# mmpretrain find the `mmlinattn.*` backbones (the import registers them and changes nothing else).
custom_imports = dict(imports=['mmlinattn'], allow_failed_imports=False)
