"""``python -m mmlinattn.ops.selftest``: it passes on the CPU with every implementation available
here (the Triton kernels through the interpreter), and a broken implementation makes it FAIL."""
import dataclasses
import os
import subprocess
import sys

import torch

from mmlinattn.ops import dispatch, selftest
from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_selftest_passes_on_cpu():
    env = dict(os.environ, TRITON_INTERPRET='1')
    env.pop('MMLINATTN_OPS', None)
    proc = subprocess.run([sys.executable, '-m', 'mmlinattn.ops.selftest', '--device', 'cpu',
                           '--quick'], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = [line.split(' | ') for line in proc.stdout.splitlines() if ' | ' in line]
    results = {(r[0].strip(), r[1].strip(), r[2].strip()): r[-1].strip() for r in rows[1:]}
    for op in selftest.CASES:
        assert results[(op, 'reference', 'float32')] == 'PASS', proc.stdout
    for dtype in ('float32', 'float16', 'bfloat16'):  # the interpreter runs the Triton kernel
        assert results[('laplacian_kernel', 'triton', dtype)] == 'PASS', proc.stdout
    if dispatch.extension_loaded():
        assert results[('laplacian_kernel', 'compiled', 'float32')] == 'PASS', proc.stdout
        for op in selftest.CASES:  # the CPU's mixed precision, for every op
            assert results[(op, 'compiled', 'bfloat16')] == 'PASS', proc.stdout
    assert 'FAIL' not in results.values() and proc.stdout.rstrip().endswith('all PASS')


def test_cpu_rows_are_fp32_and_bf16_without_the_interpreter(monkeypatch):
    monkeypatch.setattr(dispatch, 'triton_interpreted', lambda op: False)
    for op in selftest.CASES:
        assert selftest.dtypes_for(op, 'cpu') == [torch.float32, torch.bfloat16], op


def test_a_broken_implementation_fails(monkeypatch, capsys):
    """One output entry off by 1e-3: the self-test prints FAIL for it and exits non-zero."""

    def shifted(q, k):
        out = laplacian_kernel_reference(q, k, selftest.LAM)
        delta = torch.zeros_like(out)
        delta.view(-1)[0] = 1e-3
        return out + delta

    case = selftest.CASES['laplacian_kernel']
    broken = selftest.Implementation('broken', lambda device_type, dtype: None, shifted)
    only = dataclasses.replace(case, implementations=[case.implementations[0], broken])
    monkeypatch.setattr(selftest, 'CASES', {'laplacian_kernel': only})
    assert selftest.main(['--device', 'cpu', '--quick']) == 1
    table = capsys.readouterr().out
    broken_rows = [line for line in table.splitlines() if '| broken ' in line]
    assert broken_rows and broken_rows[0].rstrip().endswith('FAIL'), table
    assert table.rstrip().endswith('1 FAIL')
