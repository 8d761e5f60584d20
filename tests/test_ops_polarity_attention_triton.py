"""polarity_linear_attention's Triton kernels (``mmlinattn/ops/polarity_attention/triton.py``) against the fp64
reference: forward and the gradients of q, k, v and power, NaN propagation, deterministic
backward, the registered operators (opcheck) and their argument checks.

On the CPU the kernels run in Triton's interpreter, in a worker process. ``TRITON_INTERPRET=1`` is
read when ``@triton.jit`` defines a kernel (when its module is imported) and turns every kernel
defined afterwards in that process into an interpreted one. Set in this process it would leak into
the other test files (and come too late if one of them had imported the kernels already), so the
``interpreter`` fixture starts one spawned worker for this file with the variable set in the
worker's environment only; each test sends it a check (a function of this file, which asserts
there and so fails the test with its message) and waits for it. The ``cuda`` tests run the same
checks in this process on the GPU, where the kernels are compiled.

Cases name their sizes relative to the kernels' tiles ('t-1' is one below the tile of that
dimension; dv, which must be even, goes two below or above), resolved in the process that runs them.
"""
import importlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from unittest import mock

import pytest
import torch

from test_ops_polarity_attention import assert_close_scaled, make_inputs

KERNELS = 'mmlinattn.ops.polarity_attention.triton'
EPS = 1e-6
EDGES = ('1', 't-1', 't', 't+1')
# (B, h, N, n, d, dv): each of N, n, d, dv at every edge of its tile, in a Latin square so that
# every edge meets different edges of the other dimensions; the last case is all ones.
CASES = [((1, 2) if i % 2 else (2, 1)) + tuple(EDGES[(i + shift) % 4] for shift in range(4))
         for i in range(4)] + [(1, 1, '1', '1', '1', '1')]
# Two chunks of the outer-product reductions, the second holding one token; odd head dim.
CHUNKED = (1, 2, 'c+1', 'c+1', 5, 4)
NO_QUERIES = (1, 2, 0, 't+1', 3, 2)
# Tolerances against the fp64 reference on the same rounded inputs, relative to max(1, max|ref|)
# (largest errors measured over 8 draws: fp16 8e-4, bf16 1.3e-2). In half precision out, dq, dk,
# dv are stored rounded and the backward reads the rounded out, whose error the normaliser's
# gradient (g.out / den, cancelling against g / den) amplifies. The interpreter casts fp32 to
# bf16 by truncation (the GPU rounds to nearest), which doubles the bf16 rounding error.
TOLERANCES = {'float32': 1e-5, 'float16': 2e-3, 'bfloat16': 3e-2}


def kernels():
    return importlib.import_module(KERNELS)


def _resolve(size, tile, step=1):
    if not isinstance(size, str):
        return size
    base = {'1': step, 't-1': tile - step, 't': tile, 't+1': tile + step}
    return base[size]


def resolve_case(case):
    """(B, h, N, n, d, dv) with the edges replaced by numbers from the kernels' tile sizes."""
    mod = kernels()
    chunk = mod.TOKEN_TILE * mod.CHUNK_TILES

    def tokens(size):
        return chunk + 1 if size == 'c+1' else _resolve(size, mod.TOKEN_TILE)

    batch, heads, num_queries, num_keys, head_dim, value_dim = case
    return (batch, heads, tokens(num_queries), tokens(num_keys),
            _resolve(head_dim, mod.CHANNEL_TILE), _resolve(value_dim, mod.COLUMN_TILE, step=2))


def triton_attention(q, k, v, power):
    return torch.ops.mmlinattn.polarity_linear_attention_triton_forward(q, k, v, power, EPS)[0]


def reference(q, k, v, power):
    from mmlinattn.ops.polarity_attention.reference import polarity_linear_attention_reference
    return polarity_linear_attention_reference(q, k, v, power, EPS)


def forward_backward(fn, inputs, grad_out):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    return (out.detach(), ) + torch.autograd.grad(out, inputs, grad_out.to(out.dtype))


def random_grad_out(inputs):
    q, _, v, _ = inputs
    gen = torch.Generator().manual_seed(1)
    shape = q.shape[:3] + v.shape[3:]
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(q.device, q.dtype)


# ---- checks: run in the interpreter worker (CPU) or in this process (CUDA) -------------------


def check_interpreted():
    """The worker's kernels are interpreted (TRITON_INTERPRET=1 reached it before the import)."""
    assert kernels().interpreted(), 'the worker compiled the kernels instead of interpreting them'


