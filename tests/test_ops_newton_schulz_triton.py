"""newton_schulz_inverse's Triton kernels (``mmlinattn/ops/newton_schulz/triton.py``) on CPU
tensors through the Triton interpreter: forward and backward against the reference and autograd
through it, at every tile edge, before and after the per-matrix stop; ties of the row maximum;
NaN; determinism; the registered operators; the calls they refuse.

Whether ``@triton.jit`` kernels are interpreted is fixed when their module is imported, from
``TRITON_INTERPRET``. So the kernels run in one spawned worker process whose environment has
``TRITON_INTERPRET=1`` from its start (the ``interpreter`` fixture): this process never imports
the kernel module and never has the variable set, so no other test file sees either, in any
order. The references and their gradients are computed here, the kernels' results come back
pickled.
"""
import concurrent.futures
import multiprocessing
import os
import re

import pytest
import torch

from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference
from mmlinattn.ops.newton_schulz.reference import newton_schulz_inverse_reference

EPS = 1e-2
# tile - 1, tile, tile + 1 of every BLOCK the kernels use (16, 32, 64; 65 is refused), M = 1 and
# the model's 7 x 7 landmark grid
SIZES = [1, 15, 16, 17, 31, 32, 33, 49, 63, 64]


@pytest.fixture(scope='module')
def interpreter():
    """A worker process that imports the kernels with ``TRITON_INTERPRET=1``."""
    saved = os.environ.get('TRITON_INTERPRET')
    os.environ['TRITON_INTERPRET'] = '1'  # inherited by the worker, which starts now
    try:
        pool = concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context('spawn'))
        pool.submit(_kernel_module).result()
    finally:
        if saved is None:
            del os.environ['TRITON_INTERPRET']
        else:
            os.environ['TRITON_INTERPRET'] = saved
    with pool:
        yield lambda fn, *args: pool.submit(fn, *args).result()


# ---- run in the worker --------------------------------------------------------------------

def _kernel_module():
    from mmlinattn.ops.newton_schulz import triton as newton_schulz_triton
    assert os.environ.get('TRITON_INTERPRET') == '1'
    return newton_schulz_triton.__name__


def _forward(a, iters, eps, with_residual=True):
    from mmlinattn.ops.newton_schulz.triton import newton_schulz_triton_forward
    return newton_schulz_triton_forward(a, iters, eps, with_residual)


def _backward(grad_v, a, iters, eps):
    from mmlinattn.ops.newton_schulz.triton import newton_schulz_triton_backward
    return newton_schulz_triton_backward(grad_v, a, iters, eps)


def _operator_forward_and_gradient(a, grad_v, iters, eps):
    """V, residual and dL/da through the registered operator and its autograd."""
    import mmlinattn.ops.newton_schulz.triton  # noqa: F401  (registers the operators)
    a = a.clone().requires_grad_()
    v, residual = torch.ops.mmlinattn.newton_schulz_inverse_triton(a, iters, eps, True)
    (grad_a, ) = torch.autograd.grad(v, a, grad_v)
    return v.detach(), residual, residual.requires_grad, grad_a


def _opcheck(a, iters, eps):
    """opcheck of both operators. ``test_aot_dispatch_dynamic`` is left out: AOT dispatch traces
    the launchers through ``wrap_triton``, which under the interpreter hands back the plain
    interpreted kernel, and that cannot run on fake tensors (it is checked on CUDA)."""
    from mmlinattn.ops.newton_schulz import triton as ns
    utils = ('test_schema', 'test_autograd_registration', 'test_faketensor')
    for with_residual in (True, False):
        torch.library.opcheck(ns.newton_schulz_inverse_triton,
                              (a.clone().requires_grad_(), iters, eps, with_residual),
                              test_utils=utils)
    torch.library.opcheck(ns.newton_schulz_inverse_triton_backward,
                          (torch.randn_like(a), a, iters, eps), test_utils=utils)


def _error(fn_name, *args):
    """The ValueError message a launcher raises, or None."""
    from mmlinattn.ops.newton_schulz import triton as ns
    try:
        getattr(ns, fn_name)(*args)
    except ValueError as err:
        return str(err)
    return None


