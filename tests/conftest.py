"""Shared pytest set-up. ``tests/`` is deliberately not a package: mmsegmentation's wheel installs a
top-level ``tests`` package, which an importable ``tests/__init__.py`` here would shadow. pytest.ini's
``pythonpath`` puts the checkout and ``tools/`` on ``sys.path``, so the tests import the tools' modules
as the tools do (``analysis``, ``_toy_overlay``) and the developers' ones as ``dev.*``."""
import pytest


def needs_compiled_ops(item) -> bool:
    """A test of the compiled operators: it uses the ``compiled_ops`` fixture, carries the
    ``compiled_ops`` marker or runs with a parameter ``'compiled'`` (MMLINATTN_OPS modes)."""
    params = getattr(item, 'callspec', None)
    values = params.params.values() if params else ()
    return ('compiled_ops' in item.fixturenames or 'compiled_ops' in item.keywords
            or any(isinstance(value, str) and value == 'compiled' for value in values))


def pytest_collection_modifyitems(config, items):
    import torch
    from mmlinattn.ops.torch_compat import missing_library_api
    skips = []
    if not torch.cuda.is_available():
        skips.append((lambda item: 'cuda' in item.keywords,
                      pytest.mark.skip(reason='needs a CUDA device')))
    too_old = missing_library_api()  # not a build problem: such a torch runs the references by design
    if too_old:
        skips.append((needs_compiled_ops,
                      pytest.mark.skip(reason=f'needs the compiled operators: {too_old}')))
    for item in items:
        for applies, skip in skips:
            if applies(item):
                item.add_marker(skip)


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
