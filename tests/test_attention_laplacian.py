"""LaplacianAttention and its Nyström core against exact normalised Laplacian-kernel attention."""
import pytest
import torch

from mmlinattn.models.layers import laplacian_attention as lap
from mmlinattn.models.layers import LaplacianAttention
from mmlinattn.ops.dispatch import has_kernel
from mmlinattn.ops.torch_compat import autocast_enabled


def exact_attention(q, v, lam=4.0):
    """Ground truth in plain torch: ``D^-1 K v``, ``K_ij = exp(-||q_i - q_j||_1 / lam)``."""
    kernel = torch.exp(-(q[..., :, None, :] - q[..., None, :, :]).abs().sum(-1) / lam)
    return kernel @ v / kernel.sum(-1, keepdim=True)


def layer_attention(q, landmarks, v, lam=4.0, **settings):
    """The layer's own attention (:meth:`LaplacianAttention.attend`) on given q, landmarks q~ (None:
    exact) and v, with the Laplacian kernel of bandwidth ``lam`` and the Newton–Schulz solve."""
    layer = LaplacianAttention(2 * q.shape[-1], 2, landmark_ratio=1 if landmarks is None else 2,
                               lam=lam, **settings)
    return layer.attend(q, landmarks, v)


def relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


def make_qv(seed, batch=2, heads=2, tokens=64, head_dims=8, value_dims=8, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, tokens, head_dims, generator=gen, dtype=dtype) * 0.5
    v = torch.randn(batch, heads, tokens, value_dims, generator=gen, dtype=dtype)
    return q, v


@pytest.mark.parametrize('lam', [1.0, 4.0])
def test_nystrom_with_every_token_a_landmark_is_exact(lam):
    q, v = make_qv(0)
    expected = exact_attention(q, v, lam)
    nystrom = layer_attention(q, q, v, lam=lam, ns_iters=60, landmark_shift=0.0)
    assert torch.allclose(nystrom, expected, atol=1e-6, rtol=0)
    assert torch.allclose(layer_attention(q, None, v, lam=lam), expected, atol=1e-6, rtol=0)


def test_landmark_ratio_one_module_is_exact_attention():
    torch.manual_seed(0)
    attn = LaplacianAttention(32, 2, landmark_ratio=1, local_kernel_size=0).double()
    x = torch.randn(2, 5 * 7, 32, dtype=torch.float64)
    heads = lambda t: t.reshape(2, 35, 2, 16).transpose(1, 2)  # noqa: E731
    q, v = heads(attn.q(x)) * 16**-0.5, heads(attn.v(x))
    expected = attn.proj(exact_attention(q, v).transpose(1, 2).reshape(2, 35, 32))
    assert torch.allclose(attn(x, (5, 7)), expected, atol=1e-10, rtol=0)


def test_approximation_error_falls_as_landmarks_grow():
    q, v = make_qv(1, batch=1, tokens=256, head_dims=16)
    expected = exact_attention(q, v)
    order = torch.randperm(256, generator=torch.Generator().manual_seed(1))
    errors = [
        relative_error(layer_attention(q, q[:, :, order[:m]], v, ns_iters=40,
                                       landmark_shift=0.0),
                       expected) for m in (4, 16, 64, 128, 256)
    ]
    assert all(later < earlier for earlier, later in zip(errors, errors[1:])), errors
    assert errors[0] > 0.1 and errors[-1] < 1e-8, errors


@pytest.mark.parametrize('path', ['exact', 'nystrom'])
def test_distinct_queries_give_distinct_attention_rows(path):
    # Near-duplicate pairs of queries (1e-3 apart) must still get different attention rows: the
    # Laplacian kernel is strictly positive definite, so K's rows are linearly independent.
    q, _ = make_qv(2, batch=1, heads=1, tokens=32)
    q[..., 16:, :] = q[..., :16, :] + 1e-3 * torch.randn_like(q[..., :16, :])
    identity = torch.eye(32, dtype=q.dtype).expand(1, 1, 32, 32)  # v = I turns the output into A
    if path == 'exact':
        rows = layer_attention(q, None, identity)
    else:
        rows = layer_attention(q, q, identity, ns_iters=40, landmark_shift=0.0)
    assert torch.allclose(rows.sum(-1), torch.ones(1, 1, 32, dtype=q.dtype), atol=1e-8)
    distances = torch.cdist(rows[0, 0], rows[0, 0])
    off_diagonal = distances + torch.eye(32, dtype=q.dtype) * distances.max()
    assert off_diagonal.min() > 1e-5


@pytest.mark.parametrize('ratio', [4, 1], ids=['nystrom', 'exact'])
def test_attention_rows_are_the_weights_the_layer_applies(ratio):
    torch.manual_seed(0)
    attn = LaplacianAttention(32, 2, landmark_ratio=ratio, local_kernel_size=3).double()
    x = torch.randn(2, 9 * 11, 32, dtype=torch.float64)
    q, landmarks, v = attn.attention_inputs(x, (9, 11))
    rows = attn.attention_rows(q, landmarks)
    assert rows.shape == (2, 2, 99, 99)
    torch.testing.assert_close(rows @ v, attn.attend(q, landmarks, v), rtol=1e-10, atol=1e-12)
    index = torch.tensor([0, 50, 98])
    torch.testing.assert_close(attn.attention_rows(q, landmarks, index), rows[..., index, :],
                               rtol=1e-12, atol=1e-14)


