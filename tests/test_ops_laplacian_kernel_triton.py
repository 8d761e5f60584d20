"""laplacian_kernel's Triton kernels (mmlinattn/ops/laplacian_kernel/triton.py) on CPU tensors,
through triton's interpreter, against the fp64 reference: forward and both gradients over a shape
grid at the tile edges, fp32 / fp16 / bf16, NaN propagation, bitwise-deterministic backward,
argument checks and opcheck.

``TRITON_INTERPRET=1`` must be set before triton is imported, and triton (imported by
``torch._dynamo``) is usually imported already in a pytest process, so each test runs its
``check_*`` function in a fresh interpreter (``python tests/test_ops_laplacian_kernel_triton.py
<check> [args]``) with ``TRITON_INTERPRET=1`` and ``MMLINATTN_OPS=triton``; the pytest process and
the other tests are never put in interpreter mode. The interpreter computes with numpy, which has
no bf16 arithmetic: the kernels convert every load to fp32 and compute in fp32 there, as on a GPU.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
LAM = 4.0
TILE, TILE_D = 32, 8  # the kernels' tiles (triton.py; checked by check_tiles)
# (N, M, D): every size 1, tile - 1, tile, tile + 1 of N and M and of D, odd D, several D steps.
SHAPES = ((1, 33, 7), (31, 32, 9), (32, 1, 8), (33, 31, 1), (33, 33, 17), (2, 65, 3))
HALF_SHAPES = ((31, 33, 9), (33, 1, 7))
# max |error| <= tol * max |reference| (fp64, from the same rounded inputs). Halves: the output is
# rounded to the input dtype, and the backward uses that rounded output, as every implementation.
TOLERANCES = {'float32': 1e-5, 'float16': 4e-3, 'bfloat16': 3e-2}


# ----- checks, run in the interpreted subprocess ----------------------------------------------

def _inputs(n, m, d, dtype, seed, batch=1, heads=2):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n, d, generator=gen, dtype=torch.float64) * d**-0.5
    k = torch.randn(batch, heads, m, d, generator=gen, dtype=torch.float64) * d**-0.5
    grad = torch.randn(batch, heads, n, m, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), grad.to(dtype)


def _op_and_grads(q, k, grad):
    from mmlinattn.ops import laplacian_kernel
    q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    out = laplacian_kernel(q, k, LAM)
    return (out, *torch.autograd.grad(out, (q, k), grad))


def _reference_and_grads(q, k, grad):
    from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference
    q, k = q.double().requires_grad_(), k.double().requires_grad_()
    out = laplacian_kernel_reference(q, k, LAM)
    return (out, *torch.autograd.grad(out, (q, k), grad.double()))


def check_interpreted():
    from mmlinattn.ops import dispatch
    from mmlinattn.ops.laplacian_kernel import triton as kernels
    assert dispatch.triton_interpreted('laplacian_kernel'), dispatch.triton_status()
    assert dispatch.choose('laplacian_kernel', 'cpu', torch.float32) == 'triton'
    assert (kernels.TILE, kernels.TILE_D) == (TILE, TILE_D), 'update the test grid to the tiles'


def check_matches_reference(dtype_name):
    dtype, tol = getattr(torch, dtype_name), TOLERANCES[dtype_name]
    for n, m, d in SHAPES if dtype == torch.float32 else HALF_SHAPES:
        q, k, grad = _inputs(n, m, d, dtype, seed=n * 10000 + m * 100 + d)
        results = _op_and_grads(q, k, grad)
        for name, actual, expected in zip(('out', 'dq', 'dk'), results,
                                          _reference_and_grads(q, k, grad)):
            assert actual.dtype == dtype and actual.shape == expected.shape, (name, actual.shape)
            err = (actual.double() - expected).abs().max().item()
            scale = expected.abs().max().item()
            assert err <= tol * scale, f'{name} N={n} M={m} D={d}: {err:.3g} > {tol} * {scale:.3g}'


def check_one_gradient():
    """Only the gradient asked for is computed (need_dq / need_dk), and it is the same."""
    from mmlinattn.ops import laplacian_kernel
    q, k, grad = _inputs(5, 6, 3, torch.float32, seed=1)
    _, dq_ref, dk_ref = _op_and_grads(q, k, grad)
    (dq, ) = torch.autograd.grad(laplacian_kernel(q.requires_grad_(), k, LAM), q, grad)
    (dk, ) = torch.autograd.grad(laplacian_kernel(q.detach(), k.requires_grad_(), LAM), k, grad)
    assert torch.equal(dq, dq_ref) and torch.equal(dk, dk_ref)


def check_nan_propagates_as_reference():
    """A NaN in q_i gives NaN in row i, one in k_j NaN in column j, an infinite coordinate
    exp(-inf) = 0; the gradients are NaN exactly where the reference's are."""
    q, k, _ = _inputs(6, 5, 4, torch.float32, seed=6, heads=1)
    q[0, 0, 1, 2] = float('nan')
    k[0, 0, 3, 0] = float('nan')
    q[0, 0, 4, 1] = float('inf')
    grad = torch.ones(1, 1, 6, 5)
    for name, actual, expected in zip(('out', 'dq', 'dk'), _op_and_grads(q, k, grad),
                                      _reference_and_grads(q, k, grad)):
        assert torch.equal(actual.isnan(), expected.isnan()), name
        finite = ~expected.isnan()
        torch.testing.assert_close(actual[finite].double(), expected[finite], rtol=1e-5,
                                   atol=1e-6)


