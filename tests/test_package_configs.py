"""The resolved configs in ``mmlinattn/configs/`` (what ``read_base()`` imports) equal their sources in
``configs/``, and a config outside the repo inherits one through the installed package."""
import os
import subprocess
import sys
import textwrap

import pytest
from mmengine.config import Config

from dev.generate_configs import TARGET_DIR, generated_path, source_configs
from e2e_utils import load_config

SOURCES = source_configs()


def test_every_config_has_its_generated_form_and_no_other():
    generated = {f[:-3] for f in os.listdir(TARGET_DIR)
                 if f.endswith('.py') and not f.startswith('__')}
    assert len(SOURCES) == 31
    assert generated == set(SOURCES), 'run python tools/dev/generate_configs.py'


@pytest.mark.parametrize('name', sorted(SOURCES))
def test_generated_config_equals_its_source(name):
    source = load_config(SOURCES[name]).to_dict()
    generated = Config.fromfile(generated_path(name)).to_dict()
    assert generated == source, f'{name}: run python tools/dev/generate_configs.py'


USER_CONFIG = '''
from mmengine.config import read_base

with read_base():
    from mmlinattn.configs.mask_rcnn_laplacian_tiny_1x_coco import *

model.roi_head.bbox_head.num_classes = 3
model.roi_head.mask_head.num_classes = 3
'''
BUILD = '''
import sys
from mmengine.config import Config
from mmengine.registry import init_default_scope
cfg = Config.fromfile(sys.argv[1])
import mmlinattn  # what the config's custom_imports does in a runner
init_default_scope(cfg.default_scope)
from mmdet.registry import MODELS
model = MODELS.build(cfg.model)
print(type(model.backbone).__module__, type(model.backbone).__name__,
      model.roi_head.bbox_head.num_classes, cfg.default_hooks.safe_checkpoint_loading.type,
      mmlinattn.__file__)
'''


def test_a_config_anywhere_inherits_through_read_base(tmp_path):
    """From a folder outside the repo (no checkout on sys.path), as a user of the installed package."""
    (tmp_path / 'det.py').write_text(USER_CONFIG)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    proc = subprocess.run([sys.executable, '-c', BUILD, 'det.py'], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    module, cls, num_classes, hook, package_file = proc.stdout.split()
    assert (module, cls, num_classes) == ('mmlinattn.models.backbones.laplacianformer',
                                          'LaplacianFormer', '3')
    assert hook == 'mmlinattn.SafeCheckpointLoadingHook'
    assert 'site-packages' in package_file  # the installed package (.venv links its editable install)
