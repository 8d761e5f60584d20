"""Fused ops: each has compiled CUDA / CPU kernels and a pure-PyTorch reference (see dispatch.py)."""
from .dispatch import extension_status
from .laplacian_kernel import laplacian_kernel
from .newton_schulz import newton_schulz_inverse
from .polarity_attention import polarity_linear_attention

__all__ = ['extension_status', 'laplacian_kernel', 'newton_schulz_inverse',
           'polarity_linear_attention']
