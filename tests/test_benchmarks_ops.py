"""``tools/benchmark.py ops``: the tables its modules make from measurements (speed-ups, fractions of
the CPU limit, the Newton–Schulz bound) and the step count that bound rests on."""
import pytest
import torch

from dev.benchmarks import ops_laplacian, ops_polarity
from dev.benchmarks.common import Measurement
from mmlinattn.ops.newton_schulz.reference import newton_schulz_inverse_reference

# A CPU limit as measured_cpu_limit reports it (G element-ops/s, GFLOP/s).
LIMIT = {'fwd': 50.0, 'bwd': 20.0, 'fwd+bwd': 3 / (1 / 50.0 + 2 / 20.0), 'fma GFLOP/s': 400.0,
         'threads': 2}


@pytest.mark.parametrize('m', ops_laplacian.NS_SIZES)
def test_newton_schulz_step_count_is_the_steps_the_reference_takes(m):
    """k product steps per matrix: the iteration with k product steps (iters = k + 1) gives every
    matrix exactly its result at the benchmark's 20 steps, and with one step fewer it does not."""
    a = ops_laplacian._landmark_gram(m, 'cpu')
    steps = ops_laplacian.newton_schulz_product_steps(a)
    assert steps.shape == (ops_laplacian.NS_BATCH, )
    assert 0 < steps.min() and steps.max() < ops_laplacian.NS_ITERS - 1  # every matrix stops early
    full = newton_schulz_inverse_reference(a, ops_laplacian.NS_ITERS, ops_laplacian.EPS)
    for k in steps.unique().tolist():
        chosen = steps == k
        enough = newton_schulz_inverse_reference(a[chosen], k + 1, ops_laplacian.EPS)
        fewer = newton_schulz_inverse_reference(a[chosen], k, ops_laplacian.EPS)
        assert torch.equal(enough, full[chosen]), f'k={k}'
        assert (fewer != full[chosen]).flatten(1).any(1).all(), f'k={k}'


def test_newton_schulz_flops_count_the_symmetric_half_products():
    m, last = 10, ops_laplacian.NS_ITERS - 1
    # k = 3: R R three times, V + V R twice (the first V is I/s), then 3 M^3 for 2V - (V P) V;
    # k = NS_ITERS - 1: the last product step squares R no more
    assert ops_laplacian.newton_schulz_flops(m, torch.tensor([3])) == (3 + 2 + 3) * m**3
    assert ops_laplacian.newton_schulz_flops(m, torch.tensor([last])) == ((last - 1) + (last - 1) + 3) * m**3
    assert ops_laplacian.newton_schulz_flops(m, torch.tensor([3, 3])) == 2 * (3 + 2 + 3) * m**3


def _measurements(cases, time_ms, peak_mb=lambda name: 1.0):
    return {case.name: Measurement(time_ms(case.name), peak_mb(case.name)) for case in cases}


def test_laplacian_ops_table(monkeypatch):
    """Speed-ups are cdist (or linalg.inv) time / compiled time, throughput and % of limit follow
    the element-op count, and the Newton–Schulz bound is its flops at the FMA peak."""
    monkeypatch.setattr(ops_laplacian, 'measured_cpu_limit', lambda: LIMIT)
    steps = {m: torch.full((ops_laplacian.NS_BATCH, ), 5) for m in ops_laplacian.NS_SIZES}
    monkeypatch.setattr(ops_laplacian, 'newton_schulz_product_steps',
                        lambda a: steps[a.shape[-1]])

    def time_ms(name):  # compiled 2 ms (fwd) / 8 ms (fwd+bwd), everything else 6x / 3x that
        base = 8.0 if name.endswith('fwd+bwd') else 2.0
        return base if ' compiled ' in name else base * (3 if 'fwd+bwd' in name else 6)

    cases = ops_laplacian.cases('cpu')
    section = ops_laplacian.summarise(_measurements(cases, time_ms), 'cpu')
    rows = {(row['shape'], row['impl']): row for row in section.rows}
    assert len(section.rows) == (len(ops_laplacian.KERNEL_SHAPES) * len(ops_laplacian.KERNEL_IMPLS)
                                 + len(ops_laplacian.NS_SIZES) * len(ops_laplacian.NS_FORWARD))
    for label, (b, h, n, m, d) in ops_laplacian.KERNEL_SHAPES.items():
        row = rows[label, 'compiled']
        assert row['speed-up fwd'] == pytest.approx(6.0) and row['speed-up fwd+bwd'] == pytest.approx(3.0)
        assert row['G elem-op/s fwd'] == pytest.approx(b * h * n * m * d / 2e6)
        assert row['G elem-op/s fwd+bwd'] == pytest.approx(3 * b * h * n * m * d / 8e6)
        assert row['% of limit fwd'] == pytest.approx(100 * row['G elem-op/s fwd'] / LIMIT['fwd'])
        assert row['% of limit fwd+bwd'] == pytest.approx(
            100 * row['G elem-op/s fwd+bwd'] / LIMIT['fwd+bwd'])
    for m in ops_laplacian.NS_SIZES:
        shape = f'batch {ops_laplacian.NS_BATCH}, M={m}'
        compiled, inverse = rows[shape, 'compiled'], rows[shape, 'linalg.inv']
        bound_ms = ops_laplacian.NS_BATCH * (5 + 4 + 3) * m**3 / (LIMIT['fma GFLOP/s'] * 1e6)
        assert compiled['bound fwd ms'] == pytest.approx(bound_ms)
        assert compiled['% of limit fwd'] == pytest.approx(100 * bound_ms / 2.0)
        assert inverse['speed-up fwd'] == pytest.approx(6.0)
        assert rows[shape, 'reference']['speed-up fwd+bwd'] == pytest.approx(3.0)
        assert inverse['fwd+bwd ms'] is None  # linalg.inv is timed forward only
    assert any('5.0 on average at M=49' in note for note in section.notes)


