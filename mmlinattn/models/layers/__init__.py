from .laplacian_attention import LaplacianAttention
from .mlp import Mlp
from .padding import pad_if_needed, pad_to_multiple
from .patch_embed import PatchEmbed, PatchMerging
from .polarity_attention import PolarityAttention
from .pos_embed import resize_pos_embed
from .prenorm_block import PreNormBlock
from .window_attention import ShiftedWindowAttention

__all__ = ['LaplacianAttention', 'Mlp', 'PatchEmbed', 'PatchMerging', 'PolarityAttention', 'PreNormBlock',
           'ShiftedWindowAttention', 'pad_if_needed', 'pad_to_multiple', 'resize_pos_embed']
