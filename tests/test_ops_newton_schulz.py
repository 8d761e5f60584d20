"""newton_schulz_inverse: compiled CPU/CUDA kernels against the reference iteration and against
torch.linalg.inv, on Laplacian-kernel Gram matrices of random landmarks (the LaplacianFormer use);
the gradient of the computed iterate in every implementation; the registered operators.

Tests of the compiled path use the ``compiled_ops`` fixture (conftest.py: loads the extension,
MMLINATTN_OPS=compiled), so a missing extension fails them.
"""
import pytest
import torch

from mmlinattn.ops import newton_schulz_inverse
from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference
from mmlinattn.ops.newton_schulz.reference import (newton_schulz_inverse_reference,
                                                   newton_schulz_residual_reference)

EPS = 1e-2


@pytest.fixture
def compiled(compiled_ops):
    return compiled_ops


def landmark_gram(batch, m, d=32, lam=4.0, dtype=torch.float32, device='cpu', seed=0):
    """Laplacian-kernel Gram matrices [batch, m, m] of landmarks ~ N(0, 1/d): SPD."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, m, d, generator=gen, dtype=torch.float64) / d**0.5
    return laplacian_kernel_reference(x, x, lam)[:, 0].to(device=device, dtype=dtype)


def exact_residual(a, v, eps=EPS):
    """||I - P V||_F / sqrt(M) in fp64."""
    return newton_schulz_residual_reference(a.double(), v.double(), eps)


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
@pytest.mark.parametrize('m', [1, 16, 49, 128, 256])
def test_converges_on_landmark_gram_matrices(monkeypatch, mode, m):
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    a = landmark_gram(3, m, seed=m)
    v, residual = newton_schulz_inverse(a, return_residual=True)
    assert v.dtype == torch.float32 and residual.dtype == torch.float32
    assert residual.shape == (3, )
    assert residual.max().item() <= 1e-4
    torch.testing.assert_close(residual.double(), exact_residual(a, v), rtol=0.05, atol=2e-6)
    p = a.double() + EPS * torch.eye(m, dtype=torch.float64)
    torch.testing.assert_close(v.double(), torch.linalg.inv(p), rtol=0, atol=1e-4 * (1 / EPS))


# Sizes that exercise every register-tile shape of the CPU kernel: 8-row blocks 1..3 vectors wide,
# single remainder rows 1..4 vectors wide, a ragged column tile or none.
@pytest.mark.parametrize('m', [1, 16, 17, 23, 49, 50, 65, 100, 256])
@pytest.mark.parametrize('symmetric', [True, False])
def test_compiled_equals_reference_step_for_step(compiled, m, symmetric):
    a = landmark_gram(2, m, seed=7)
    if not symmetric:
        a = a + 0.01 * torch.rand(a.shape, generator=torch.Generator().manual_seed(0))
    for iters in (1, 2, 3, 5, 8, 20):
        v = newton_schulz_inverse(a, iters=iters)
        v_ref = newton_schulz_inverse_reference(a, iters, EPS)
        err = (v - v_ref).abs().max() / v_ref.abs().max()
        assert err <= 1e-5, f'iters={iters}: relative error {err:.3g}'
    a64 = a.double()
    for iters in (1, 2, 5):
        v = newton_schulz_inverse(a64, iters=iters)
        assert v.dtype == torch.float64
        torch.testing.assert_close(v, newton_schulz_inverse_reference(a64, iters, EPS),
                                   rtol=1e-12, atol=1e-14)


def newton_schulz_steps(a, iters, eps=EPS, dtype=torch.float64):
    """The iteration as the paper writes it: V0 = I/||P||_inf, V <- 2V - V P V (fp64 unless
    dtype says otherwise)."""
    p = a.to(dtype) + eps * torch.eye(a.shape[-1], dtype=dtype)
    v = torch.eye(a.shape[-1], dtype=dtype) / p.abs().sum(-1).amax(-1)[..., None, None]
    for _ in range(iters):
        v = 2 * v - v @ p @ v
    return v


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
@pytest.mark.parametrize('m', [16, 49, 256])
def test_product_form_computes_the_newton_schulz_iterates(monkeypatch, mode, m):
    """Product steps V(I + R), R <- R^2 and the closing 2V - V P V are the paper's iterates: equal
    to them in fp64 at every step count, fp32 within its rounding (the product form's rounding
    is not self-correcting, the last step corrects it), symmetric or not."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    a = landmark_gram(2, m, seed=16)
    a_general = a + 0.01 * torch.rand(a.shape, generator=torch.Generator().manual_seed(0))
    for x in (a, a_general):
        for iters in (1, 2, 3, 5, 8, 20):
            exact = newton_schulz_steps(x, iters)
            for dtype, rtol in ((torch.float32, 2e-5), (torch.float64, 1e-12)):
                v = newton_schulz_inverse(x.to(dtype), iters=iters).double()
                err = ((v - exact).abs().max() / exact.abs().max()).item()
                assert err <= rtol, f'{dtype}, iters={iters}: relative error {err:.3g}'
    inverse = torch.linalg.inv(a.double() + EPS * torch.eye(m, dtype=torch.float64))
    v = newton_schulz_inverse(a)  # converged: as accurate as the paper's 20 steps in fp32
    err = (v.double() - inverse).abs().max()
    err_steps = (newton_schulz_steps(a, 20, dtype=torch.float32).double() - inverse).abs().max()
    assert err <= 2 * err_steps, (err, err_steps)


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_steps_past_convergence_change_nothing(monkeypatch, mode):
    """A matrix stops once ||R||_inf <= u: 20 and 60 allowed steps give the same V, bit for bit,
    in a batch whose other matrix has not converged by then (each matrix stops on its own)."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    a = torch.cat([landmark_gram(1, 49, seed=17), unconverged_gram().float()])
    v20, residual = newton_schulz_inverse(a, iters=20, eps=UNCONVERGED_EPS, return_residual=True)
    assert residual[0] <= 1e-4 < 0.1 < residual[1]
    v60 = newton_schulz_inverse(a, iters=60, eps=UNCONVERGED_EPS)
    assert torch.equal(v20[0], v60[0])
    assert not torch.allclose(v20[1], v60[1])
    torch.testing.assert_close(v20[1:], newton_schulz_inverse(a[1:], iters=20,
                                                               eps=UNCONVERGED_EPS))


@pytest.mark.parametrize('iters', [7, 20])
def test_batched_and_single_matrix_paths_agree_bitwise(compiled, iters):
    """With fewer matrices than threads the CPU kernel splits each step over row blocks, otherwise
    it runs whole matrices per thread; every entry is summed in the same order either way, and
    each matrix stops (20 steps) on its own."""
    a = landmark_gram(3, 70, seed=8)
    v, residual = newton_schulz_inverse(a, iters=iters, return_residual=True)
    for n in range(3):
        v_n, residual_n = newton_schulz_inverse(a[n:n + 1], iters=iters, return_residual=True)
        assert torch.equal(v_n[0], v[n]) and torch.equal(residual_n[0], residual[n])


def test_first_step_is_the_documented_formula(compiled):
    """V0 = I / ||P||_inf, V1 = 2 V0 - V0 P V0."""
    a = landmark_gram(1, 5, seed=1).double()
    p = a + EPS * torch.eye(5, dtype=torch.float64)
    v0 = torch.eye(5, dtype=torch.float64) / p.abs().sum(-1).max()
    torch.testing.assert_close(newton_schulz_inverse(a, iters=1), 2 * v0 - v0 @ p @ v0,
                               rtol=1e-14, atol=0)


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_converged_backward_equals_autograd_of_inverse(monkeypatch, mode):
    """At convergence the gradient of the iterate is the gradient of (a + eps I)^-1."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    a = landmark_gram(2, 12, dtype=torch.float64, seed=2).requires_grad_()
    grad = torch.randn(2, 12, 12, dtype=torch.float64)
    (grad_a, ) = torch.autograd.grad(newton_schulz_inverse(a, iters=40), a, grad)
    a_ref = a.detach().clone().requires_grad_()
    inverse = torch.linalg.inv(a_ref + EPS * torch.eye(12, dtype=torch.float64))
    (grad_ref, ) = torch.autograd.grad(inverse, a_ref, grad)
    torch.testing.assert_close(grad_a, grad_ref, rtol=1e-8, atol=1e-8)