def _constants():
    from mmlinattn.ops.newton_schulz import triton as ns
    return ns.TRITON_DTYPES, ns.MAX_M, [ns.block_size(m) for m in SIZES]


# ---- matrices -----------------------------------------------------------------------------

def landmark_gram(batch, m, d=32, lam=4.0, seed=0):
    """Laplacian-kernel Gram matrices [batch, m, m] (fp64) of landmarks ~ N(0, 1/d): SPD; the
    product steps stop after about 9 steps at M = 49."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, m, d, generator=gen, dtype=torch.float64) / d**0.5
    return laplacian_kernel_reference(x, x, lam)[:, 0]


def early_and_late(m, seed=0):
    """Two SPD matrices [2, m, m] (fp64): one close to the identity, whose product steps stop
    after 3-4 steps, and a landmark Gram matrix, which needs about 9; with iters = 8 the first
    stops and the second does not, with 20 each stops on its own. The second is perturbed to
    be non-symmetric (the kernels take any square matrix)."""
    near_identity = landmark_gram(1, m, lam=0.5, seed=seed)
    general = landmark_gram(1, m, seed=seed + 1)
    general = general + 0.01 * torch.rand(general.shape, dtype=torch.float64,
                                          generator=torch.Generator().manual_seed(seed))
    return torch.cat([near_identity, general])


def never_stops(m, seed=0):
    """SPD [1, m, m] (fp64) with eigenvalues from 1 down to 1e-6: its product steps do not
    reach ||R||_inf <= u within 19 steps."""
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=torch.float64))
    eigenvalues = torch.logspace(0, -6, m, dtype=torch.float64)
    return ((basis * eigenvalues) @ basis.T)[None]


def relative_error(x, y):
    """max |x - y| / max |y| per matrix [B]."""
    x, y = x.double(), y.double()
    return (x - y).abs().amax((-2, -1)) / y.abs().amax((-2, -1))


def reference_gradient(a, grad_v, iters, eps):
    """Autograd through the reference iteration, in a's dtype."""
    a = a.detach().clone().requires_grad_()
    (grad_a, ) = torch.autograd.grad(newton_schulz_inverse_reference(a, iters, eps), a, grad_v)
    return grad_a


def random_like(a, seed=1):
    return torch.randn(a.shape, generator=torch.Generator().manual_seed(seed), dtype=a.dtype)


# ---- tests --------------------------------------------------------------------------------

def test_block_sizes_and_declared_limits(interpreter):
    dtypes, max_m, blocks = interpreter(_constants)
    assert dtypes == (torch.float32, ) and max_m == 64
    assert blocks == [16, 16, 16, 32, 32, 32, 64, 64, 64, 64]


@pytest.mark.parametrize('m', SIZES)
def test_forward_and_gradient_equal_the_reference(interpreter, m):
    """fp32 kernels against the fp32 reference (tight: rounding only) and against the fp64
    reference (no worse than the fp32 reference itself), V, residual and dL/da, for 1, 2, 3, 8
    and 20 steps, in a batch where one matrix stops before the other."""
    a64 = early_and_late(m, seed=m)
    a = a64.float()
    grad = random_like(a)
    for iters in (1, 2, 3, 8, 20):
        v, residual = interpreter(_forward, a, iters, EPS)
        v32, v64 = (newton_schulz_inverse_reference(x, iters, EPS) for x in (a, a64))
        assert v.shape == a.shape and v.dtype == torch.float32 and residual.shape == (2, )
        assert relative_error(v, v32).max() <= 1e-5, iters
        assert (relative_error(v, v64) <= 2 * relative_error(v32, v64) + 1e-6).all(), iters
        p = a64 + EPS * torch.eye(m, dtype=torch.float64)
        exact_residual = torch.linalg.matrix_norm(torch.eye(m, dtype=torch.float64) - p @ v.double())
        torch.testing.assert_close(residual.double(), exact_residual / m**0.5, rtol=1e-3,
                                   atol=1e-6)
        grad_a = interpreter(_backward, grad, a, iters, EPS)
        grad32 = reference_gradient(a, grad, iters, EPS)
        grad64 = reference_gradient(a64, grad.double(), iters, EPS)
        assert relative_error(grad_a, grad32).max() <= 1e-5, iters
        # + 1e-5: the backward uses T = V P for P V (as the C++ kernels), equal in exact
        # arithmetic; on the non-symmetric matrix that adds rounding (4e-6 at M = 128)
        assert (relative_error(grad_a, grad64)
                <= 2 * relative_error(grad32, grad64) + 1e-5).all(), iters


