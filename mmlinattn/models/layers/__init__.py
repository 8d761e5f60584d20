from .mlp import Mlp
from .pos_embed import resize_pos_embed

__all__ = ['Mlp', 'resize_pos_embed']
