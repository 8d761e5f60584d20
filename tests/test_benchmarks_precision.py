"""tools/benchmark.py precision on a tiny input: both precisions in both memory formats measured,
the faster format kept per precision, FLOPs counted, and the table's ratios."""
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