def check_against_reference(case, dtype_name, device='cpu', tol=None):
    """Forward and the four gradients against the fp64 reference on the same (rounded) inputs.

    In fp32 a few tiny-d cases are ill-conditioned (phi(q).z near eps makes dq, dk differences
    of nearly equal terms): there the bound is also met within 10x the error of the fp32
    reference itself, as in test_ops_polarity_attention.
    """
    dtype = getattr(torch, dtype_name)
    tol = TOLERANCES[dtype_name] if tol is None else tol
    inputs = make_inputs(*resolve_case(case), dtype, device=device, seed=sum(map(ord, repr(case))) % 97)
    grad_out = random_grad_out(inputs)
    got = forward_backward(triton_attention, inputs, grad_out)
    inputs64 = [t.double() for t in inputs]
    expected = forward_backward(reference, inputs64, grad_out.double())
    floors = [0.0] * 5
    if dtype == torch.float32:
        ref32 = forward_backward(reference, inputs, grad_out)
        floors = [10 * (a.double() - b).abs().max().item() if b.numel() else 0.0
                  for a, b in zip(ref32, expected)]
    for name, actual, ref, floor in zip(('out', 'dq', 'dk', 'dv', 'dpower'), got, expected, floors):
        # every result in the input dtype (dpower: the autograd formula casts it to power's)
        assert actual.shape == ref.shape and actual.dtype == dtype, (name, actual.dtype)
        assert_close_scaled(f'{name} ({dtype_name}, {case})', actual, ref, tol, floor)


def check_nan_propagation(device='cpu'):
    """As the reference: NaN in query i gives NaN in row i only (not in the rest of its tile); NaN
    in a key, every row of that (batch, head), in every query tile; NaN in value column c, column
    c of every row; the other (batch, head) stay finite."""
    mod = kernels()
    inputs = make_inputs(2, 2, mod.TOKEN_TILE + 1, 7, 3, 4, torch.float32, device=device)
    q, k, v, power = inputs
    q[0, 0, 3, 1] = float('nan')
    k[1, 1, 2, 0] = float('nan')
    v[0, 1, 6, 3] = float('nan')
    nan = triton_attention(q, k, v, power).isnan()
    expected = torch.zeros_like(nan)
    expected[0, 0, 3] = True
    expected[1, 1] = True
    expected[0, 1, :, 3] = True
    assert torch.equal(nan, expected), f'NaN pattern per (b, h): {nan.sum((-1, -2)).tolist()}'
    reference_nan = reference(*(t.double() for t in inputs)).isnan()
    assert torch.equal(reference_nan.to(nan.device), expected), 'the reference changed'


def check_backward_is_deterministic(device='cpu'):
    """Two backward runs (two chunks, five token tiles) are bitwise equal."""
    inputs = make_inputs(*resolve_case((1, 1, 'c+1', 'c+1', 3, 2)), torch.float32, device=device,
                         seed=3)
    grad_out = random_grad_out(inputs)
    first = forward_backward(triton_attention, inputs, grad_out)
    second = forward_backward(triton_attention, inputs, grad_out)
    for name, a, b in zip(('out', 'dq', 'dk', 'dv', 'dpower'), first, second):
        assert torch.equal(a, b), f'{name} differs between two runs'


def check_opcheck(dtype_name, device='cpu', test_utils=None):
    """opcheck of both registered operators. In the interpreter test_aot_dispatch_dynamic cannot
    run: wrap_triton hands back the interpreted kernel itself, which a trace would launch on fake
    tensors; on CUDA it runs with the rest."""
    kernels()
    dtype = getattr(torch, dtype_name)
    utils = {} if test_utils is None else {'test_utils': test_utils}
    q, k, v, power = make_inputs(1, 2, 5, 7, 3, 4, dtype, device=device, away_from_zero=True)
    ops = torch.ops.mmlinattn
    inputs = [t.requires_grad_() for t in (q, k, v, power)]
    torch.library.opcheck(ops.polarity_linear_attention_triton_forward, (*inputs, EPS), **utils)
    detached = [t.detach() for t in inputs]
    out, state, den = ops.polarity_linear_attention_triton_forward(*detached, EPS)
    torch.library.opcheck(ops.polarity_linear_attention_triton_backward,
                          (torch.randn_like(out), *detached, out, state, den), **utils)


def check_bad_call(what, device='cpu'):
    """The registered operators refuse what the kernels cannot take, with a ValueError."""
    kernels()
    q, k, v, power = make_inputs(1, 2, 3, 4, 5, 6, torch.float32, device=device)
    ops = torch.ops.mmlinattn
    if what == 'backward state':
        out, state, den = ops.polarity_linear_attention_triton_forward(q, k, v, power, EPS)
        ops.polarity_linear_attention_triton_backward(out, q, k, v, power, out, state[..., :3], den)
    calls = {
        'float64': (q.double(), k.double(), v.double(), power.double()),
        'head dim': (q, k[..., :4], v, power),
        'odd dv': (q, k, v[..., :5], power),
        'power shape': (q, k, v, power[None]),
        'power dtype': (q, k, v, power.half()),
    }
    ops.polarity_linear_attention_triton_forward(*calls[what], EPS)


