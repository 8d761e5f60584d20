"""The package as a user installs it: the shipped configs are found by name; the build ships the user's
tools and not the developers' (``tools/dev``), and mim's model index next to the configs; and a wheel
built from the sdist, installed outside the checkout, carries the compiled ops, the configs, the model
index and the user's tools, declares what ``import mmlinattn`` imports, and serves a config of the
user's own that inherits ours by path (mmengine 0.10 rejects ``_base_ = ['mmlinattn::...']``; README,
"Using the backbones in your own config")."""
import glob
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from e2e_utils import run_checked as _run
from mmlinattn.configs import config_dir, config_path, list_configs
from test_model_index import check_model_index

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_config_path_finds_every_shipped_config():
    names = list_configs()
    assert names == sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, 'configs', '*.py')))
    path = config_path('mask_rcnn_laplacian_tiny_1x_coco')
    assert os.path.isabs(path) and os.path.samefile(
        path, os.path.join(ROOT, 'configs', 'mask_rcnn_laplacian_tiny_1x_coco.py'))
    assert os.path.samefile(config_path('_base_/plugin.py'), os.path.join(config_dir(), '_base_', 'plugin.py'))


@pytest.mark.parametrize('name, message', [
    ('mask_rcnn_laplacian_huge_1x_coco.py', "no config 'mask_rcnn_laplacian_huge_1x_coco.py'"),
    ('../setup.py', 'must be relative to the config folder'),
    ('', 'must be a config file name'),
])
def test_config_path_rejects_bad_names(name, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        config_path(name)


USER_TOOLS = ('train.py', 'test.py', 'dist_train.sh', 'dist_test.sh', 'get_flops.py',
              'convert_checkpoint.py', 'export_onnx.py', 'visualize_attention.py', 'benchmark.py', 'misc')


def check_ships_user_tools_only(mim):
    """``mim/tools``: the user's commands and the modules they import, i.e. tools/ without tools/dev."""
    tools = mim / 'tools'
    shipped = sorted(p.name for p in tools.iterdir() if p.name != '__pycache__')  # pip compiles
    assert set(USER_TOOLS) <= set(shipped), shipped
    assert (tools / 'misc' / 'download_dataset.py').is_file()  # a folder entry of MIM_TOOLS ships whole
    tools_dir = os.path.join(ROOT, 'tools')
    assert shipped == sorted(n for n in os.listdir(tools_dir) if n not in ('dev', '__pycache__'))
    dev_names = {n for _, dirs, files in os.walk(os.path.join(tools_dir, 'dev')) for n in dirs + files
                 if n not in ('__init__.py', '__pycache__')}
    leaked = [str(p) for p in tools.rglob('*') if p.name in dev_names]
    assert not leaked, leaked  # run_tests.sh, setup_env.sh, gpu_check.sh, benchmarks/, toy_data/, ...


def check_ships_model_index(mim):
    """``mim/model-index.yml`` (where ``mim search`` reads it), a copy, with the metafiles it imports
    and every model's config beside it, as in the checkout."""
    index = mim / 'model-index.yml'
    assert index.is_file() and not index.is_symlink(), index
    assert sorted(p.name for p in (mim / 'configs' / 'metafiles').glob('*.yml')) == sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(ROOT, 'configs', 'metafiles', '*.yml')))
    _, models = check_model_index(str(mim))
    assert len(models) == len(list_configs())


