"""The test loop of mixed precision runs: mmengine's ``TestLoop`` under autocast, ready for the CPU.

mmengine's ``test_cfg.fp16=True`` runs the test under its ``autocast`` (bf16 on the CPU, fp16 on
CUDA). That is enough for mmseg's and mmpretrain's models; mmdet's detectors on the CPU also need
mmcv's ops in fp32, which this loop arranges (:func:`~mmlinattn.cpu_autocast.run_mmcv_ops_in_fp32`)::

    test_cfg = dict(type='mmlinattn.MixedPrecisionTestLoop')
"""
from mmengine.device import get_device
from mmengine.logging import print_log
from mmengine.runner import TestLoop

from mmlinattn.cpu_autocast import run_mmcv_ops_in_fp32, warn_if_cpu_lacks_bf16
from mmlinattn.registry import LOOPS

__all__ = ['MixedPrecisionTestLoop']


@LOOPS.register_module()
class MixedPrecisionTestLoop(TestLoop):
    """``TestLoop`` with ``fp16=True`` by default; on the CPU its model runs mmcv's ops in fp32, and
    a CPU without bf16 instructions is warned about once."""

    def __init__(self, runner, dataloader, evaluator, fp16: bool = True):
        super().__init__(runner, dataloader, evaluator, fp16=fp16)

    def run(self) -> dict:
        if self.fp16 and get_device() == 'cpu':
            warn_if_cpu_lacks_bf16()
            run_mmcv_ops_in_fp32(self.runner.model)
            print_log(f'{type(self).__name__}: autocast to torch.bfloat16 on cpu, mmcv ops in fp32',
                      logger='current')
        return super().run()
