from .base import StagedBackbone
from .laplacianformer import LaplacianFormer
from .pola_deit import PolaDeiT
from .polaformer_pvt import PolaPVT
from .polaformer_swin import PolaSwin
from .tuple_outputs import TupleOutputs

__all__ = ['LaplacianFormer', 'PolaDeiT', 'PolaPVT', 'PolaSwin', 'StagedBackbone', 'TupleOutputs']