def check_unsupported_reasons():
    """What the dispatcher asks before choosing these kernels: fp64 is declined with a reason;
    CPU tensors run (in the interpreter)."""
    mod = kernels()
    assert torch.float64 not in mod.TRITON_DTYPES
    assert 'float64' in mod.unsupported_reason('cuda', torch.float64)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert mod.unsupported_reason('cpu', dtype) == '', dtype


# ---- tests ------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def interpreter():
    """One spawned worker with TRITON_INTERPRET=1 in its environment (see the module docstring);
    this process's environment is restored as soon as the worker has started."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'))
    try:
        with mock.patch.dict(os.environ, {'TRITON_INTERPRET': '1'}):
            pool.submit(check_interpreted).result()  # the worker starts here, with the variable
        yield pool
    finally:
        pool.shutdown()


def run(pool, check, *args):
    return pool.submit(check, *args).result()


def case_id(case):
    return 'B{}h{}-N{}-n{}-d{}-dv{}'.format(*case)


@pytest.mark.parametrize('case', CASES + [CHUNKED, NO_QUERIES], ids=case_id)
def test_matches_reference_fp32(interpreter, case):
    run(interpreter, check_against_reference, case, 'float32')


@pytest.mark.parametrize('dtype_name', ['float16', 'bfloat16'])
def test_matches_reference_half(interpreter, dtype_name):
    """fp16 / bf16 inputs, loaded as they are and computed in fp32 (the interpreter has no bf16
    arithmetic; the kernels convert every load to fp32, so it runs the same code as the GPU)."""
    run(interpreter, check_against_reference, (2, 1, 't+1', 't-1', 't+1', 't'), dtype_name)


def test_nan_propagation(interpreter):
    run(interpreter, check_nan_propagation)


def test_backward_is_deterministic(interpreter):
    run(interpreter, check_backward_is_deterministic)


def test_opcheck(interpreter):
    run(interpreter, check_opcheck, 'float32', 'cpu',
        ('test_schema', 'test_autograd_registration', 'test_faketensor'))


def test_unsupported_reasons(interpreter):
    run(interpreter, check_unsupported_reasons)


@pytest.mark.parametrize('what, message', [
    ('float64', 'takes float32, float16 or bfloat16, got torch.float64'),
    ('head dim', 'same head dim'),
    ('odd dv', 'even'),
    ('power shape', r'power must have shape \[2, 5\]'),
    ('power dtype', 'power must have the dtype and device of q'),
    ('backward state', r'state must be torch.float32 of shape \[1, 2, 10, 8\]'),
])
def test_bad_calls_raise_value_error(interpreter, what, message):
    with pytest.raises(ValueError, match=message):
        run(interpreter, check_bad_call, what)


@pytest.mark.cuda
@pytest.mark.parametrize('dtype_name, tol', [('float32', 1e-4), ('float16', 4e-3),
                                             ('bfloat16', 3e-2)])
@pytest.mark.parametrize('case', CASES + [CHUNKED, (2, 2, 3136, 3136, 64, 64),
                                          (2, 8, 49, 49, 64, 64)], ids=case_id)
def test_cuda_matches_reference(case, dtype_name, tol):
    check_against_reference(case, dtype_name, 'cuda', tol)


@pytest.mark.cuda
def test_cuda_nan_deterministic_and_bad_calls():
    check_nan_propagation('cuda')
    check_backward_is_deterministic('cuda')
    with pytest.raises(ValueError, match='takes float32, float16 or bfloat16'):
        check_bad_call('float64', 'cuda')


@pytest.mark.cuda
@pytest.mark.parametrize('dtype_name', ['float32', 'float16'])
def test_cuda_opcheck(dtype_name):
    check_opcheck(dtype_name, 'cuda')


@pytest.mark.cuda
def test_cuda_compiles_without_graph_break():
    """torch.compile(fullgraph=True) sees into the triton_op: forward and backward as in eager."""
    kernels()
    q, k, v, power = make_inputs(2, 2, 100, 90, 32, 32, torch.float32, device='cuda')
    grad_out = random_grad_out((q, k, v, power))
    compiled = torch.compile(triton_attention, fullgraph=True)
    eager = forward_backward(triton_attention, (q, k, v, power), grad_out)
    traced = forward_backward(compiled, (q, k, v, power), grad_out)
    for name, a, b in zip(('out', 'dq', 'dk', 'dv', 'dpower'), eager, traced):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