def reference_gradient(a, grad, iters, eps=EPS):
    """Autograd through the reference iteration (its steps and its start V0 = I/||P||_inf)."""
    a_ref = a.detach().clone().requires_grad_()
    (grad_ref, ) = torch.autograd.grad(newton_schulz_inverse_reference(a_ref, iters, eps), a_ref,
                                       grad)
    return grad_ref


def unconverged_gram(m=49, clusters=7, seed=10):
    """The Gram matrix of 7 landmarks each repeated 7 times: rank 7, so with eps = 1e-5 P has
    42 eigenvalues 1e-5 against ||P||_inf ~ 7, and 20 steps from I/||P||_inf leave a residual of
    ~0.5: the iteration has not converged (in fp64; fp32 rounding is amplified ~1e5x there)."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(1, 1, clusters, 32, generator=gen, dtype=torch.float64) / 32**0.5
    x = centres.repeat_interleave(m // clusters + 1, dim=2)[:, :, :m]
    return laplacian_kernel_reference(x, x, 4.0)[:, 0]


UNCONVERGED_EPS = 1e-5


@pytest.mark.parametrize('case,dtype,rtol', [
    ('converged', torch.float32, 1e-5), ('converged', torch.float64, 1e-9),
    ('not symmetric', torch.float32, 1e-5), ('not symmetric', torch.float64, 1e-9),
    ('unconverged', torch.float64, 1e-9)])
def test_compiled_gradient_equals_reference_at_20_steps(compiled, case, dtype, rtol):
    """One gradient definition: the compiled backward is autograd through the reference's 20
    steps and its start, whether or not the iteration has converged, for symmetric and general
    inputs."""
    a64, eps = landmark_gram(3, 49, dtype=torch.float64, seed=11), EPS
    if case == 'unconverged':
        a64, eps = unconverged_gram().expand(3, 49, 49).clone(), UNCONVERGED_EPS
    if case == 'not symmetric':
        a64 = a64 + 0.05 * torch.rand(a64.shape, generator=torch.Generator().manual_seed(0),
                                      dtype=torch.float64)
    a = a64.to(dtype)
    _, residual = newton_schulz_inverse(a, eps=eps, return_residual=True)
    assert (residual.min() > 0.1) == (case == 'unconverged'), residual
    a = a.requires_grad_()
    grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    (grad_a, ) = torch.autograd.grad(newton_schulz_inverse(a, iters=20, eps=eps), a, grad)
    grad_ref = reference_gradient(a64, grad.double(), 20, eps)
    err = ((grad_a.double() - grad_ref).abs().max() / grad_ref.abs().max()).item()
    assert err <= rtol, f'{case}: relative error {err:.3g}'


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
@pytest.mark.parametrize('iters', [3, 20])
def test_gradcheck(monkeypatch, mode, iters):
    """The gradient is that of the computed iterate: gradcheck holds after 3 steps, far from the
    inverse, including the start's dependence on ||P||_inf, and at 20 allowed steps, where the
    product steps stop early (symmetric and general inputs)."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    a = landmark_gram(2, 6, dtype=torch.float64, seed=12)
    a_general = a + 0.05 * torch.rand(a.shape, generator=torch.Generator().manual_seed(0),
                                      dtype=torch.float64)
    for x in (a, a_general):
        assert torch.autograd.gradcheck(lambda y: newton_schulz_inverse(y, iters=iters),
                                        (x.requires_grad_(), ))


