"""polarity_linear_attention: compiled CPU/CUDA kernels against the pure-PyTorch reference, and
the registered operators (opcheck).

The compiled tests use the ``compiled_ops`` fixture (conftest.py: loads the extension,
MMLINATTN_OPS=compiled), so a missing extension fails them instead of silently testing the
reference against itself.
"""
import os
import subprocess
import sys

import pytest
import torch

from mmlinattn.ops import polarity_linear_attention
from mmlinattn.ops.polarity_attention.reference import polarity_linear_attention_reference

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
# (N, n) pairs covering {1, 7, 49, 50, 333} on both sides, with (B, h) cycling through a few values.
TOKEN_PAIRS = [(1, 1), (7, 49), (49, 7), (50, 50), (333, 50), (1, 333), (333, 333)]
BATCH_HEADS = [(1, 1), (2, 3), (3, 2)]


@pytest.fixture
def compiled(compiled_ops):
    return compiled_ops


def make_inputs(batch, heads, num_queries, num_keys, head_dim, value_dim, dtype, device='cpu',
                seed=0, away_from_zero=False):
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64)
        if away_from_zero:  # |x| >= 0.2, so relu(x)^p is smooth within gradcheck's steps
            x = torch.sign(x) * (0.2 + x.abs())
        return x.to(device=device, dtype=dtype)

    q = draw(batch, heads, num_queries, head_dim)
    k = draw(batch, heads, num_keys, head_dim)
    v = draw(batch, heads, num_keys, value_dim)
    theta = torch.randn(heads, head_dim, generator=gen, dtype=torch.float64)
    power = (1 + 4 * torch.sigmoid(theta)).to(device=device, dtype=dtype)
    return q, k, v, power


def forward_backward(fn, inputs, grad_out=None):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    if grad_out is None:
        gen = torch.Generator().manual_seed(1)
        grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out)
    grads = torch.autograd.grad(out, inputs, grad_out.to(out))
    return out, grads, grad_out


def reference_fp64(inputs, grad_out):
    """The reference evaluated in fp64 on the same (rounded) inputs: the ground truth."""
    as64 = [t.detach().to('cpu', torch.float64) for t in inputs]
    out, grads, _ = forward_backward(polarity_linear_attention_reference, as64,
                                     grad_out.to('cpu', torch.float64))
    return out, grads


def max_error(actual, expected):
    if not expected.numel():
        return 0.0
    return (actual.to(torch.float64) - expected.to(actual.device, torch.float64)).abs().max().item()


def assert_close_scaled(name, actual, expected, tol, floor=0.0):
    """max|actual - expected| <= max(tol * max(1, max|expected|), floor)."""
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    err = max_error(actual, expected)
    assert err <= max(tol * scale, floor), (
        f'{name}: max error {err:.3g} > max({tol:.1g} * {scale:.3g}, {floor:.3g})')


def check_against_reference(inputs, tol):
    """Compiled op vs the fp64 reference, forward and backward.

    In fp32 a few tiny-d shapes are ill-conditioned (phi(q).z ~ eps makes dq, dk a difference of
    nearly equal terms); there the bound is also met when the compiled op is within 10x of the
    error that the fp32 reference itself makes.
    """
    out, grads, grad_out = forward_backward(polarity_linear_attention, inputs)
    ref_out, ref_grads = reference_fp64(inputs, grad_out)
    floors = [0.0] * 5
    if inputs[0].dtype == torch.float32:
        ref32_out, ref32_grads, _ = forward_backward(polarity_linear_attention_reference,
                                                     [t.cpu() for t in inputs], grad_out.cpu())
        floors = [10 * max_error(a, b) for a, b in zip((ref32_out, ) + ref32_grads,
                                                      (ref_out, ) + ref_grads)]
    assert out.dtype == inputs[0].dtype and out.shape == ref_out.shape
    assert_close_scaled('out', out, ref_out, tol, floors[0])
    for name, grad, ref_grad, floor in zip(('dq', 'dk', 'dv', 'dpower'), grads, ref_grads,
                                           floors[1:]):
        assert grad.shape == ref_grad.shape, name
        assert_close_scaled(name, grad, ref_grad, tol, floor)