def test_build_ships_the_user_tools_and_not_the_developers(tmp_path):
    """setup.py's build_py, as a wheel or ``pip install .`` runs it: ``.mim/tools`` holds the user's tools
    and ``.mim/model-index.yml`` mim's model index; the tools run from there (train.py's options), and
    benchmark.py, whose cases stay in the checkout, says so."""
    env = dict(os.environ, MMLINATTN_SKIP_EXT='1')
    env.pop('PYTHONPATH', None)
    _run([sys.executable, 'setup.py', '-q', 'build_py', '--build-lib', str(tmp_path)], cwd=ROOT, env=env)
    mim = tmp_path / 'mmlinattn' / '.mim'
    check_ships_user_tools_only(mim)
    assert (mim / 'configs' / 'mask_rcnn_laplacian_tiny_1x_coco.py').is_file()
    check_ships_model_index(mim)
    assert '--toy-data' in _run([sys.executable, mim / 'tools' / 'train.py', '--help'], cwd=tmp_path, env=env)
    assert '--archive' in _run([sys.executable, mim / 'tools' / 'misc' / 'download_dataset.py', '--help'],
                               cwd=tmp_path, env=env)
    proc = subprocess.run([sys.executable, mim / 'tools' / 'benchmark.py', 'ops'], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode != 0 and 'runs from a checkout' in proc.stdout, proc.stdout[-2000:]
    assert 'tools/dev/benchmarks/' in proc.stdout


# Runs from the user's folder with only the installed wheel on PYTHONPATH (torch, mmcv, mmdet come
# from the interpreter's environment); MMLINATTN_OPS=compiled makes a missing kernel an error.
USER_SCRIPT = textwrap.dedent('''
    import importlib.metadata
    import os
    import sys

    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    site = sys.argv[1]
    requires = importlib.metadata.requires('mmlinattn')
    assert any(r.startswith('mmcv') for r in requires), requires
    assert any(r.startswith('mmengine') for r in requires), requires

    assert Config.fromfile('my_mask_rcnn_abs.py').model == Config.fromfile('my_mask_rcnn.py').model
    assert Config.fromfile('my_read_base.py').model.to_dict() == \
        Config.fromfile('my_mask_rcnn.py').model.to_dict()  # read_base() from the installed package
    cfg = Config.fromfile('my_mask_rcnn.py')
    assert cfg.model.backbone.type == 'mmlinattn.LaplacianFormer', cfg.model.backbone
    assert cfg.model.backbone.drop_path_rate == 0.2  # the user's override
    assert cfg.default_scope == 'mmdet' and cfg.custom_imports.imports == ['mmlinattn']

    import mmlinattn
    import mmlinattn._ext
    for module in (mmlinattn, mmlinattn._ext):
        assert os.path.realpath(module.__file__).startswith(site), module.__file__
    init_default_scope('mmdet')
    from mmdet.registry import MODELS
    model = MODELS.build(cfg.model).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        feats = model.backbone(torch.randn(1, 3, 96, 160))
    shapes = [tuple(f.shape) for f in feats]
    assert shapes == [(1, 64, 24, 40), (1, 128, 12, 20), (1, 320, 6, 10), (1, 512, 3, 5)], shapes
    assert all(torch.isfinite(f).all() for f in feats)
    print('extension:', mmlinattn.ops.extension_status())
''')


@pytest.mark.slow
def test_wheel_installed_outside_checkout_serves_user_config(installed_wheel, tmp_path):
    site, log = installed_wheel
    env = dict(os.environ, MAX_JOBS=os.environ.get('MAX_JOBS', '2'))
    env.pop('PYTHONPATH', None)
    major_minor = tuple(int(p) for p in re.match(r'(\d+)\.(\d+)', torch.__version__).groups())
    std = '-std=c++20' if major_minor >= (2, 14) else '-std=c++17'  # what the torch headers require
    compile_lines = [line for line in log.splitlines() if ' -c ' in line and 'ops/csrc' in line]
    assert compile_lines and all(std in line for line in compile_lines), compile_lines[:1]
    user = tmp_path / 'user'

    mim = site / 'mmlinattn' / '.mim'
    shipped = mim / 'configs' / 'mask_rcnn_laplacian_tiny_1x_coco.py'
    assert shipped.is_file() and not shipped.is_symlink() and not (mim / 'configs').is_symlink()
    assert (mim / 'configs' / '_base_' / 'plugin.py').is_file()
    assert (site / 'mmlinattn' / 'configs' / shipped.name).is_file()  # the resolved form, for read_base()
    check_ships_user_tools_only(mim)
    check_ships_model_index(mim)

    user.mkdir()
    user_env = dict(env, PYTHONPATH=str(site), MMLINATTN_OPS='compiled')
    folder = _run([sys.executable, '-m', 'mmlinattn.configs', '--dir'], cwd=user, env=user_env).strip()
    assert os.path.samefile(folder, mim / 'configs')
    (user / 'mmlinattn_configs').symlink_to(folder)
    (user / 'my_mask_rcnn.py').write_text(
        "_base_ = ['./mmlinattn_configs/mask_rcnn_laplacian_tiny_1x_coco.py']\n"
        "model = dict(backbone=dict(drop_path_rate=0.2))\n")
    shipped_path = _run([sys.executable, '-m', 'mmlinattn.configs', shipped.name], cwd=user, env=user_env)
    (user / 'my_mask_rcnn_abs.py').write_text(
        f"_base_ = [{shipped_path.strip()!r}]\nmodel = dict(backbone=dict(drop_path_rate=0.2))\n")
    (user / 'my_read_base.py').write_text(
        'from mmengine.config import read_base\n'
        'with read_base():\n'
        '    from mmlinattn.configs.mask_rcnn_laplacian_tiny_1x_coco import *\n'
        'model.backbone.drop_path_rate = 0.2\n')
    (user / 'check.py').write_text(USER_SCRIPT)
    out = _run([sys.executable, 'check.py', str(os.path.realpath(site))], cwd=user, env=user_env)
    assert 'extension: compiled (CPU' in out, out[-2000:]