@pytest.mark.parametrize('iters,batch', [(4, 2), (20, 2), (20, 1)])
def test_large_matrices_use_the_batched_path(compiled, iters, batch):
    """M above the tiled kernels' limit runs the batched-matmul forward and backward (the code
    the CUDA op uses for large M and fp64): equal to the reference, forward and backward, before
    convergence, with a matrix that stops early beside one that does not (masked steps), and with
    every matrix stopped (on the CPU the steps end there)."""
    eps = 1e-4
    a = torch.cat([landmark_gram(1, 520, dtype=torch.float64, seed=13),
                   unconverged_gram(520, clusters=40)])[:batch].requires_grad_()
    grad = torch.randn(a.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    v, residual = newton_schulz_inverse(a, iters=iters, eps=eps, return_residual=True)
    if iters == 20:
        assert residual[0] < 1e-9 and (batch == 1 or residual[1] > 0.1)
    # relative to each matrix's largest entry: the unconverged one amplifies rounding ~1e4x
    v_ref = newton_schulz_inverse_reference(a.detach(), iters, eps)
    assert ((v - v_ref).abs().amax((1, 2)) / v_ref.abs().amax((1, 2))).max() <= 1e-12
    (grad_a, ) = torch.autograd.grad(v, a, grad)
    grad_ref = reference_gradient(a, grad, iters, eps)
    assert ((grad_a - grad_ref).abs().amax((1, 2)) / grad_ref.abs().amax((1, 2))).max() <= 1e-10


def test_ill_conditioned_input_reports_large_residual(compiled):
    """A nearly singular P (eigenvalue 1e-9 next to 1) cannot converge in 20 steps from
    I/||P||: the residual says so instead of looking like a converged inverse."""
    eigenvalues = torch.tensor([1.0, 0.5, 1e-9, 0.25])
    basis, _ = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))
    a = (basis * eigenvalues) @ basis.T
    a = (a + a.T) / 2
    v, residual = newton_schulz_inverse(a[None], eps=0.0, return_residual=True)
    assert residual.item() > 0.1
    # a duplicated landmark makes the Gram matrix exactly singular: eps = 0 must not look converged
    gram = landmark_gram(1, 8, seed=3)
    gram[:, 7], gram[:, :, 7] = gram[:, 6], gram[:, :, 6]
    _, residual = newton_schulz_inverse(gram, eps=0.0, return_residual=True)
    assert residual.item() > 0.1


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_batch_dims_non_contiguous_and_empty(monkeypatch, mode):
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    a = landmark_gram(6, 9, seed=4).reshape(2, 3, 9, 9)
    a_t = a.transpose(-1, -2)  # symmetric, so the same matrices, as a non-contiguous view
    assert not a_t.is_contiguous()
    v, residual = newton_schulz_inverse(a_t, return_residual=True)
    assert v.shape == (2, 3, 9, 9) and residual.shape == (2, 3)
    torch.testing.assert_close(v, newton_schulz_inverse_reference(a, 20, EPS), rtol=1e-5,
                               atol=1e-5)
    for shape in [(0, 9, 9), (2, 0, 4, 4), (3, 0, 0)]:
        empty = torch.zeros(shape, requires_grad=True)
        v, residual = newton_schulz_inverse(empty, return_residual=True)
        assert v.shape == shape and residual.shape == shape[:-2]
        v.sum().backward()
        assert empty.grad.shape == shape


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_inputs_iterate_in_fp32(monkeypatch, mode, dtype):
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    a = landmark_gram(2, 16, seed=5).to(dtype)
    v, residual = newton_schulz_inverse(a, return_residual=True)
    assert v.dtype == dtype and residual.dtype == torch.float32
    v32 = newton_schulz_inverse_reference(a.float(), 20, EPS)
    torch.testing.assert_close(v, v32.to(dtype))  # within one rounding of the half dtype
    assert residual.max().item() <= 1e-4  # of the fp32 iterate, before rounding to dtype


