"""bf16 on the CPU through mmdet's own ``tools/train.py`` and ``tools/test.py`` (the installed wheel,
a ``read_base()`` user config, test_stock_tools.py's set-up): ``--cfg-options`` names the plugin's
MixedPrecisionOptimWrapper for training and its MixedPrecisionTestLoop for the test; the checkpoint
stays fp32."""
import re

import pytest
import torch

from test_stock_tools import det_config, run_stock  # noqa: F401  (det_config: the fixture)

pytestmark = pytest.mark.slow


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU path (on CUDA the wrapper is fp16 AMP)')
def test_mmdet_stock_tools_train_and_test_in_bf16_on_the_cpu(installed_wheel, det_config):  # noqa: F811
    site, _ = installed_wheel
    user = det_config.parent
    proc = run_stock('mmdet', 'train.py', det_config, '--work-dir', 'work', '--cfg-options',
                     'optim_wrapper.type=mmlinattn.MixedPrecisionOptimWrapper', 'val_cfg.fp16=True',
                     cwd=user, site=site)
    assert 'MixedPrecisionOptimWrapper: autocast to torch.bfloat16 on cpu, fp32 parameters, loss scaling: ' \
        'none' in proc.output, proc.output[-3000:]
    assert re.search(r'Epoch\(train\)\s+\[1\]\[2/2\].*loss', proc.output), proc.output[-3000:]
    assert re.search(r'Epoch\(val\)\s+\[1\]\[2/2\]\s+coco/bbox_mAP: \d', proc.output), proc.output[-3000:]
    checkpoint = user / 'work' / 'epoch_1.pth'
    state = torch.load(checkpoint, weights_only=False)  # written by this test
    assert {t.dtype for t in state['state_dict'].values() if t.is_floating_point()} == {torch.float32}
    assert 'loss_scaler' not in state['optimizer']

    proc = run_stock('mmdet', 'test.py', det_config, checkpoint, '--work-dir', 'test', '--cfg-options',
                     'test_cfg.type=mmlinattn.MixedPrecisionTestLoop', cwd=user, site=site)
    assert 'MixedPrecisionTestLoop: autocast to torch.bfloat16 on cpu, mmcv ops in fp32' in proc.output
    for metric in ('coco/bbox_mAP', 'coco/segm_mAP'):
        assert re.search(metric + r': \d', proc.output), proc.output[-3000:]
