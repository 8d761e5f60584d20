from .base import StagedBackbone
from .laplacianformer import LaplacianFormer
from .polaformer_pvt import PolaPVT
from .polaformer_swin import PolaSwin

__all__ = ['LaplacianFormer', 'PolaPVT', 'PolaSwin', 'StagedBackbone']
