"""ShiftedWindowAttention against dense masked attention built from token coordinates."""
import pytest
import torch
import torch.nn.functional as F

from mmlinattn.models.layers import ShiftedWindowAttention
from mmlinattn.models.layers.window_attention import MASK_VALUE


def window_attention_by_coordinates(attn: ShiftedWindowAttention, x, hw_shape, shift: int):
    """Every padded token attends to the tokens of its window in the rolled frame; pairs from
    different roll regions get MASK_VALUE; the bias is indexed by the in-window offset."""
    batch, _, channels = x.shape
    height, width = hw_shape
    w, heads = attn.window_size, attn.num_heads
    d = channels // heads
    grid = F.pad(x.reshape(batch, height, width, channels), (0, 0, 0, (-width) % w, 0, (-height) % w))
    hp, wp = grid.shape[1:3]
    grid = torch.roll(grid, (-shift, -shift), (1, 2))
    tokens = grid.reshape(batch, hp * wp, channels)
    rows = torch.arange(hp).repeat_interleave(wp)
    cols = torch.arange(wp).repeat(hp)

    def band(c, size):
        return torch.where(c < size - w, 0, torch.where(c < size - shift, 1, 2)) if shift else c * 0

    same_window = ((rows[:, None] // w) == (rows[None] // w)) & ((cols[:, None] // w) == (cols[None] // w))
    region = band(rows, hp) * 3 + band(cols, wp)
    index = ((rows[:, None] % w - rows[None] % w + w - 1) * (2 * w - 1)
             + (cols[:, None] % w - cols[None] % w + w - 1))
    bias = attn.relative_position_bias_table[index].permute(2, 0, 1)  # [h, N, N]

    qkv = tokens @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = (qkv[..., i * channels:(i + 1) * channels].reshape(batch, -1, heads, d).transpose(1, 2)
               for i in range(3))
    logits = q @ k.transpose(-2, -1) / d**0.5 + bias
    logits = logits + torch.where(region[:, None] != region[None], MASK_VALUE, 0.0)
    logits = logits.masked_fill(~same_window, float('-inf'))
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(batch, hp, wp, channels)
    out = out @ attn.proj.weight.T + attn.proj.bias
    out = torch.roll(out, (shift, shift), (1, 2))[:, :height, :width]
    return out.reshape(batch, height * width, channels)


@pytest.mark.parametrize('hw,shift', [((8, 8), False), ((8, 8), True), ((9, 11), False), ((9, 11), True),
                                      ((3, 4), True)])
def test_matches_dense_masked_attention(hw, shift):
    torch.manual_seed(0)
    attn = ShiftedWindowAttention(12, 3, window_size=4, shift=shift).double()
    with torch.no_grad():
        attn.relative_position_bias_table.normal_()
    x = torch.randn(2, hw[0] * hw[1], 12, dtype=torch.float64)
    # a map that fits in one window is not shifted
    effective_shift = 2 if shift and (hw[0] > 4 or hw[1] > 4) else 0
    torch.testing.assert_close(attn(x, hw), window_attention_by_coordinates(attn, x, hw, effective_shift),
                               rtol=1e-10, atol=1e-10)


def test_official_names_and_shapes():
    attn = ShiftedWindowAttention(384, 12, window_size=7, shift=True)
    assert {n: tuple(p.shape) for n, p in attn.named_parameters()} == {
        'qkv.weight': (1152, 384), 'qkv.bias': (1152, ), 'relative_position_bias_table': (169, 12),
        'proj.weight': (384, 384), 'proj.bias': (384, )}
    assert 'relative_position_index' not in attn.state_dict()  # recomputed, not loaded