def test_duplicated_landmarks_give_finite_outputs_and_grads():
    q, v = make_qv(3, dtype=torch.float32)
    q.requires_grad_(True)
    landmarks = q[:, :, :1].detach().expand(-1, -1, 16, -1).clone().requires_grad_(True)  # rank-1 Gram
    out = layer_attention(q, landmarks, v)
    out.square().sum().backward()
    assert torch.isfinite(out).all()
    assert torch.isfinite(q.grad).all() and torch.isfinite(landmarks.grad).all()


def test_module_with_collapsed_landmarks_is_finite():
    # A zero landmark conv makes every landmark GELU(LN(0)) = 0: all landmarks coincide.
    torch.manual_seed(0)
    attn = LaplacianAttention(64, 2, landmark_ratio=4, local_kernel_size=5)
    torch.nn.init.zeros_(attn.landmark_conv.weight)
    x = torch.randn(2, 12 * 12, 64, requires_grad=True)
    out = attn(x, (12, 12))
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize('hw_shape,ratio', [((13, 17), 8), ((7, 7), 4), ((1, 1), 2), ((9, 5), 1)])
def test_module_shapes_for_sizes_not_divisible_by_the_landmark_ratio(hw_shape, ratio):
    attn = LaplacianAttention(64, 2, landmark_ratio=ratio, local_kernel_size=3)
    tokens = hw_shape[0] * hw_shape[1]
    x = torch.randn(3, tokens, 64)
    assert attn(x, hw_shape).shape == (3, tokens, 64)
    if ratio > 1:
        q = torch.randn(3, 2, tokens, 32)
        num_landmarks = -(-hw_shape[0] // ratio) * -(-hw_shape[1] // ratio)
        assert attn.landmarks(q, hw_shape).shape == (3, 2, num_landmarks, 32)


def test_max_landmark_grid_caps_the_landmarks_and_changes_nothing_below_the_cap():
    torch.manual_seed(0)
    capped = LaplacianAttention(64, 2, landmark_ratio=4, local_kernel_size=5, max_landmark_grid=(3, 4))
    plain = LaplacianAttention(64, 2, landmark_ratio=4, local_kernel_size=5, max_landmark_grid=None)
    plain.load_state_dict(capped.state_dict())
    q = torch.randn(1, 2, 40 * 30, 32)
    assert plain.landmarks(q, (40, 30)).shape == (1, 2, 10 * 8, 32)
    assert capped.landmarks(q, (40, 30)).shape == (1, 2, 3 * 4, 32)
    assert capped.landmarks(q[:, :, :9 * 13], (9, 13)).shape == (1, 2, 3 * 4, 32)
    small = torch.randn(2, 12 * 16, 64)  # a 3x4 landmark grid: at the cap, no pooling
    assert torch.equal(capped(small, (12, 16)), plain(small, (12, 16)))


def test_newton_schulz_runs_in_fp32_under_bf16_autocast(monkeypatch):
    seen = []
    original = lap.newton_schulz_inverse

    def spy(a, **kwargs):
        seen.append((a.dtype, autocast_enabled('cpu')))
        return original(a, **kwargs)

    monkeypatch.setattr(lap, 'newton_schulz_inverse', spy)
    torch.manual_seed(0)
    attn = LaplacianAttention(64, 2, landmark_ratio=4, local_kernel_size=5)
    x = torch.randn(2, 16 * 16, 64)
    expected = attn(x, (16, 16))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = attn(x, (16, 16))
    assert seen[-1] == (torch.float32, False)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert relative_error(out.float(), expected) < 2e-2


@pytest.mark.skipif(not has_kernel('laplacian_kernel', 'cpu'),
                    reason='mmlinattn._ext is not built with the CPU Laplacian kernel')
@pytest.mark.parametrize('ratio', [4, 1])
def test_compiled_ops_match_reference(monkeypatch, ratio):
    torch.manual_seed(0)
    attn = LaplacianAttention(64, 2, landmark_ratio=ratio, local_kernel_size=5)
    x = torch.randn(2, 12 * 10, 64)
    results = {}
    for mode in ('reference', 'compiled'):
        monkeypatch.setenv('MMLINATTN_OPS', mode)
        attn.zero_grad()
        inputs = x.clone().requires_grad_(True)
        out = attn(inputs, (12, 10))
        out.square().sum().backward()
        results[mode] = [out, inputs.grad] + [p.grad for p in attn.parameters()]
    for ref, compiled in zip(results['reference'], results['compiled']):
        assert torch.allclose(compiled, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('kwargs,message', [
    (dict(embed_dims=64, num_heads=3, landmark_ratio=2), 'divisible by num_heads'),
    (dict(embed_dims=64, num_heads=2, landmark_ratio=0), 'landmark_ratio'),
    (dict(embed_dims=64, num_heads=2, landmark_ratio=2, local_kernel_size=4), 'local_kernel_size'),
    (dict(embed_dims=64, num_heads=2, landmark_ratio=2, lam=0.0), 'lam'),
    (dict(embed_dims=64, num_heads=2, landmark_ratio=2, max_landmark_grid=0), 'max_landmark_grid'),
])
def test_invalid_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LaplacianAttention(**kwargs)


def test_token_count_must_match_hw_shape():
    attn = LaplacianAttention(64, 2, landmark_ratio=2)
    with pytest.raises(ValueError, match=r'hw_shape \(4, 5\)'):
        attn(torch.randn(1, 21, 64), (4, 5))