# bf16: the inputs are exact in both, so the error is the kernel's: the rounding of out and the
# gradients to bf16 (2^-9 relative) over fp32 accumulation.
@pytest.mark.parametrize('dtype, tol', [(torch.float64, 1e-10), (torch.float32, 1e-5),
                                        (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize('value_dim', [2, 32, 64])
@pytest.mark.parametrize('head_dim', [1, 16, 32, 64])
@pytest.mark.parametrize('pair_index', range(len(TOKEN_PAIRS)))
def test_cpu_matches_reference(compiled, pair_index, head_dim, value_dim, dtype, tol):
    num_queries, num_keys = TOKEN_PAIRS[pair_index]
    batch, heads = BATCH_HEADS[(pair_index + head_dim + value_dim) % len(BATCH_HEADS)]
    inputs = make_inputs(batch, heads, num_queries, num_keys, head_dim, value_dim, dtype,
                         seed=pair_index)
    check_against_reference(inputs, tol)


def test_cpu_gradcheck(compiled):
    inputs = make_inputs(2, 2, 5, 6, 3, 4, torch.float64, away_from_zero=True)
    inputs = [t.requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(polarity_linear_attention, inputs, eps=1e-6, atol=1e-7)


def test_cpu_gradcheck_through_power_parametrisation(compiled):
    """PolaFormer's p = 1 + 4 sigmoid(theta), given as [1, h, 1, d]: theta gets its gradient."""
    q, k, v, _ = make_inputs(1, 2, 4, 5, 3, 2, torch.float64, away_from_zero=True)
    theta = torch.randn(1, 2, 1, 3, dtype=torch.float64, requires_grad=True)

    def fn(theta):
        return polarity_linear_attention(q, k, v, 1 + 4 * torch.sigmoid(theta))

    assert torch.autograd.gradcheck(fn, (theta, ), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize('dtype, tol', [(torch.float64, 1e-10), (torch.bfloat16, 1e-2)])
def test_cpu_exact_zeros_have_zero_gradient(compiled, dtype, tol):
    """relu(x)^p at x = 0 (and -0): the features, dx and dpower contributions are 0, as in
    autograd."""
    q, k, v, power = make_inputs(1, 2, 9, 8, 4, 6, dtype)
    q[..., ::3, 1] = 0
    q[..., 1::3, 1] = -0.0
    k[..., ::2, 2] = 0
    power[0, 0] = 0.5  # p < 1: the derivative of |x|^p is unbounded near 0 but 0 at 0
    out, grads, grad_out = forward_backward(polarity_linear_attention, (q, k, v, power))
    ref_out, ref_grads = reference_fp64((q, k, v, power), grad_out)
    assert_close_scaled('out', out, ref_out, tol)
    for name, grad, ref_grad in zip(('dq', 'dk', 'dv', 'dpower'), grads, ref_grads):
        assert torch.isfinite(grad).all(), name
        assert_close_scaled(name, grad, ref_grad, tol)
    assert (grads[0][..., ::3, 1] == 0).all() and (grads[1][..., ::2, 2] == 0).all()


def test_cpu_bf16_over_the_whole_exponent_range(compiled):
    """bf16 features |x|^p from subnormal (1e-39) to large (1e3) |x|, at every channel count
    around the 16-lane vectors: within bf16's error of the fp64 reference."""
    for head_dim in (1, 15, 16, 17, 40):
        q, k, v, power = make_inputs(2, 2, 40, 33, head_dim, 4, torch.float64, seed=head_dim)
        magnitude = torch.logspace(-39, 3, 40, dtype=torch.float64)[torch.randperm(40)]
        q = (q * magnitude[:, None]).bfloat16()
        k = (k * magnitude[:33, None].flip(0) * 1e-3).bfloat16()
        inputs = (q, k, v.bfloat16(), power.bfloat16())
        assert (q.abs() < 1.2e-38).any() and (q.abs() > 1e2).any()
        out, grads, grad_out = forward_backward(polarity_linear_attention, inputs)
        ref_out, ref_grads = reference_fp64(inputs, grad_out)
        assert_close_scaled('out', out, ref_out, 1e-2)
        for name, grad, ref_grad in zip(('dq', 'dk', 'dv', 'dpower'), grads, ref_grads):
            assert_close_scaled(name, grad, ref_grad, 1e-2)


def test_cpu_non_contiguous_inputs(compiled):
    """q, k, v as the attention module makes them: [B, N, h, d] permuted to [B, h, N, d]."""
    q, k, v, power = make_inputs(2, 3, 50, 49, 16, 32, torch.float64)
    q_nc, k_nc, v_nc = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    power_nc = power.t().contiguous().t()
    assert not any(t.is_contiguous() for t in (q_nc, k_nc, v_nc, power_nc))
    check_against_reference((q_nc, k_nc, v_nc, power_nc), 1e-10)


def test_cpu_power_as_1_h_1_d(compiled):
    q, k, v, power = make_inputs(2, 3, 7, 7, 4, 2, torch.float64)
    out_4d, grads_4d, grad_out = forward_backward(polarity_linear_attention,
                                                  (q, k, v, power.reshape(1, 3, 1, 4)))
    out_2d, grads_2d, _ = forward_backward(polarity_linear_attention, (q, k, v, power), grad_out)
    torch.testing.assert_close(out_4d, out_2d, rtol=0, atol=0)
    assert grads_4d[3].shape == (1, 3, 1, 4)
    torch.testing.assert_close(grads_4d[3].reshape(3, 4), grads_2d[3], rtol=0, atol=0)


def _thread_count_case():
    """Chunked keys and queries (700, 600 > 256 tokens), partials summed in a fixed order."""
    inputs = make_inputs(2, 1, 700, 600, 8, 4, torch.float32)
    out, grads, _ = forward_backward(polarity_linear_attention, inputs)
    return [out, *grads]


def test_cpu_deterministic_across_thread_counts(compiled, tmp_path):
    """Bitwise equal results for another thread count, run in a child process: changing torch's
    thread count in-process breaks torch.linalg.inv for later tests on some platforms."""
    threads = 1 if torch.get_num_threads() > 1 else 3
    out_file = tmp_path / 'other_threads.pt'
    script = (f'import sys, torch; sys.path.insert(0, {TESTS_DIR!r}); '
              f'torch.set_num_threads({threads}); '
              'import test_ops_polarity_attention as t; '
              f'torch.save(t._thread_count_case(), {str(out_file)!r})')
    env = dict(os.environ, MMLINATTN_OPS='compiled')
    subprocess.run([sys.executable, '-c', script], check=True, env=env, cwd=REPO_ROOT)
    other = torch.load(out_file)
    here = _thread_count_case()
    for name, a, b in zip(('out', 'dq', 'dk', 'dv', 'dpower'), here, other):
        assert torch.equal(a, b), name


def test_reference_path(monkeypatch):
    """MMLINATTN_OPS=reference runs the composition, never the compiled operator."""
    monkeypatch.setenv('MMLINATTN_OPS', 'reference')

    def fail(*args):
        raise AssertionError('the compiled op ran under MMLINATTN_OPS=reference')

    monkeypatch.setattr(torch.ops.mmlinattn, 'polarity_linear_attention_forward', fail,
                        raising=False)  # absent when the extension is not loaded
    inputs = make_inputs(2, 2, 7, 5, 4, 6, torch.float64)
    out, grads, grad_out = forward_backward(polarity_linear_attention, inputs)
    ref_out, ref_grads = reference_fp64(inputs, grad_out)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=0)


def test_reference_matches_formulas_written_out():
    """The reference against the formulas (docs/ops/polarity_linear_attention.md) with explicit
    loops over channels (fp64)."""
    q, k, v, power = make_inputs(1, 2, 3, 4, 2, 4, torch.float64)
    out = polarity_linear_attention_reference(q, k, v, power)
    for h in range(2):
        p = power[h]
        kp, km = torch.relu(k[0, h])**p, torch.relu(-k[0, h])**p  # [n, d]
        n = k.shape[2]
        for i in range(3):
            qp, qm = torch.relu(q[0, h, i])**p, torch.relu(-q[0, h, i])**p  # [d]
            sim = (kp @ qp + km @ qm)  # [n]: phi_s(q_i) . phi(k_j)
            opp = (kp @ qm + km @ qp)
            v1, v2 = v[0, h, :, :2], v[0, h, :, 2:]
            xs = (sim @ v1 / n) / (sim.sum() / n + 1e-6)
            xo = (opp @ v2 / n) / (opp.sum() / n + 1e-6)
            torch.testing.assert_close(out[0, h, i], torch.cat([xs, xo]), rtol=1e-12, atol=1e-12)


def test_cpu_autocast_keeps_the_input_dtype_for_bf16_and_fp32(compiled):
    """Under CPU autocast fp32 inputs run in fp32, and bf16 ones (as a Linear under autocast gives
    them) in bf16: bf16 has fp32's range, so the op needs no fp32 copy of them
    (``attention_dtype``)."""
    q, k, v, power = make_inputs(2, 2, 49, 49, 16, 32, torch.float32)
    expected = polarity_linear_attention(q, k, v, power)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = polarity_linear_attention(q, k, v, power)
        out_from_bf16 = polarity_linear_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), power)
    assert out.dtype == torch.float32 and out_from_bf16.dtype == torch.bfloat16
    assert torch.isfinite(out).all() and torch.isfinite(out_from_bf16).all()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    # bf16 rounding of the inputs and the power (8 bits of mantissa), amplified by the power up to 5
    assert_close_scaled('out from bf16', out_from_bf16, expected, 0.1)


def test_raw_op_checks_shapes(compiled):
    """The registered op itself refuses inconsistent shapes (no out-of-bounds reads)."""
    q, k, v, power = make_inputs(1, 2, 3, 4, 5, 6, torch.float32)
    op = compiled.polarity_linear_attention_forward
    with pytest.raises(RuntimeError, match='head dim'):
        op(q, k[..., :4], v, power, 1e-6)
    with pytest.raises(RuntimeError, match='power must have shape'):
        op(q, k, v, power[:, :4], 1e-6)
    out, state, den = op(q, k, v, power, 1e-6)
    with pytest.raises(RuntimeError, match='state must have shape'):
        compiled.polarity_linear_attention_backward(out, q, k, v, power, out, state[..., :3], den)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
def test_opcheck(compiled, dtype):
    """Schema, fake (meta) kernel, autograd registration and AOT dispatch of both operators."""
    q, k, v, power = make_inputs(2, 3, 37, 300, 5, 6, dtype, away_from_zero=True)
    inputs = [t.requires_grad_() for t in (q, k, v, power)]
    torch.library.opcheck(compiled.polarity_linear_attention_forward, (*inputs, 1e-6))
    detached = [t.detach() for t in inputs]
    out, state, den = compiled.polarity_linear_attention_forward(*detached, 1e-6)
    torch.library.opcheck(compiled.polarity_linear_attention_backward,
                          (torch.randn_like(out), *detached, out, state, den))


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_mixed_dtypes_are_promoted(monkeypatch, mode):
    """The rule of every op: mixed inputs are promoted as in ``q + k``, power takes that dtype."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    q, k, v, power = make_inputs(2, 3, 5, 6, 4, 6, torch.float32)
    out = polarity_linear_attention(q, k.double(), v, power)
    assert out.dtype == torch.float64
    expected = polarity_linear_attention_reference(q.double(), k.double(), v.double(),
                                                   power.double())
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16])
@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_non_finite_inputs_propagate(monkeypatch, mode, dtype):
    """No value checks: a NaN in query i gives NaN in row i only; a NaN in a key reaches the
    state and so every row of that (batch, head); a NaN in value channel c, column c of every
    row of that (batch, head); other heads stay finite. Every implementation gives the same NaN
    pattern."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    q, k, v, power = make_inputs(2, 2, 7, 5, 4, 6, dtype)
    q[0, 0, 3, 1] = float('nan')
    k[1, 1, 2, 0] = float('nan')
    v[0, 1, 4, 5] = float('nan')
    out = polarity_linear_attention(q, k, v, power)
    expected = torch.zeros(2, 2, 7, 6, dtype=torch.bool)
    expected[0, 0, 3] = True
    expected[1, 1] = True
    expected[0, 1, :, 5] = True
    assert torch.equal(out.isnan(), expected)


BAD_CALLS = [
    ('q rank', lambda q, k, v, p: (q[0], k, v, p), 'q must have 4 dimensions'),
    ('k rank', lambda q, k, v, p: (q, k[..., None], v, p), 'k must have 4 dimensions'),
    ('batch', lambda q, k, v, p: (q, k[:1], v[:1], p), 'q and k must have the same batch size'),
    ('v batch', lambda q, k, v, p: (q, k, v[:1], p), 'q and v must have the same batch size'),
    ('heads', lambda q, k, v, p: (q, k, v[:, :1], p), 'q and v must have the same number of heads'),
    ('k heads', lambda q, k, v, p: (q, k[:, :1], v, p),
     'q and k must have the same number of heads'),
    ('head dim', lambda q, k, v, p: (q, k[..., :3], v, p), 'q and k must have the same head dim'),
    ('tokens', lambda q, k, v, p: (q, k, v[:, :, :4], p),
     'k and v must have the same number of tokens'),
    ('odd dv', lambda q, k, v, p: (q, k, v[..., :5], p), 'v must have an even'),
    ('no keys', lambda q, k, v, p: (q, k[:, :, :0], v[:, :, :0], p), 'at least one token'),
    ('power shape', lambda q, k, v, p: (q, k, v, p[:, :3]), r'power must have shape \[3, 4\]'),
    ('power 4d', lambda q, k, v, p: (q, k, v, p[None]), r'power must have shape'),
    ('int q', lambda q, k, v, p: (q.long(), k, v, p), 'q must be a floating-point tensor'),
    ('int power', lambda q, k, v, p: (q, k, v, p.long()), 'power must be a floating-point tensor'),
    ('device', lambda q, k, v, p: (q, k.to('meta'), v, p), 'k is on meta but q is on cpu'),
    ('power device', lambda q, k, v, p: (q, k, v, p.to('meta')), 'power is on meta'),
]


@pytest.mark.parametrize('mutate, message', [c[1:] for c in BAD_CALLS],
                         ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_raise_value_error(mutate, message):
    inputs = make_inputs(2, 3, 5, 6, 4, 6, torch.float32)
    with pytest.raises(ValueError, match=message):
        polarity_linear_attention(*mutate(*inputs))


@pytest.mark.parametrize('eps', [-1.0, float('inf'), float('nan'), True])
def test_bad_eps_raises_value_error(eps):
    inputs = make_inputs(1, 1, 2, 2, 2, 2, torch.float32)
    with pytest.raises(ValueError, match='eps must be a non-negative finite number'):
        polarity_linear_attention(*inputs, eps=eps)


def test_value_error_names_shapes():
    q, k, v, power = make_inputs(2, 3, 5, 6, 4, 6, torch.float32)
    with pytest.raises(ValueError, match=r'\[2x3x5x4\] and \[2x3x6x3\]'):
        polarity_linear_attention(q, k[..., :3], v, power)


@pytest.mark.cuda
@pytest.mark.parametrize('dtype, tol', [(torch.float32, 1e-4), (torch.float16, 2e-3),
                                        (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize('shape', [(1, 1, 1, 1, 1, 2), (2, 3, 7, 49, 16, 32),
                                   (2, 2, 333, 50, 32, 64), (1, 2, 50, 333, 64, 64),
                                   (2, 1, 3136, 3136, 64, 64)])
def test_cuda_matches_reference(compiled, shape, dtype, tol):
    inputs = make_inputs(*shape, dtype, device='cuda')
    check_against_reference(inputs, tol)


@pytest.mark.cuda
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
def test_cuda_opcheck(compiled, dtype):
    q, k, v, power = make_inputs(2, 3, 37, 300, 8, 6, dtype, device='cuda', away_from_zero=True)
    inputs = [t.requires_grad_() for t in (q, k, v, power)]
    torch.library.opcheck(compiled.polarity_linear_attention_forward, (*inputs, 1e-6))


@pytest.mark.cuda
def test_cuda_non_contiguous_and_deterministic(compiled):
    q, k, v, power = make_inputs(2, 3, 500, 700, 32, 64, torch.float32, device='cuda')
    inputs = [t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (q, k, v)] + [power]
    out_a, grads_a, grad_out = forward_backward(polarity_linear_attention, inputs)
    out_b, grads_b, _ = forward_backward(polarity_linear_attention, inputs, grad_out)
    assert torch.equal(out_a, out_b) and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    check_against_reference(inputs, 1e-4)


@pytest.mark.cuda
def test_cuda_autocast_runs_in_fp32(compiled):
    q, k, v, power = make_inputs(2, 2, 196, 196, 32, 32, torch.float32, device='cuda')
    expected = polarity_linear_attention(q, k, v, power)
    with torch.autocast('cuda', dtype=torch.float16):
        out = polarity_linear_attention(q.half(), k.half(), v.half(), power)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert_close_scaled('autocast out', out, expected, 0.05)


@pytest.mark.cuda
def test_cuda_exact_zeros_have_zero_gradient(compiled):
    q, k, v, power = make_inputs(1, 2, 9, 8, 4, 6, torch.float32, device='cuda')
    q[..., ::3, 1] = 0
    k[..., ::2, 2] = 0
    out, grads, grad_out = forward_backward(polarity_linear_attention, (q, k, v, power))
    ref_out, ref_grads = reference_fp64((q, k, v, power), grad_out)
    assert_close_scaled('out', out, ref_out, 1e-4)
    for name, grad, ref_grad in zip(('dq', 'dk', 'dv', 'dpower'), grads, ref_grads):
        assert_close_scaled(name, grad, ref_grad, 1e-4)
