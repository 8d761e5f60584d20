"""Shared pytest set-up. ``tests/`` is deliberately not a package: mmsegmentation's wheel installs a
top-level ``tests`` package, which an importable ``tests/__init__.py`` here would shadow. pytest.ini's
``pythonpath`` puts the checkout and ``tools/`` on ``sys.path``, so the tests import the tools' modules
as the tools do (``analysis``, ``_toy_overlay``) and the developers' ones as ``dev.*``."""
import os
import sys

import pytest

from e2e_utils import ROOT, run_checked


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


def _restore_default_scope():
    """Undo the mmengine default scope set meanwhile (``init_default_scope``, a Runner): registries
    build through the current default scope, so one left behind changes what later tests build."""
    from mmengine.registry import DefaultScope
    saved = DefaultScope._instance_dict.copy()
    yield
    DefaultScope._instance_dict = saved


# Per test, and per module for what module-scoped fixtures set (they run outside a test's own
# restore: test_configs' config walk builds each model under its library's scope).
isolated_default_scope = pytest.fixture(autouse=True)(_restore_default_scope)
isolated_module_default_scope = pytest.fixture(autouse=True, scope='module')(_restore_default_scope)


@pytest.fixture(scope='session')
def installed_wheel(tmp_path_factory):
    """mmlinattn as a user installs a release: a wheel built from the sdist (CPU kernels; the CUDA
    ones take minutes to compile), installed with ``pip --target`` into a folder outside the checkout.
    Returns ``(site, build log)``; put ``site`` first on ``PYTHONPATH`` to use it. Built once per
    test run: pytest-xdist's workers share the run's temporary root, and a lock there."""
    if 'PYTEST_XDIST_WORKER' not in os.environ:
        return _build_and_install_wheel(tmp_path_factory.mktemp('wheel'))
    from filelock import FileLock
    tmp = tmp_path_factory.getbasetemp().parent / 'wheel'
    with FileLock(f'{tmp}.lock'):
        if not (tmp / 'build.log').exists():
            tmp.mkdir(exist_ok=True)
            _build_and_install_wheel(tmp)
    return tmp / 'site', (tmp / 'build.log').read_text()


def _build_and_install_wheel(tmp):
    env = dict(os.environ, MAX_JOBS=os.environ.get('MAX_JOBS', '2'))
    env.pop('PYTHONPATH', None)
    env.pop('FORCE_CUDA', None)
    dist, wheels, site = tmp / 'dist', tmp / 'wheels', tmp / 'site'
    run_checked([sys.executable, 'setup.py', '-q', 'egg_info', '--egg-base', str(tmp),
                 'sdist', '--dist-dir', str(dist)], cwd=ROOT, env=env)
    sdist, = dist.glob('mmlinattn-*.tar.gz')
    log = run_checked([sys.executable, '-m', 'pip', 'wheel', '-v', '--no-build-isolation', '--no-deps',
                       '-w', str(wheels), str(sdist)], cwd=tmp, env=env)
    wheel, = wheels.glob('mmlinattn-*.whl')
    run_checked([sys.executable, '-m', 'pip', 'install', '--no-deps', '--target', str(site), str(wheel)],
                cwd=tmp, env=env)
    (tmp / 'build.log').write_text(log)
    return site, log
