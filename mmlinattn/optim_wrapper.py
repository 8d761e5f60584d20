"""Mixed precision training that also runs on the CPU: bf16 autocast there, mmengine's AMP on a GPU.

mmengine's ``AmpOptimWrapper`` asserts a CUDA/NPU/MLU/MUSA device in ``__init__`` and always loss-scales
with a ``GradScaler``. On the CPU, bf16 needs neither: it has fp32's exponent range, so gradients do
not underflow, and mmengine's own ``autocast`` already maps to ``torch.autocast('cpu', bfloat16)``.
:class:`MixedPrecisionOptimWrapper` is that wrapper for both, so one config line turns mixed precision
on wherever the run lands::

    optim_wrapper = dict(type='mmlinattn.MixedPrecisionOptimWrapper', optimizer=...)
"""
import logging
from contextlib import contextmanager

import torch
from mmengine.device import get_device
from mmengine.logging import print_log
from mmengine.optim import AmpOptimWrapper, OptimWrapper

from mmlinattn.cpu_autocast import run_mmcv_ops_in_fp32, warn_if_cpu_lacks_bf16
from mmlinattn.registry import OPTIM_WRAPPERS

__all__ = ['MixedPrecisionOptimWrapper']


@OPTIM_WRAPPERS.register_module()
class MixedPrecisionOptimWrapper(AmpOptimWrapper):
    """mmengine's :class:`~mmengine.optim.AmpOptimWrapper` on a GPU; bf16 autocast on the CPU.

    On CUDA (and NPU/MLU/MUSA) it is exactly ``AmpOptimWrapper``: fp16 with loss scaling by default,
    ``dtype='bfloat16'`` for bf16. On the CPU the forward (``optim_context``) runs under
    ``torch.autocast('cpu', dtype=torch.bfloat16)``, the parameters stay fp32 master weights (so
    checkpoints stay fp32) and nothing is loss-scaled: bf16 keeps fp32's exponent range.
    ``loss_scale`` and ``use_fsdp`` (the ``GradScaler``'s settings) are accepted and ignored there,
    so the same config runs on both. There it also makes the model run mmcv's ops, which have no
    bf16 CPU kernels, in fp32 (:func:`~mmlinattn.cpu_autocast.run_mmcv_ops_in_fp32`; the model keeps
    that for validation), and warns once on a CPU without bf16 instructions
    (:func:`~mmlinattn.cpu_autocast.warn_if_cpu_lacks_bf16`).

    Optimizer states of a plain :class:`~mmengine.optim.OptimWrapper` load into it and its CPU states
    load into a plain one (resume across precisions); a GPU state's ``loss_scaler`` entry is dropped
    on the CPU.

    Args:
        loss_scale: ``'dynamic'``, a float (static) or a dict of ``GradScaler`` arguments (GPU only).
        dtype: the autocast dtype, ``'float16'``, ``'bfloat16'``, ``'float32'``, ``'float64'``, a
            ``torch.dtype`` or None (the device's default: fp16 on CUDA, bf16 on the CPU). The CPU
            takes None or bfloat16 only.
        use_fsdp: ``ShardedGradScaler`` for FSDP (GPU only).
        **kwargs: ``OptimWrapper``'s (``optimizer``, ``accumulative_counts``, ``clip_grad``).
    """

    def __init__(self, loss_scale='dynamic', dtype=None, use_fsdp: bool = False, **kwargs):
        if not (loss_scale == 'dynamic' or isinstance(loss_scale, (float, dict))):
            raise ValueError(f"loss_scale must be 'dynamic', a float or a dict, got {loss_scale!r}")
        dtype = _checked_dtype(dtype)
        device = get_device()
        if device != 'cpu':
            super().__init__(loss_scale=loss_scale, dtype=dtype, use_fsdp=use_fsdp, **kwargs)
        else:
            if dtype not in (None, torch.bfloat16):
                raise ValueError(f'dtype: on the CPU {type(self).__name__} autocasts to bfloat16 only '
                                 f'(float16 would need loss scaling), got {dtype}')
            # Not AmpOptimWrapper.__init__: it asserts a GPU and builds a GradScaler.
            OptimWrapper.__init__(self, **kwargs)
            self.loss_scaler = None  # the CPU path: the methods below are OptimWrapper's there
            self.cast_dtype = torch.bfloat16
            warn_if_cpu_lacks_bf16()
        scaling = 'none' if self.loss_scaler is None else \
            f'{loss_scale!r} ({type(self.loss_scaler).__name__})'
        print_log(f'{type(self).__name__}: autocast to {self.cast_dtype or "the device default"} on '
                  f'{device}, fp32 parameters, loss scaling: {scaling}', logger='current')

    @contextmanager
    def optim_context(self, model):
        if self.loss_scaler is None:
            run_mmcv_ops_in_fp32(model)
        with super().optim_context(model):
            yield

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        if self.loss_scaler is None:
            return OptimWrapper.backward(self, loss, **kwargs)
        return super().backward(loss, **kwargs)

    def step(self, **kwargs) -> None:
        if self.loss_scaler is None:
            return OptimWrapper.step(self, **kwargs)
        return super().step(**kwargs)

    def state_dict(self) -> dict:
        if self.loss_scaler is None:
            return OptimWrapper.state_dict(self)
        return super().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        if self.loss_scaler is None and state_dict.pop('loss_scaler', None) is not None:
            print_log('the loss scaler state in this optimizer state is not used: bf16 on the CPU '
                      'is not loss-scaled', logger='current', level=logging.WARNING)
        super().load_state_dict(state_dict)


def _checked_dtype(dtype):
    """``dtype`` as a ``torch.dtype`` (or None), or a ValueError naming the valid ones."""
    valid = AmpOptimWrapper.valid_dtypes
    if dtype is None or (isinstance(dtype, torch.dtype) and str(dtype)[len('torch.'):] in valid):
        return dtype
    if isinstance(dtype, str) and dtype in valid:
        return getattr(torch, dtype)
    raise ValueError(f'dtype must be None, one of {valid} or the torch.dtype of one, got {dtype!r}')
