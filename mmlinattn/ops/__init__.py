"""Fused ops, one package per op with its implementations side by side (``<op>/__init__.py`` the
public function, ``reference.py``, ``compiled.py`` for the C++ CPU / CUDA kernels, ``triton.py``);
``dispatch.py`` chooses among them. See ``docs/ops/``."""
from .depthwise_conv import depthwise_conv2d
from .dispatch import FallbackWarning, extension_status
from .finite_check import check_finite_input, set_finite_checks
from .laplacian_kernel import laplacian_kernel
from .newton_schulz import newton_schulz_inverse
from .polarity_attention import polarity_linear_attention
from .polarity_attention.reference import polarity_features
from .roi_align import roi_align
from .validation import compute_dtype

__all__ = ['FallbackWarning', 'check_finite_input', 'compute_dtype', 'depthwise_conv2d',
           'extension_status', 'laplacian_kernel', 'newton_schulz_inverse', 'polarity_features',
           'polarity_linear_attention', 'roi_align', 'set_finite_checks']
