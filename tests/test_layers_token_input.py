"""Every attention layer checks its token input the same way (``layers/token_input.py``):
``x [B, H*W, C]`` for ``hw_shape``, a ``ValueError`` naming the layer and what arrived."""
import re

import pytest
import torch

from mmlinattn.models.layers import LaplacianAttention, PolarityAttention, ShiftedWindowAttention

LAYERS = {
    'LaplacianAttention': lambda: LaplacianAttention(16, 2, landmark_ratio=2),
    'PolarityAttention': lambda: PolarityAttention(16, 2, (4, 6)),
    'ShiftedWindowAttention': lambda: ShiftedWindowAttention(16, 2, window_size=2, shift=True),
}
BAD_INPUTS = {
    'token count': (torch.randn(2, 23, 16), (4, 6)),
    'channels': (torch.randn(2, 24, 8), (4, 6)),
    'no batch dim': (torch.randn(24, 16), (4, 6)),
}


@pytest.mark.parametrize('name', LAYERS)
def test_good_tokens_pass(name):
    assert LAYERS[name]()(torch.randn(2, 24, 16), (4, 6)).shape == (2, 24, 16)


@pytest.mark.parametrize('bad', BAD_INPUTS)
@pytest.mark.parametrize('name', LAYERS)
def test_bad_tokens_name_the_layer_and_the_expected_shape(name, bad):
    x, hw_shape = BAD_INPUTS[bad]
    expected = f'{name}: x must be [B, H*W, 16] for hw_shape (4, 6), got {list(x.shape)}'
    with pytest.raises(ValueError, match='^' + re.escape(expected)):
        LAYERS[name]()(x, hw_shape)