def test_the_stop_is_per_matrix(interpreter):
    """At M = 49 the first matrix stops after 3-4 steps, the second after about 9: 20 and 60
    allowed steps give both bitwise the same V, 8 steps the first's V and not the second's;
    each matrix's V in the batch is its V alone."""
    a = early_and_late(49, seed=3).float()
    v20, residual = interpreter(_forward, a, 20, EPS)
    v60, _ = interpreter(_forward, a, 60, EPS)
    assert torch.equal(v20, v60)
    v8, _ = interpreter(_forward, a, 8, EPS)
    assert torch.equal(v8[0], v20[0]) and not torch.equal(v8[1], v20[1])
    for n in range(2):
        alone, residual_alone = interpreter(_forward, a[n:n + 1], 20, EPS)
        assert torch.equal(alone[0], v20[n]) and torch.equal(residual_alone[0], residual[n])


def test_a_matrix_that_never_stops(interpreter):
    """An ill-conditioned matrix runs all its steps (20 and 60 allowed steps differ): V as close
    to the fp64 reference as the fp32 reference is. fp32 rounding is amplified about cond = 1e6
    times in dL/da (entries ~1e9): the fp32 reference is 7e-4 from fp64 there, the kernel 6e-3
    (measured), so the gradient is held to 1e-2."""
    a64 = never_stops(33, seed=4)
    a = a64.float()
    grad = random_like(a)
    v, residual = interpreter(_forward, a, 20, EPS * 1e-3)
    assert residual.item() > 1e-3  # not converged
    assert not torch.equal(v, interpreter(_forward, a, 60, EPS * 1e-3)[0])
    v32, v64 = (newton_schulz_inverse_reference(x, 20, EPS * 1e-3) for x in (a, a64))
    assert relative_error(v, v64).item() <= 2 * relative_error(v32, v64).item() + 1e-6
    grad_a = interpreter(_backward, grad, a, 20, EPS * 1e-3)
    grad32 = reference_gradient(a, grad, 20, EPS * 1e-3)
    grad64 = reference_gradient(a64, grad.double(), 20, EPS * 1e-3)
    assert relative_error(grad32, grad64).item() <= 1e-3
    assert relative_error(grad_a, grad64).item() <= 1e-2


@pytest.mark.parametrize('iters', [1, 3, 20])
def test_ties_of_the_row_maximum_share_the_gradient(interpreter, iters):
    """A circulant matrix, every row sum exactly equal and two zeros per row (|x|'(0) = 0):
    the gradient through s = ||P||_inf is shared by all rows, as autograd through amax does."""
    m = 17
    a = torch.zeros(1, m, m, dtype=torch.float64)
    for i in range(m):
        a[0, i, i], a[0, i, (i + 1) % m], a[0, i, (i - 1) % m] = 1.0, 0.25, -0.25
    grad = random_like(a)
    grad_a = interpreter(_backward, grad.float(), a.float(), iters, 0.5)
    assert relative_error(grad_a, reference_gradient(a, grad, iters, 0.5)).item() <= 1e-6


def test_non_finite_input_gives_nan_in_its_matrix_only(interpreter):
    """NaN or Inf in a matrix makes its V, residual and dL/da NaN (as in the reference); the
    batch's other matrices are exactly what they are alone."""
    a = landmark_gram(3, 9, seed=14).float()
    a[0, 1, 2] = float('nan')
    a[1, 4, 4] = float('inf')
    v, residual = interpreter(_forward, a, 20, EPS)
    assert v[:2].isnan().all() and residual[:2].isnan().all()
    v_alone, residual_alone = interpreter(_forward, a[2:], 20, EPS)
    assert torch.equal(v[2:], v_alone) and torch.equal(residual[2:], residual_alone)
    grad = random_like(a)
    grad_a = interpreter(_backward, grad, a, 20, EPS)
    assert grad_a[:2].isnan().all() and reference_gradient(a, grad, 20, EPS)[:2].isnan().all()
    assert torch.equal(grad_a[2:], interpreter(_backward, grad[2:], a[2:], 20, EPS))


