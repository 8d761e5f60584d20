from .laplacian_attention import LaplacianAttention
from .mlp import Mlp
from .pos_embed import resize_pos_embed

__all__ = ['LaplacianAttention', 'Mlp', 'resize_pos_embed']
