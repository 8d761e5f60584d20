"""laplacian_kernel: compiled CPU/CUDA kernels against the pure-PyTorch reference, forward and
backward, the registered operators (opcheck), and the portable CPU kernels.

Inputs follow the model: q and k ~ N(0, 1/D), i.e. queries scaled by D^-1/2. Tests of the compiled
path use the ``compiled_ops`` fixture (conftest.py): it loads the extension and sets
MMLINATTN_OPS=compiled, so a missing extension fails them instead of silently testing the
reference against itself.
"""
import os
import subprocess
import sys

import pytest
import torch

from mmlinattn.ops import laplacian_kernel
from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference

SIZES = (1, 7, 49, 50, 333)  # 49, 50, 333: key counts that are not multiples of the vector width
HEAD_DIMS = (1, 16, 17, 32, 33, 64, 65)
LAM = 4.0
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)


@pytest.fixture
def compiled(compiled_ops):
    return compiled_ops


def make_inputs(b, h, n, m, d, dtype=torch.float64, device='cpu', seed=0):
    gen = torch.Generator().manual_seed(seed)
    scale = max(d, 1)**-0.5
    q = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64) * scale
    k = torch.randn(b, h, m, d, generator=gen, dtype=torch.float64) * scale
    return (q.to(device=device, dtype=dtype).requires_grad_(),
            k.to(device=device, dtype=dtype).requires_grad_())


def reference_and_grads(q, k, grad, compute_dtype=None):
    """Reference output and (dq, dk) by autograd, optionally computed in a wider dtype."""
    dtype = compute_dtype or q.dtype
    q_ref = q.detach().to(dtype).requires_grad_()
    k_ref = k.detach().to(dtype).requires_grad_()
    out = laplacian_kernel_reference(q_ref, k_ref, LAM)
    dq, dk = torch.autograd.grad(out, (q_ref, k_ref), grad.to(dtype))
    return out, dq, dk


def assert_close_scaled(actual, expected, rel, name):
    """max |actual - expected| <= rel * max |expected| (elementwise rtol is meaningless for sums
    with cancellation, such as the gradients)."""
    actual, expected = actual.to(torch.float64), expected.to(torch.float64)
    scale = expected.abs().max().item() if expected.numel() else 0.0
    err = (actual - expected).abs().max().item() if expected.numel() else 0.0
    assert err <= rel * scale + 1e-30, f'{name}: max error {err:.3g} > {rel:g} * {scale:.3g}'


def run_op(q, k, grad):
    out = laplacian_kernel(q, k, LAM)
    dq, dk = torch.autograd.grad(out, (q, k), grad)
    return out, dq, dk