def check_backward_is_deterministic():
    q, k, grad = _inputs(33, 70, 9, torch.float32, seed=3)  # several tiles on every axis
    first, second = _op_and_grads(q, k, grad), _op_and_grads(q, k, grad)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def check_operators():
    """The Triton operators have the C++ operators' schemas; opcheck's schema, autograd and fake
    tests pass. (Its aot_dispatch tests trace the kernels with fake tensors, which the interpreter
    cannot run: gpu_check.sh runs the compile tests on CUDA.)"""
    import mmlinattn.ops.laplacian_kernel.triton  # noqa: F401  (defines the operators)
    from mmlinattn.ops.laplacian_kernel.compiled import OPERATORS
    ops = torch.ops.mmlinattn
    for op, schema in ((ops.laplacian_kernel_triton_forward, OPERATORS.forward_schema),
                       (ops.laplacian_kernel_triton_backward, OPERATORS.backward_schema)):
        assert str(op.default._schema).split('(', 1)[1] == schema.split('(', 1)[1], op
    tests = ('test_schema', 'test_autograd_registration', 'test_faketensor')
    q, k, grad = _inputs(5, 3, 9, torch.float32, seed=2)
    torch.library.opcheck(ops.laplacian_kernel_triton_forward,
                          (q.requires_grad_(), k.requires_grad_(), LAM), test_utils=tests)
    out = ops.laplacian_kernel_triton_forward(q, k, LAM).detach()
    for need_dq, need_dk in ((True, True), (True, False), (False, True)):
        torch.library.opcheck(ops.laplacian_kernel_triton_backward,
                              (grad, q.detach(), k.detach(), out, LAM, need_dq, need_dk),
                              test_utils=('test_schema', 'test_faketensor'))


def check_operator_rejects_bad_shapes():
    """Called directly (not through the public op), the operators check shapes themselves."""
    import mmlinattn.ops.laplacian_kernel.triton  # noqa: F401  (defines the operators)
    ops = torch.ops.mmlinattn
    q, k = torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 5, 3)
    with pytest.raises(ValueError, match=r'head dim .* got 3 and 2'):
        ops.laplacian_kernel_triton_forward(q, k[..., :2], LAM)
    with pytest.raises(ValueError, match=r'q, k must have one dtype'):
        ops.laplacian_kernel_triton_forward(q, k.double(), LAM)
    with pytest.raises(ValueError, match=r'grad_out must have shape \[1x2x4x5\] .* got \[1x2x4x4\]'):
        ops.laplacian_kernel_triton_backward(torch.zeros(1, 2, 4, 4), q, k, torch.zeros(1, 2, 4, 5),
                                             LAM, True, True)