def graph_node_names(t):
    names, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node.name() not in names:
            names.add(node.name())
            stack.extend(fn for fn, _ in node.next_functions)
    return names


def test_reference_is_used_when_forced(compiled, monkeypatch):
    a = landmark_gram(2, 6, seed=6).requires_grad_()
    compiled_out = newton_schulz_inverse(a)
    assert any('mmlinattn_newton_schulz_inverse' in n for n in graph_node_names(compiled_out))
    monkeypatch.setenv('MMLINATTN_OPS', 'reference')
    forced = newton_schulz_inverse(a)
    assert not any('mmlinattn' in n for n in graph_node_names(forced))
    torch.testing.assert_close(forced, compiled_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('mode', ['compiled', 'reference'])
def test_non_finite_input_gives_nan_without_error(monkeypatch, mode):
    """No value checks (they would sync the device): a NaN or Inf anywhere in a matrix makes
    that matrix's V (and its residual) NaN, in every implementation; other matrices are exact."""
    monkeypatch.setenv('MMLINATTN_OPS', mode)
    a = landmark_gram(3, 9, seed=14)
    a[0, 1, 2] = float('nan')
    a[1, 4, 4] = float('inf')
    v, residual = newton_schulz_inverse(a, return_residual=True)
    assert v[:2].isnan().all() and residual[:2].isnan().all()
    torch.testing.assert_close(v[2], newton_schulz_inverse_reference(a[2:], 20, EPS)[0])


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_opcheck(compiled, dtype):
    """Schema, fake (meta) kernel, autograd registration and AOT dispatch of both operators."""
    a = landmark_gram(3, 21, dtype=dtype, seed=15)
    for with_residual in (True, False):
        torch.library.opcheck(compiled.newton_schulz_inverse,
                              (a.clone().requires_grad_(), 5, EPS, with_residual))
    torch.library.opcheck(compiled.newton_schulz_inverse_backward,
                          (torch.randn_like(a), a, 5, EPS))


@pytest.mark.parametrize('a,kwargs,match', [
    (torch.ones(4), {}, r'a must have at least 2 dimensions, got shape \[4\]'),
    (torch.ones(2, 3, 4), {}, r'a must be a batch of square matrices \[..., M, M\], got shape '
     r'\[2x3x4\]'),
    (torch.ones(2, 3, 3, dtype=torch.int64), {}, r'a must be a floating-point tensor, got dtype '
     r'torch.int64'),
    (torch.eye(3), {'iters': 0}, r'iters must be a positive integer, got 0'),
    (torch.eye(3), {'iters': -2}, r'iters must be a positive integer, got -2'),
    (torch.eye(3), {'iters': 2.5}, r'iters must be a positive integer, got 2.5'),
    (torch.eye(3), {'iters': True}, r'iters must be a positive integer, got True'),
    (torch.eye(3), {'eps': -1e-3}, r'eps must be a non-negative finite number, got -0.001'),
    (torch.eye(3), {'eps': float('nan')}, r'eps must be a non-negative finite number, got nan'),
    ('not a tensor', {}, r'a must be a torch.Tensor, got str'),
])
def test_bad_calls_raise_value_error(a, kwargs, match):
    with pytest.raises(ValueError, match=match):
        newton_schulz_inverse(a, **kwargs)


@pytest.mark.parametrize('a,iters,eps', [
    (torch.ones(3, 3), 5, EPS),
    (torch.ones(2, 3, 4), 5, EPS),
    (torch.ones(2, 3, 3), 0, EPS),
    (torch.ones(2, 3, 3), 5, -1.0),
    (torch.ones(2, 3, 3, dtype=torch.float16), 5, EPS),
])
def test_compiled_op_checks_its_own_arguments(compiled, a, iters, eps):
    with pytest.raises(ValueError):
        compiled.newton_schulz_inverse(a, iters, eps, True)
    with pytest.raises(ValueError):
        compiled.newton_schulz_inverse_backward(a, a, iters, eps)


# ---- CUDA (run by tools/dev/gpu_check.sh; skipped without a GPU) ----

@pytest.mark.cuda
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize('m', [1, 16, 49, 100, 128, 256, 300])
def test_cuda_matches_reference(compiled, dtype, m):
    """M <= ~128 runs the one-block shared-memory kernel, larger M the batched-matmul path."""
    a = landmark_gram(5, m, device='cuda', seed=m).to(dtype)
    v, residual = newton_schulz_inverse(a, return_residual=True)
    assert v.dtype == dtype and residual.dtype == torch.float32
    v_ref = newton_schulz_inverse_reference(a.float(), 20, EPS)
    err = (v.float() - v_ref).abs().max() / v_ref.abs().max()
    assert err <= (1e-4 if dtype == torch.float32 else 1e-2)
    assert residual.max().item() <= 1e-4
    torch.testing.assert_close(residual.double(),
                               newton_schulz_residual_reference(a.float(), v_ref, EPS).double(),
                               rtol=0.5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize('m', [16, 49, 256])
def test_cuda_step_for_step_and_backward(compiled, m):
    a = landmark_gram(3, m, device='cuda', seed=9)
    for iters in (1, 2, 5):
        v = newton_schulz_inverse(a, iters=iters)
        v_ref = newton_schulz_inverse_reference(a, iters, EPS)
        assert ((v - v_ref).abs().max() / v_ref.abs().max()).item() <= 1e-5
    a = a.requires_grad_()
    grad = torch.randn_like(a)
    (grad_a, ) = torch.autograd.grad(newton_schulz_inverse(a), a, grad)
    grad_ref = reference_gradient(a.double().cpu(), grad.double().cpu(), 20)
    assert ((grad_a.double().cpu() - grad_ref).abs().max() / grad_ref.abs().max()).item() <= 1e-4


@pytest.mark.cuda
def test_cuda_unconverged_gradient_and_opcheck(compiled):
    a64 = unconverged_gram().expand(2, 49, 49).clone()
    a = a64.to('cuda').requires_grad_()
    grad = torch.randn(a.shape, dtype=torch.float64)
    (grad_a, ) = torch.autograd.grad(newton_schulz_inverse(a, eps=UNCONVERGED_EPS), a,
                                     grad.to('cuda'))
    grad_ref = reference_gradient(a64, grad, 20, UNCONVERGED_EPS)
    assert ((grad_a.cpu() - grad_ref).abs().max() / grad_ref.abs().max()).item() <= 1e-9
    for dtype in (torch.float32, torch.float64):
        torch.library.opcheck(compiled.newton_schulz_inverse,
                              (a.detach().to(dtype).requires_grad_(), 5, EPS, True))
    torch.library.opcheck(compiled.newton_schulz_inverse_backward,
                          (torch.randn_like(a), a.detach(), 5, EPS))


@pytest.mark.cuda
def test_cuda_non_contiguous_and_empty(compiled):
    a = landmark_gram(4, 20, device='cuda').reshape(2, 2, 20, 20).transpose(-1, -2)
    v = newton_schulz_inverse(a)
    torch.testing.assert_close(v, newton_schulz_inverse_reference(a.contiguous(), 20, EPS),
                               rtol=1e-4, atol=1e-4)
    empty = torch.zeros(0, 20, 20, device='cuda')
    v, residual = newton_schulz_inverse(empty, return_residual=True)
    assert v.shape == (0, 20, 20) and residual.shape == (0, )
