"""pad_to_multiple, the bottom/right padding of patch embeddings, windows and landmark pooling."""
import pytest
import torch

from mmlinattn.models.layers import PatchEmbed, pad_to_multiple


@pytest.mark.parametrize('multiple', [1, 2, 4, 7, 8, 16])
def test_pad_to_multiple_reaches_the_next_multiple(multiple):
    for size in range(3 * multiple + 2):
        pad = pad_to_multiple(size, multiple)
        assert 0 <= pad < multiple and (size + pad) % multiple == 0, (size, multiple, pad)


def test_patch_embed_grid_is_the_ceiling_at_odd_sizes():
    tokens, hw_shape = PatchEmbed(3, 8, patch_size=4)(torch.randn(1, 3, 13, 18))
    assert hw_shape == (4, 5)
    assert tokens.shape == (1, 20, 8)
