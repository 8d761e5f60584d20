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


@pytest.fixture
def compiled_ops(monkeypatch):
    """``torch.ops.mmlinattn`` with the extension loaded (fails if it is not built), under
    ``MMLINATTN_OPS=compiled`` so that no test of a compiled kernel silently runs the reference."""
    import torch
    from mmlinattn.ops import dispatch
    assert dispatch.extension_loaded(), dispatch.extension_status()
    monkeypatch.setenv('MMLINATTN_OPS', 'compiled')
    return torch.ops.mmlinattn


@pytest.fixture(autouse=True)
def isolated_default_scope():
    """Undo the mmengine default scope a test sets (``init_default_scope``, a Runner): registries
    build through the current default scope, so one left behind changes what later tests build."""
    from mmengine.registry import DefaultScope
    saved = DefaultScope._instance_dict.copy()
    yield
    DefaultScope._instance_dict = saved
