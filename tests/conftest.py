"""Shared pytest set-up. ``tests/`` is deliberately not a package: mmsegmentation's wheel installs a
top-level ``tests`` package, which an importable ``tests/__init__.py`` here would shadow. The tools'
modules (``tools/toy_data``, ``tools/analysis``) are imported by the tests as the tools import them."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, 'tools')):  # the checkout's package; the tools' own modules
    if path not in sys.path:
        sys.path.insert(0, path)


def pytest_collection_modifyitems(config, items):
    import torch
    if torch.cuda.is_available():
        return
    skip_cuda = pytest.mark.skip(reason='needs a CUDA device')
    for item in items:
        if 'cuda' in item.keywords:
            item.add_marker(skip_cuda)