def check_broken_output_is_caught():
    """Must fail: the forward operator's CPU kernel shifted by 1e-3."""
    from mmlinattn.ops.laplacian_kernel import triton as kernels
    original = kernels._forward

    def shifted(q, k, lam):
        return original(q, k, lam) + 1e-3

    torch.library.register_kernel('mmlinattn::laplacian_kernel_triton_forward', 'cpu', shifted)
    check_matches_reference('float32')


# ----- tests, in the pytest process --------------------------------------------------------------

CHECKS = {  # test -> (check, args)
    'interpreted': ('check_interpreted', ()),
    **{f'matches_reference_{dtype}': ('check_matches_reference', (dtype, )) for dtype in TOLERANCES},
    'one_gradient': ('check_one_gradient', ()),
    'nan': ('check_nan_propagates_as_reference', ()),
    'deterministic': ('check_backward_is_deterministic', ()),
    'operators': ('check_operators', ()),
    'operator_shapes': ('check_operator_rejects_bad_shapes', ()),
    'broken_kernel': ('check_broken_output_is_caught', ()),
}


@pytest.fixture(scope='module')
def interpreted():
    """Every check's outcome ('ok' or its traceback), from one interpreted subprocess (the
    interpreter's start-up costs more than most checks)."""
    env = dict(os.environ, TRITON_INTERPRET='1', MMLINATTN_OPS='triton')
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def outcome(results, name):
    assert results[name] == 'ok', results[name]


def test_interpreter_runs_the_triton_kernels(interpreted):
    outcome(interpreted, 'interpreted')


@pytest.mark.parametrize('dtype', list(TOLERANCES))
def test_forward_and_gradients_match_fp64_reference(interpreted, dtype):
    outcome(interpreted, f'matches_reference_{dtype}')


def test_one_gradient_at_a_time(interpreted):
    outcome(interpreted, 'one_gradient')


def test_nan_propagates_as_in_the_reference(interpreted):
    outcome(interpreted, 'nan')


def test_two_backward_runs_are_bitwise_equal(interpreted):
    outcome(interpreted, 'deterministic')


def test_operators_schemas_and_opcheck(interpreted):
    outcome(interpreted, 'operators')


def test_operators_check_shapes_when_called_directly(interpreted):
    outcome(interpreted, 'operator_shapes')


def test_a_broken_kernel_fails_the_comparison(interpreted):
    """The comparison can fail: with the output off by 1e-3 it does."""
    assert 'out N=1 M=33 D=7' in interpreted['broken_kernel'], interpreted['broken_kernel']


@pytest.mark.parametrize('q,k,lam,match', [
    (torch.zeros(2, 3, 4), torch.zeros(2, 2, 3, 4), LAM, r'q must have 4 dimensions'),
    (torch.zeros(2, 2, 5, 4), torch.zeros(2, 2, 3, 8), LAM, r'head dim .* got 4 and 8'),
    (torch.zeros(2, 2, 5, 4, dtype=torch.int64), torch.zeros(2, 2, 3, 4), LAM,
     r'q must be a floating-point .*int64'),
    (torch.zeros(2, 2, 5, 4), torch.zeros(2, 2, 3, 4), 0.0,
     r'lam must be a positive finite number, got 0.0'),
])
def test_bad_calls_raise_the_same_value_errors(monkeypatch, q, k, lam, match):
    """The public op checks its arguments before it chooses an implementation, so
    MMLINATTN_OPS=triton raises the same ValueErrors (without running a kernel)."""
    from mmlinattn.ops import laplacian_kernel
    monkeypatch.setenv('MMLINATTN_OPS', 'triton')
    with pytest.raises(ValueError, match=match):
        laplacian_kernel(q, k, lam)


def run_checks() -> dict:
    """In the interpreted subprocess: run every check, the broken kernel last (it replaces the
    forward operator's CPU kernel)."""
    import traceback
    sys.path.insert(0, REPO_ROOT)
    results = {}
    for name, (check, args) in CHECKS.items():
        try:
            globals()[check](*args)
            results[name] = 'ok'
        except Exception:  # reported to the test that owns the check
            results[name] = traceback.format_exc()
    return results


if __name__ == '__main__':
    print(json.dumps(run_checks()))
