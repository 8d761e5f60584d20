"""tools/benchmark.py precision on a tiny input: both precisions in both memory formats measured,
the faster format kept per precision, FLOPs counted, and the table's ratios."""
import argparse

import pytest

from dev.benchmarks import precision


def test_rows_keep_the_faster_format_and_relate_to_swin_and_the_peak(monkeypatch):
    monkeypatch.setitem(precision.SIZES, '64^2 x2', (64, 64, 2))
    logged = []
    rows = [precision.measure(model, '64^2 x2', 'cpu', repeats=1, log=lambda *a, **k: logged.append(a))
            for model in ('LaplacianFormer-T', precision.REFERENCE)]
    assert len(logged) == 2 * len(precision.PRECISIONS) * len(precision.FORMATS)
    for row in rows:
        for p in precision.PRECISIONS:
            assert row[f'{p} ms'] > 0 and row[f'{p} format'] in precision.FORMATS
        assert row['GFLOP'] > 0 and row['bf16 gain'] == pytest.approx(row['fp32 ms'] / row['bf16 ms'])
    section = precision.summarise(rows, {'bf16': 800.0, 'fp32': 130.0})
    lap, swin = section.rows
    assert swin['vs Swin-T bf16'] == pytest.approx(1.0)
    assert lap['vs Swin-T bf16'] == pytest.approx(swin['bf16 ms'] / lap['bf16 ms'])
    assert lap['% of bf16 peak'] == pytest.approx(100 * lap['GFLOP'] / lap['bf16 ms'] * 1e3 / 800.0)
    assert set(section.columns) <= set(lap)


def test_counted_flops_are_the_matmuls_of_forward_and_backward():
    import torch
    a = torch.randn(64, 32, requires_grad=True)
    b = torch.randn(32, 16, requires_grad=True)
    gflop = precision.counted_gflop(lambda: torch.autograd.grad((a @ b).sum(), [a, b]))
    assert gflop == pytest.approx(3 * 2 * 64 * 32 * 16 / 1e9)  # forward + two backward products


def test_every_benchmark_records_the_cpu_and_its_bf16_instructions():
    # bf16 is emulated, and slower than fp32, on a CPU without them: a table must say which it was.
    from dev.benchmarks.common import environment

    from mmlinattn.cpu_autocast import BF16_CPU_FLAGS, cpu_flags
    info = environment()
    with open('/proc/cpuinfo') as f:
        names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
    assert info['cpu'] == names[0]
    assert info['cpu_bf16_flags'] == sorted(cpu_flags() & set(BF16_CPU_FLAGS))
    assert set(info['cpu_bf16_flags']) <= set(BF16_CPU_FLAGS)


def test_precision_benchmark_warns_on_a_cpu_without_bf16_instructions(monkeypatch):
    import mmlinattn.cpu_autocast as cpu_autocast
    monkeypatch.setattr(cpu_autocast, 'cpu_flags', lambda: frozenset({'avx2', 'fma'}))
    cpu_autocast.warn_if_cpu_lacks_bf16.cache_clear()
    monkeypatch.setattr(precision, 'matmul_peak_gflops', lambda device, dtype: 1.0)

    class Measured(Exception):
        pass

    def measure(*args, **kwargs):
        raise Measured

    monkeypatch.setattr(precision, 'measure', measure)
    args = argparse.Namespace(device='cpu', threads=None, models=['LaplacianFormer-T'],
                              sizes=['256^2 x2'], repeats=1, out=None)
    try:  # the warning comes before the first measurement
        with pytest.warns(UserWarning, match='avx512_bf16 / amx_bf16'), pytest.raises(Measured):
            precision.main(args)
    finally:
        cpu_autocast.warn_if_cpu_lacks_bf16.cache_clear()