@pytest.mark.parametrize('dtype,rtol', [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize('d', HEAD_DIMS)
def test_cpu_matches_reference_on_shape_grid(compiled, dtype, rtol, d):
    for n in SIZES:
        for m in SIZES:
            q, k = make_inputs(2, 2, n, m, d, dtype, seed=n * 1000 + m)
            grad = torch.randn(2, 2, n, m, dtype=dtype)
            out, dq, dk = run_op(q, k, grad)
            out_ref, dq_ref, dk_ref = reference_and_grads(q, k, grad)
            assert out.dtype == dtype and out.shape == (2, 2, n, m)
            torch.testing.assert_close(out, out_ref, rtol=rtol, atol=rtol * 1e-3)
            assert_close_scaled(dq, dq_ref, rtol, f'dq n={n} m={m} d={d}')
            assert_close_scaled(dk, dk_ref, rtol, f'dk n={n} m={m} d={d}')


def test_cpu_large_case_matches_fp64_reference(compiled):
    """LaplacianFormer-tiny stage 1 at 224^2: N = 56^2 queries, M = 49 landmarks, D = 32."""
    q, k = make_inputs(2, 2, 56 * 56, 49, 32, torch.float32)
    grad = torch.randn(2, 2, 56 * 56, 49)
    out, dq, dk = run_op(q, k, grad)
    out_ref, dq_ref, dk_ref = reference_and_grads(q, k, grad, torch.float64)
    torch.testing.assert_close(out.double(), out_ref, rtol=1e-5, atol=1e-8)
    assert_close_scaled(dq, dq_ref, 1e-5, 'dq')
    assert_close_scaled(dk, dk_ref, 1e-5, 'dk')


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_gradcheck_fp64(monkeypatch, mode):
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    q, k = make_inputs(1, 2, 5, 4, 3, seed=3)
    # gradcheck perturbs by 1e-6: keep every |q_ic - k_jc| well away from the tie at 0.
    assert (q.detach()[..., :, None, :] - k.detach()[..., None, :, :]).abs().min() > 1e-3
    assert torch.autograd.gradcheck(lambda a, b: laplacian_kernel(a, b, LAM), (q, k))


def test_ties_follow_reference_sign_convention(compiled):
    """At exact ties (q row = k row, or one equal coordinate) sign(0) = 0, as in the reference."""
    q, k = make_inputs(2, 1, 6, 5, 4, seed=4)
    with torch.no_grad():
        k[:, :, 0] = q[:, :, 2]  # whole rows equal
        k[:, :, 1, 1] = q[:, :, 3, 1]  # one coordinate equal
        q[:, :, 5] = q[:, :, 4]  # repeated query rows
    grad = torch.randn(2, 1, 6, 5, dtype=torch.float64)
    out, dq, dk = run_op(q, k, grad)
    out_ref, dq_ref, dk_ref = reference_and_grads(q, k, grad)
    assert torch.equal(out[:, :, 2, 0], torch.ones_like(out[:, :, 2, 0]))
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(dq, dq_ref, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(dk, dk_ref, rtol=1e-12, atol=1e-15)


def _thread_count_case():
    q, k = make_inputs(1, 2, 2100, 5, 8, torch.float32)
    grad = torch.randn(1, 2, 2100, 5, generator=torch.Generator().manual_seed(1))
    return q, k, grad


def test_backward_is_deterministic_across_thread_counts(compiled, tmp_path):
    """dk sums over more than one fixed query chunk (N > 1024) in a fixed order, so results are
    bitwise equal for any thread count. The other count runs in a child process: changing
    torch's thread count in-process breaks torch.linalg.inv for later tests on this platform."""
    threads = 1 if torch.get_num_threads() > 1 else 3
    out_file = tmp_path / 'single.pt'
    script = (f'import sys, torch; sys.path.insert(0, {TESTS_DIR!r}); '
              f'torch.set_num_threads({threads}); '
              'import test_ops_laplacian_kernel as t; q, k, g = t._thread_count_case(); '
              f'torch.save(t.run_op(q, k, g), {str(out_file)!r})')
    env = dict(os.environ, MMLINATTN_OPS='compiled')
    subprocess.run([sys.executable, '-c', script], check=True, env=env, cwd=REPO_ROOT)
    other = torch.load(out_file)
    here = run_op(*_thread_count_case())
    for a, b in zip(here, other):
        assert torch.equal(a, b)


def test_only_requested_gradients_are_computed(compiled):
    q, k = make_inputs(1, 1, 9, 4, 5)
    k = k.detach()
    out = laplacian_kernel(q, k, LAM)
    out.sum().backward()
    out_ref, dq_ref, _ = reference_and_grads(q, k, torch.ones_like(out))
    assert k.grad is None
    torch.testing.assert_close(q.grad, dq_ref, rtol=1e-10, atol=1e-14)


def test_non_contiguous_inputs(compiled):
    base_q, _ = make_inputs(2, 7, 3, 1, 4, seed=5)
    q = base_q.transpose(1, 2)  # [2, 3, 7, 4] view
    k_base = torch.randn(2, 5, 3, 8, dtype=torch.float64) * 0.5
    k = k_base[..., ::2].transpose(1, 2).requires_grad_()  # [2, 3, 5, 4] strided view
    assert not q.is_contiguous() and not k.is_contiguous()
    grad = torch.randn(2, 3, 5, 7, dtype=torch.float64).transpose(-1, -2)
    out, dq, dk = run_op(q, k, grad)
    out_ref, dq_ref, dk_ref = reference_and_grads(q, k, grad)
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=0)
    torch.testing.assert_close(dq, dq_ref, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(dk, dk_ref, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize('shape_q,shape_k', [((0, 2, 5, 4), (0, 2, 3, 4)),
                                             ((2, 2, 0, 4), (2, 2, 3, 4)),
                                             ((2, 2, 5, 4), (2, 2, 0, 4)),
                                             ((2, 2, 5, 0), (2, 2, 3, 0))])
@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_empty_inputs(monkeypatch, mode, shape_q, shape_k):
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    q = torch.randn(shape_q, dtype=torch.float64, requires_grad=True)
    k = torch.randn(shape_k, dtype=torch.float64, requires_grad=True)
    out = laplacian_kernel(q, k, LAM)
    assert out.shape == (*shape_q[:3], shape_k[2])
    assert torch.equal(out, torch.ones_like(out))  # empty, or D = 0: exp(0)
    out.sum().backward()
    assert q.grad.shape == q.shape and not q.grad.any()
    assert k.grad.shape == k.shape and not k.grad.any()


def test_reference_is_used_when_forced(compiled, monkeypatch):
    q, k = make_inputs(1, 1, 4, 3, 2)
    compiled_out = laplacian_kernel(q, k, LAM)
    assert 'mmlinattn_laplacian_kernel_forward' in compiled_out.grad_fn.name()
    monkeypatch.setenv('MMLINATTN_OPS', 'reference')
    forced = laplacian_kernel(q, k, LAM)
    assert 'mmlinattn' not in forced.grad_fn.name()
    torch.testing.assert_close(forced, compiled_out, rtol=1e-12, atol=0)


def test_bf16_inputs_run_the_bf16_kernel(compiled):
    """bf16 (CPU autocast's dtype) has a kernel of its own: it reads and writes bf16 and computes
    in fp32, so the results are the fp64 reference's up to bf16 rounding of the inputs, the saved
    output and the results (relative to the largest entry), with no fp32 copy of the tensors."""
    q, k = make_inputs(2, 3, 300, 49, 32, torch.bfloat16)  # 300 rows: two backward chunks
    grad = torch.randn(2, 3, 300, 49).to(torch.bfloat16)
    got = run_op(q, k, grad)
    assert all(t.dtype == torch.bfloat16 for t in got)
    assert 'mmlinattn_laplacian_kernel_forward' in got[0].grad_fn.name()
    for actual, expected in zip(got, reference_and_grads(q, k, grad.double(), torch.float64)):
        scale = expected.abs().max().item()
        torch.testing.assert_close(actual.double(), expected, rtol=0, atol=1e-2 * scale)


def test_fp16_inputs_run_the_fp32_kernel(compiled):
    """The CPU kernels have fp32, fp64 and bf16 variants: fp16 inputs run in fp32 (the ops'
    compute dtype, as in the reference) and the result comes back in fp16."""
    dtype = torch.float16
    q, k = make_inputs(1, 2, 9, 5, 8, dtype)
    grad = torch.randn(1, 2, 9, 5).to(dtype)
    out, dq, dk = run_op(q, k, grad)
    assert out.dtype == dq.dtype == dk.dtype == dtype
    out_ref, dq_ref, dk_ref = reference_and_grads(q, k, grad.float(), torch.float32)
    torch.testing.assert_close(out, out_ref.to(dtype))
    torch.testing.assert_close(dq, dq_ref.to(dtype))
    torch.testing.assert_close(dk, dk_ref.to(dtype))


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_mixed_dtypes_are_promoted(monkeypatch, mode):
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    q, k = make_inputs(1, 2, 4, 3, 5, torch.float32)
    out = laplacian_kernel(q, k.double(), LAM)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, laplacian_kernel_reference(q.double(), k.double(), LAM))


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_non_finite_inputs_propagate(monkeypatch, mode):
    """No value checks: a NaN in q_i gives NaN in row i (and its gradients), a NaN in k_j NaN in
    column j; an infinite coordinate gives exp(-inf) = 0. Same in every implementation."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    q, k = make_inputs(1, 1, 6, 5, 4, seed=6)
    with torch.no_grad():
        q[0, 0, 1, 2] = float('nan')
        k[0, 0, 3, 0] = float('nan')
        q[0, 0, 4, 1] = float('inf')
    out = laplacian_kernel(q, k, LAM)
    expected_nan = torch.zeros(6, 5, dtype=torch.bool)
    expected_nan[1, :] = expected_nan[:, 3] = True
    assert torch.equal(out[0, 0].isnan(), expected_nan)
    assert (out[0, 0, 4][~expected_nan[4]] == 0).all()
    dq, dk = torch.autograd.grad(out.sum(), (q, k))
    assert dq[0, 0, 1].isnan().all() and dk.isnan().any()


def _t(*shape, dtype=torch.float32, device='cpu'):
    return torch.zeros(shape, dtype=dtype, device=device)


@pytest.mark.parametrize('q,k,lam,match', [
    (_t(2, 3, 4), _t(2, 2, 3, 4), LAM, r'q must have 4 dimensions, got shape \[2x3x4\]'),
    (_t(2, 2, 3, 4), _t(1, 2, 2, 3, 4), LAM, r'k must have 4 dimensions, got shape \[1x2x2x3x4\]'),
    (_t(2, 2, 5, 4), _t(3, 2, 3, 4), LAM,
     r'batch size .* got 2 and 3 .*\[2x2x5x4\] and \[3x2x3x4\]'),
    (_t(2, 2, 5, 4), _t(2, 4, 3, 4), LAM, r'number of heads .* got 2 and 4'),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 8), LAM, r'head dim .* got 4 and 8'),
    (_t(2, 2, 5, 4, dtype=torch.int64), _t(2, 2, 3, 4), LAM, r'q must be a floating-point .*int64'),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 4, dtype=torch.int32), LAM, r'k must be a floating-point .*int32'),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 4, device='meta'), LAM, r'k is on meta but q is on cpu'),
    ([[1.0]], _t(2, 2, 3, 4), LAM, r'q must be a torch.Tensor, got list'),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 4), 0.0, r'lam must be a positive finite number, got 0.0'),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 4), -1, r'lam must be a positive finite number, got -1'),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 4), float('nan'), r'lam must be a positive finite number'),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 4), float('inf'), r'lam must be a positive finite number'),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 4), True, r'lam must be a positive finite number, got True'),
])
def test_bad_calls_raise_value_error(q, k, lam, match):
    with pytest.raises(ValueError, match=match):
        laplacian_kernel(q, k, lam)


@pytest.mark.parametrize('q,k,lam', [
    (_t(2, 2, 5, 4), _t(2, 2, 3, 5), LAM),
    (_t(2, 2, 5, 4), _t(2, 1, 3, 4), LAM),
    (_t(2, 5, 4), _t(2, 3, 4), LAM),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 4, dtype=torch.float64), LAM),
    (_t(2, 2, 5, 4), _t(2, 2, 3, 4), -2.0),
])
def test_compiled_op_checks_its_own_arguments(compiled, q, k, lam):
    """The registered op refuses bad shapes itself (never reads out of bounds) with ValueError."""
    with pytest.raises(ValueError):
        compiled.laplacian_kernel_forward(q, k, lam)


def test_compiled_backward_checks_shapes(compiled):
    q, k = _t(2, 2, 5, 4), _t(2, 2, 3, 4)
    with pytest.raises(ValueError, match='grad_out and out must have shape'):
        compiled.laplacian_kernel_backward(_t(2, 2, 5, 4), q, k, _t(2, 2, 5, 3), LAM, True, True)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
def test_opcheck(compiled, dtype):
    """Schema, fake (meta) kernel, autograd registration and AOT dispatch of both operators."""
    q, k = make_inputs(2, 2, 37, 19, 33, dtype)
    torch.library.opcheck(compiled.laplacian_kernel_forward, (q, k, LAM))
    out = compiled.laplacian_kernel_forward(q.detach(), k.detach(), LAM)
    for need_dq, need_dk in ((True, True), (True, False), (False, True)):
        torch.library.opcheck(compiled.laplacian_kernel_backward,
                              (torch.randn_like(out), q.detach(), k.detach(), out, LAM, need_dq,
                               need_dk))


@pytest.mark.compiled_ops
def test_portable_kernels_match_reference(tmp_path):
    """The portable kernels (CPUs without AVX-512) on the odd shapes, in a child process with
    ATEN_CPU_CAPABILITY=default, the switch that also selects torch's own baseline kernels."""
    script = (f'import sys, torch; sys.path.insert(0, {TESTS_DIR!r}); '
              'import test_ops_laplacian_kernel as t; t.check_odd_shapes()')
    env = dict(os.environ, MMLINATTN_OPS='compiled', ATEN_CPU_CAPABILITY='default')
    subprocess.run([sys.executable, '-c', script], check=True, env=env, cwd=REPO_ROOT)


def check_odd_shapes():
    for dtype, rtol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        for n, m, d in ((1, 1, 1), (7, 49, 17), (333, 50, 33), (300, 17, 65)):
            q, k = make_inputs(2, 1, n, m, d, dtype, seed=n + m)
            grad = torch.randn(2, 1, n, m, dtype=dtype)
            out, dq, dk = run_op(q, k, grad)
            out_ref, dq_ref, dk_ref = reference_and_grads(q, k, grad)
            assert_close_scaled(out, out_ref, rtol, 'out')
            assert_close_scaled(dq, dq_ref, rtol, 'dq')
            assert_close_scaled(dk, dk_ref, rtol, 'dk')


# ---- CUDA (run by tools/dev/gpu_check.sh; skipped without a GPU) ----

CUDA_DTYPES = [(torch.float32, 1e-5, 1e-5), (torch.float16, 2e-3, 5e-3),
               (torch.bfloat16, 1e-2, 3e-2)]


@pytest.mark.cuda
@pytest.mark.parametrize('dtype,out_tol,grad_tol', CUDA_DTYPES)
@pytest.mark.parametrize('n,m,d', [(1, 1, 1), (7, 49, 32), (64, 64, 16), (65, 63, 33),
                                   (333, 50, 64), (50, 333, 100), (56 * 56, 49, 32)])
def test_cuda_matches_reference(compiled, dtype, out_tol, grad_tol, n, m, d):
    q, k = make_inputs(2, 2, n, m, d, dtype, device='cuda', seed=n + m + d)
    grad = torch.randn(2, 2, n, m, device='cuda').to(dtype)
    out, dq, dk = run_op(q, k, grad)
    # Ground truth from the same (rounded) inputs, computed in fp64.
    out_ref, dq_ref, dk_ref = reference_and_grads(q, k, grad, torch.float64)
    assert out.dtype == dq.dtype == dk.dtype == dtype
    torch.testing.assert_close(out.double(), out_ref, rtol=out_tol, atol=out_tol * 1e-2)
    assert_close_scaled(dq, dq_ref, grad_tol, 'dq')
    assert_close_scaled(dk, dk_ref, grad_tol, 'dk')


@pytest.mark.cuda
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
def test_cuda_opcheck(compiled, dtype):
    q, k = make_inputs(2, 2, 37, 19, 33, dtype, device='cuda')
    torch.library.opcheck(compiled.laplacian_kernel_forward, (q, k, LAM))
    out = compiled.laplacian_kernel_forward(q.detach(), k.detach(), LAM)
    torch.library.opcheck(compiled.laplacian_kernel_backward,
                          (torch.randn_like(out), q.detach(), k.detach(), out, LAM, True, True))


@pytest.mark.cuda
def test_cuda_backward_is_deterministic(compiled):
    q, k = make_inputs(2, 2, 4096, 256, 32, torch.float32, device='cuda')
    grad = torch.randn(2, 2, 4096, 256, device='cuda')
    first = run_op(q, k, grad)
    second = run_op(q, k, grad)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.cuda
def test_cuda_ties_non_contiguous_and_empty(compiled):
    q, k = make_inputs(2, 3, 7, 5, 4, device='cuda', dtype=torch.float32)
    with torch.no_grad():
        k[:, :, 0] = q[:, :, 2]
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # non-contiguous [2, 7, 3, 4], [2, 5, 3, 4]
    kt = kt[:, :3]
    grad = torch.randn(2, 7, 3, 3, device='cuda')
    out, dq, dk = run_op(qt, kt, grad)
    out_ref, dq_ref, dk_ref = reference_and_grads(qt, kt, grad, torch.float64)
    torch.testing.assert_close(out.double(), out_ref, rtol=1e-5, atol=1e-7)
    assert_close_scaled(dq, dq_ref, 1e-5, 'dq')
    assert_close_scaled(dk, dk_ref, 1e-5, 'dk')
    empty_q = torch.randn(0, 2, 5, 4, device='cuda', requires_grad=True)
    empty_k = torch.randn(0, 2, 3, 4, device='cuda', requires_grad=True)
    out = laplacian_kernel(empty_q, empty_k, LAM)
    out.sum().backward()
    assert out.shape == (0, 2, 5, 3) and empty_q.grad.shape == empty_q.shape