def test_laplacian_ops_table_without_a_cpu_limit(monkeypatch):
    """Without a measured limit (no g++ or AVX-512, or on CUDA) the limit columns are left out."""
    monkeypatch.setattr(ops_laplacian, 'measured_cpu_limit', lambda: None)
    section = ops_laplacian.summarise(_measurements(ops_laplacian.cases('cpu'), lambda name: 1.0),
                                      'cpu')
    assert not any('limit' in column or 'bound' in column for column in section.columns)
    assert all('% of limit fwd' not in row for row in section.rows)


def test_polarity_ops_table():
    """Speed-up and memory ratios are the composition's over the fused op's."""
    cases = ops_polarity.cases('cpu')
    fused_or_not = lambda fused, other: (lambda name: fused if ' fused ' in name else other)
    section = ops_polarity.summarise(_measurements(cases, fused_or_not(1.0, 4.0), fused_or_not(2.0, 8.0)),
                                     'cpu')
    assert len(section.rows) == len(ops_polarity.SHAPES) * len(ops_polarity.IMPLS)
    for row in section.rows:
        fused = row['impl'] == 'fused'
        assert row['speed-up fwd'] == row['speed-up fwd+bwd'] == pytest.approx(4.0 if fused else 1.0)
        assert row['peak / composition fwd'] == pytest.approx(0.25 if fused else 1.0)
        assert row['peak / composition fwd+bwd'] == pytest.approx(0.25 if fused else 1.0)


def test_implementations_cases_cover_every_op_shape_and_available_kernel():
    """Cases per op: the kernels that run on the device (decided from the device type: no GPU is
    needed to list the CUDA cases) and the baselines, at the authors' M = 16..128 and stage 1;
    the Triton Newton-Schulz only up to its tile's M = 64."""
    from dev.benchmarks import ops_implementations as impls
    from mmlinattn.ops import dispatch
    names = {case.name for case in impls.cases('cuda')}
    for op, shapes in impls.SHAPES.items():
        expected = impls.implementations(op, 'cuda')
        assert 'reference' in expected and set(impls.BASELINES[op]) <= set(expected)
        assert ('triton' in expected) == (dispatch.unavailable('triton', op, 'cuda',
                                                               torch.float32) is None)
        for label, shape in shapes.items():
            for impl in expected:
                if op == 'newton_schulz_inverse' and impl == 'triton' and shape[-1] > 64:
                    assert impls.case_name(op, label, impl, 'fwd') not in names
                    continue
                assert impls.case_name(op, label, impl, 'fwd') in names
                assert (impls.case_name(op, label, impl, 'fwd+bwd') in names) == (
                    impl not in impls.FORWARD_ONLY)
    assert all(f'M={m}' in ' '.join(impls.SHAPES[op]) for m in (16, 32, 64, 128)
               for op in ('laplacian_kernel', 'newton_schulz_inverse'))
    assert 'triton' in impls.implementations('laplacian_kernel', 'cuda')


def test_implementations_table_and_default_decision():
    """Synthetic times: ratios to the reference, and per op the decision line (the C++ kernel
    faster than Triton: switch if the self-test passes it; slower or absent: keep / not decided)."""
    from dev.benchmarks import ops_implementations as impls
    from dev.benchmarks.common import Measurement

    def time_ms(op, impl):  # C++ faster for laplacian_kernel, Triton faster for the others
        fast = 'compiled' if op == 'laplacian_kernel' else 'triton'
        return {fast: 1.0, 'reference': 4.0}.get(impl, 2.0)

    results = {}
    for op, shapes in impls.SHAPES.items():
        for label, shape in shapes.items():
            for impl in ('triton', 'compiled', 'reference', *impls.BASELINES[op]):
                for phase in ('fwd', 'fwd+bwd'):
                    if op == 'polarity_linear_attention' and impl == 'compiled':
                        continue  # a kernel that did not run
                    if not impls.takes(op, impl, shape):
                        continue  # Triton's Newton-Schulz at M = 128: decided without it
                    results[impls.case_name(op, label, impl, phase)] = Measurement(
                        time_ms(op, impl), 1.0)
    section = impls.summarise(results, 'cuda')
    rows = {(r['op'], r['shape'], r['impl']): r for r in section.rows}
    row = rows['laplacian_kernel', 'N=56^2, M=16', 'compiled']
    assert row['reference / this fwd+bwd'] == pytest.approx(4.0)
    decides = [note for note in section.notes if note.startswith('decides: ')]
    assert len(decides) == 3
    assert 'faster: compiled; default triton: switch to compiled if the self-test passes it' in decides[0]
    assert ('over 4 shapes: triton 4.00 ms, compiled 8.00 ms; faster: triton; default triton: keep'
            in decides[1])
    assert 'not decided here (compiled did not run on this device)' in decides[2]
