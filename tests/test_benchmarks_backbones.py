"""``tools/benchmark.py backbone``: its cases per compile mode, the torch.compile call each mode makes,
and the table's ratio columns from synthetic measurements."""
import pytest
import torch

from dev.benchmarks import backbones
from dev.benchmarks.backbones import BackboneMeasurement, case_name


def test_cases_per_compile_mode():
    eager = {case.name for case in backbones.cases('cpu')}
    static = {case.name for case in backbones.cases('cpu', 'static')}
    dynamic = {case.name for case in backbones.cases('cpu', 'dynamic')}
    grid = [(model, size) for model in backbones.BACKBONES for size in backbones.SIZES]
    assert eager == {case_name(m, s, phase) for m, s in grid for phase in backbones.PHASES}
    assert static == {case_name(m, s, 'compiled ' + phase) for m, s in grid for phase in backbones.PHASES}
    # dynamic: this project's backbones only (mmdet's are the yardstick), the forward only
    assert backbones.OURS == ['LaplacianFormer-T', 'LaplacianFormer-T paper-literal m', 'Pola-PVT-T',
                              'Pola-Swin-T']
    assert dynamic == {case_name(m, s, 'dynamic fwd') for m in backbones.OURS for s in backbones.SIZES}


@pytest.mark.parametrize('model_name, mode, expected', [
    ('Pola-Swin-T', 'dynamic', dict(fullgraph=True, dynamic=True, options=None)),
    ('LaplacianFormer-T', 'dynamic',
     dict(fullgraph=True, dynamic=True, options={'strict_output_strides': True})),
    ('Pola-PVT-T', 'dynamic', dict(fullgraph=True, dynamic=True, options=None)),
    ('Pola-PVT-T', 'static', dict(fullgraph=True, dynamic=False)),
])
def test_each_mode_compiles_with_the_backbones_options(monkeypatch, model_name, mode, expected):
    calls = []
    monkeypatch.setattr(torch, 'compile', lambda model, **kwargs: calls.append(kwargs) or model)
    forward = backbones._callable(model_name, (64, 64), 'fwd', 'cpu', mode)
    assert calls == [expected]
    assert len(forward()) == 4  # the four feature maps of the (uncompiled) backbone


def test_backbone_table_ratios():
    """eager / compiled and eager / dynamic are the eager time over the compiled one, per phase;
    "/ 512^2" divides by the same backbone's time at 512^2."""
    results = {}
    for size, scale in (('512^2', 1.0), ('1024^2', 4.0)):
        for phase, ms in (('fwd', 10.0), ('fwd+bwd', 30.0)):
            results[case_name('Pola-PVT-T', size, phase)] = BackboneMeasurement(ms * scale, 1.0, cpu_ms=ms)
            results[case_name('Pola-PVT-T', size, 'compiled ' + phase)] = BackboneMeasurement(
                ms * scale / 2, None, cpu_ms=ms)
        results[case_name('Pola-PVT-T', size, 'dynamic fwd')] = BackboneMeasurement(
            10.0 * scale / 1.25, None, cpu_ms=10.0)
    section = backbones.summarise(results, 'cpu')
    for column in ('compiled fwd ms', 'fwd+bwd eager / compiled', 'dynamic fwd ms', 'fwd eager / dynamic'):
        assert column in section.columns
    assert 'dynamic fwd+bwd ms' not in section.columns
    row = next(row for row in section.rows if row['input'] == '1024^2')
    assert row['fwd eager / compiled'] == pytest.approx(2.0)
    assert row['fwd+bwd eager / compiled'] == pytest.approx(2.0)
    assert row['fwd eager / dynamic'] == pytest.approx(1.25)
    assert row['fwd / 512^2'] == pytest.approx(4.0)
    assert any(note.startswith('dynamic: ') and "LaplacianFormer {'strict_output_strides': True}" in note
               for note in section.notes)


def test_backbone_table_without_compiled_cases_has_no_compile_columns():
    results = {case_name('Pola-PVT-T', '512^2', phase): BackboneMeasurement(1.0, 1.0, cpu_ms=1.0)
               for phase in backbones.PHASES}
    section = backbones.summarise(results, 'cpu')
    assert not any('compiled' in column or 'dynamic' in column for column in section.columns)


def test_amp_cases_run_under_autocast(monkeypatch):
    """--amp wraps every case (and its warm-up) in torch.autocast(device, float16); the case names
    stay the same."""
    entered, autocast = [], torch.autocast

    def recording(*args, **kwargs):
        entered.append((args, kwargs))
        return autocast(*args, **kwargs)

    monkeypatch.setattr(backbones.torch, 'autocast', recording)
    amp_cases = backbones.cases('cpu', amp=True)
    assert [c.name for c in amp_cases] == [c.name for c in backbones.cases('cpu')]
    case = next(c for c in amp_cases if c.name == case_name('Pola-PVT-T', '224^2', 'fwd'))
    assert len(case.warm_up()()) == 4
    assert entered[0] == (('cpu', ), {'dtype': torch.float16})
