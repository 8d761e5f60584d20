# Every config of this project inherits the plugin, so the stock train/test scripts of mmdet, mmseg and
# mmpretrain find the `mmlinattn.*` backbones (the import registers them and changes nothing else).
custom_imports = dict(imports=['mmlinattn'], allow_failed_imports=False)
# The configs that inherit this file and a library's default_runtime (mmengine refuses a key that two
# bases define) set `default_hooks = dict(safe_checkpoint_loading={{_base_.safe_checkpoint_loading_hook}})`:
# the runner then loads checkpoints (load_from, --resume) with mmlinattn's policy, tensors and plain
# data only. Trusting a file that runs code:
# --cfg-options default_hooks.safe_checkpoint_loading.unsafe_trust_checkpoint=True
safe_checkpoint_loading_hook = dict(type='mmlinattn.SafeCheckpointLoadingHook')
