"""Opt-in check that names the first attention layer whose input is not finite, for debugging.

The ops never look at tensor values (that would sync the device once per layer and break
``torch.compile`` graphs), so a NaN or Inf in an image propagates to the outputs silently, as in
any PyTorch model (and mmengine's AMP loss scaler can skip the step). To find where non-finite
values first appear, set ``MMLINATTN_CHECK_FINITE=1`` (or call ``set_finite_checks(True)``): every
attention layer of the backbones then checks its input and raises ``ValueError`` naming itself by
its path in the outermost running module, e.g. ``backbone.stages.1.blocks.0.attn``. The check
syncs the device per layer and is meant for eager debugging runs, not for ``torch.compile``.
"""
import os
import sys
from typing import Optional

import torch
from torch import nn

ENV_VAR = 'MMLINATTN_CHECK_FINITE'
_override: Optional[bool] = None


def set_finite_checks(enabled: Optional[bool]) -> None:
    """Force the checks on or off; None defers to ``MMLINATTN_CHECK_FINITE`` again."""
    global _override
    _override = enabled


def finite_checks_enabled() -> bool:
    if _override is not None:
        return _override
    return os.getenv(ENV_VAR, '0').strip().lower() not in ('', '0', 'false', 'no', 'off')


def _running_root(module: nn.Module) -> nn.Module:
    """The outermost ``nn.Module`` whose method is on the call stack (``module`` if none is)."""
    root, frame = module, sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get('self')
        if isinstance(owner, nn.Module):
            root = owner
        frame = frame.f_back
    return root


def module_path(module: nn.Module) -> str:
    """``module``'s dotted name in the outermost running module, or its class name."""
    root = _running_root(module)
    for name, candidate in root.named_modules():
        if candidate is module and name:
            return name
    return type(module).__name__


def check_finite_input(module: nn.Module, x: torch.Tensor) -> None:
    """Raise ``ValueError`` naming ``module`` if checks are enabled and ``x`` is not finite."""
    if finite_checks_enabled() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f'{module_path(module)} ({type(module).__name__}): its input of shape '
                         f'{list(x.shape)} has {bad} non-finite values (NaN or Inf); '
                         f'{ENV_VAR}=1 checks every attention layer\'s input')
