"""Deployment with OpenMMLab's mmdeploy into onnxruntime (``tools/deploy.py``,
``tools/deploy_test.py``, ``configs/deploy/``, docs/deployment.md).

- :mod:`.onnxruntime`: the project's onnxruntime custom-op library and session options that load it.
- :mod:`.mmdeploy`: what mmdeploy 1.3 needs to export and run this project's models on torch >= 2.9,
  as context managers that the tools enter; importing changes nothing.
"""
