"""pad_to_multiple and pad_if_needed, the bottom/right padding of patch embeddings, windows and landmark
pooling."""
import pytest
import torch

from mmlinattn.models.layers import PatchEmbed, pad_if_needed, pad_to_multiple


@pytest.mark.parametrize('multiple', [1, 2, 4, 7, 8, 16])
def test_pad_to_multiple_reaches_the_next_multiple(multiple):
    for size in range(3 * multiple + 2):
        pad = pad_to_multiple(size, multiple)
        assert 0 <= pad < multiple and (size + pad) % multiple == 0, (size, multiple, pad)


def test_patch_embed_grid_is_the_ceiling_at_odd_sizes():
    tokens, hw_shape = PatchEmbed(3, 8, patch_size=4)(torch.randn(1, 3, 13, 18))
    assert hw_shape == (4, 5)
    assert tokens.shape == (1, 20, 8)


def test_pad_if_needed_copies_nothing_without_padding_and_pads_with_zeros():
    x = torch.randn(2, 5, 6, 3)
    assert pad_if_needed(x, (0, 0, 0, 0, 0, 0)) is x
    padded = pad_if_needed(x, (0, 0, 0, 2, 0, 3))
    assert padded.shape == (2, 8, 8, 3)
    torch.testing.assert_close(padded[:, :5, :6], x, rtol=0, atol=0)
    assert padded[:, 5:].abs().sum() == 0 and padded[:, :, 6:].abs().sum() == 0


def test_pad_if_needed_keeps_the_pad_in_a_traced_graph():
    # Traced at a size that needs no padding, the graph must still pad a size that does.
    def pad_rows(x):
        return pad_if_needed(x, (0, 0, 0, pad_to_multiple(x.shape[-2], 4)))

    traced = torch.jit.trace(pad_rows, torch.randn(1, 8, 3))
    assert traced(torch.randn(1, 6, 3)).shape == (1, 8, 3)