def test_backward_is_deterministic(interpreter):
    a = early_and_late(49, seed=5).float()
    grad = random_like(a)
    first = interpreter(_backward, grad, a, 20, EPS)
    second = interpreter(_backward, grad, a, 20, EPS)
    assert torch.equal(first, second)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_inputs_run_in_float32(interpreter, dtype):
    """The kernels take fp32 (TRITON_DTYPES): a caller casts half inputs, as the reference
    does, and the result cast back is the reference's within one rounding of the half dtype."""
    a = landmark_gram(2, 16, seed=6).to(dtype)
    v, residual = interpreter(_forward, a.float(), 20, EPS)
    assert residual.dtype == torch.float32 and residual.max() <= 1e-4
    torch.testing.assert_close(v.to(dtype), newton_schulz_inverse_reference(a, 20, EPS))


def test_registered_operators(interpreter):
    """The triton_ops: forward with a non-differentiable residual, autograd through the backward
    operator, equal to the launchers; opcheck."""
    a = early_and_late(21, seed=7).float()
    grad = random_like(a)
    v, residual, residual_requires_grad, grad_a = interpreter(_operator_forward_and_gradient, a,
                                                              grad, 5, EPS)
    v_direct, residual_direct = interpreter(_forward, a, 5, EPS)
    assert torch.equal(v, v_direct) and torch.equal(residual, residual_direct)
    assert not residual_requires_grad
    assert torch.equal(grad_a, interpreter(_backward, grad, a, 5, EPS))
    interpreter(_opcheck, a, 5, EPS)


def test_empty_batch(interpreter):
    v, residual = interpreter(_forward, torch.zeros(0, 5, 5), 20, EPS)
    assert v.shape == (0, 5, 5) and residual.shape == (0, )
    v, residual = interpreter(_forward, torch.zeros(2, 5, 5), 20, EPS, False)
    assert residual.shape == (0, )
    assert interpreter(_backward, torch.zeros(0, 5, 5), torch.zeros(0, 5, 5), 20, EPS).shape == (
        0, 5, 5)


@pytest.mark.parametrize('fn,args,match', [
    ('newton_schulz_triton_forward', (torch.ones(3, 3), 5, EPS, True),
     r'a must be a batch of square matrices \[B, M, M\], got shape \[3x3\]'),
    ('newton_schulz_triton_forward', (torch.ones(2, 3, 4), 5, EPS, True),
     r'a must be a batch of square matrices \[B, M, M\], got shape \[2x3x4\]'),
    ('newton_schulz_triton_forward', (torch.ones(2, 3, 3), 0, EPS, True),
     r'iters must be a positive integer, got 0'),
    ('newton_schulz_triton_forward', (torch.ones(2, 3, 3), 5, -1.0, True),
     r'eps must be a non-negative finite number, got -1.0'),
    ('newton_schulz_triton_forward', (torch.ones(2, 3, 3, dtype=torch.float16), 5, EPS, True),
     r"newton_schulz_inverse's Triton kernel computes in float32, got torch.float16"),
    ('newton_schulz_triton_forward', (torch.ones(2, 3, 3, dtype=torch.float64), 5, EPS, True),
     r'got torch.float64 .*float64 runs the compiled or reference implementation'),
    ('newton_schulz_triton_forward', (torch.ones(1, 65, 65), 5, EPS, True),
     r"newton_schulz_inverse's Triton kernel handles M <= 64, got M=65"),
    ('newton_schulz_triton_backward', (torch.ones(2, 3, 3), torch.ones(2, 4, 4), 5, EPS),
     r'grad_v must match a \(shape \[2x4x4\], torch.float32, cpu\), got \[2x3x3\]'),
    ('newton_schulz_triton_backward', (torch.ones(2, 3, 3), torch.ones(2, 3, 3), 5, float('inf')),
     r'eps must be a non-negative finite number, got inf'),
])
def test_bad_calls_raise_value_error(interpreter, fn, args, match):
    message = interpreter(_error, fn, *args)
    assert message is not None and re.search(match, message), message
