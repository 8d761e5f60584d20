"""Dispatch of the ops (mmlinattn/ops/dispatch.py): the dtype rules, the once-per-reason fallback
warning, MMLINATTN_OPS, and a package without its extension."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from mmlinattn.ops import FallbackWarning, dispatch, laplacian_kernel, newton_schulz_inverse
from mmlinattn.ops.validation import compute_dtype, promote

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_one_dtype_rule():
    assert compute_dtype(torch.float64) == torch.float64
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert compute_dtype(dtype) == torch.float32
    assert promote(torch.ones(1, dtype=torch.float16), torch.ones(1)) == torch.float32
    assert promote(torch.ones(1), torch.ones(1, dtype=torch.float64)) == torch.float64
    for op in dispatch.KERNEL_DTYPES:  # half inputs on the CPU run the fp32 kernel, or bf16's
        bf16 = torch.bfloat16 if torch.bfloat16 in dispatch.KERNEL_DTYPES[op]['cpu'] else torch.float32
        assert dispatch.kernel_dtype(op, 'cpu', torch.bfloat16) == bf16
        assert dispatch.kernel_dtype(op, 'cpu', torch.float16) == torch.float32
        assert dispatch.kernel_dtype(op, 'cpu', torch.float64) == torch.float64
    assert dispatch.kernel_dtype('polarity_linear_attention', 'cpu', torch.bfloat16) == torch.bfloat16
    assert dispatch.kernel_dtype('laplacian_kernel', 'cuda', torch.float64) is None


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which fallbacks were already reported, so this test sees its own warning."""
    monkeypatch.setattr(dispatch, '_warned', set())
    monkeypatch.setenv('MMLINATTN_OPS', 'auto')


@pytest.mark.compiled_ops  # with the extension loaded, the reason is the device
def test_fallback_says_why_once_per_reason(fresh_warnings):
    """A device without compiled kernels ('meta' here) runs the reference, and says so once."""
    q = torch.empty(1, 2, 5, 4, device='meta')
    with pytest.warns(FallbackWarning, match=r"laplacian_kernel has no compiled kernel for device "
                      r"'meta'; laplacian_kernel runs its pure-PyTorch reference"):
        out = laplacian_kernel(q, q)
    assert out.shape == (1, 2, 5, 5) and out.device.type == 'meta'
    with warnings.catch_warnings():
        warnings.simplefilter('error', FallbackWarning)
        laplacian_kernel(q, q)  # the same reason: silent
    with pytest.warns(FallbackWarning, match='newton_schulz_inverse has no compiled kernel'):
        newton_schulz_inverse(torch.empty(3, 4, 4, device='meta'))


@pytest.mark.compiled_ops
def test_compiled_mode_makes_a_fallback_an_error(monkeypatch):
    monkeypatch.setenv('MMLINATTN_OPS', 'compiled')
    with pytest.raises(RuntimeError, match="MMLINATTN_OPS=compiled but laplacian_kernel has no "
                       "compiled kernel for device 'meta'"):
        laplacian_kernel(torch.empty(1, 1, 2, 3, device='meta'), torch.empty(1, 1, 2, 3,
                                                                             device='meta'))


def test_bad_mode_raises_value_error(monkeypatch):
    monkeypatch.setenv('MMLINATTN_OPS', 'fast')
    with pytest.raises(ValueError, match=r"MMLINATTN_OPS must be one of \('auto', 'reference', "
                       r"'compiled', 'triton'\), got 'fast'"):
        laplacian_kernel(torch.ones(1, 1, 2, 3), torch.ones(1, 1, 2, 3))


@pytest.mark.parametrize('setup,reason', [
    pytest.param("sys.modules['mmlinattn._ext'] = None  # importing it now raises ImportError",
                 'the extension mmlinattn._ext is not built', marks=pytest.mark.compiled_ops),
    pytest.param("import types; sys.modules['mmlinattn._ext'] = types.ModuleType('mmlinattn._ext')"
                 "  # an extension that defines none of the operators",
                 'the extension mmlinattn._ext was built from other sources (it lacks the operators '
                 'laplacian_kernel_forward', marks=pytest.mark.compiled_ops),
    ("torch.__version__ = torch.torch_version.TorchVersion('2.1.2')",
     'the extension mmlinattn._ext is not used: torch 2.1.2 lacks torch.library.register_fake'),
])
def test_without_the_extension_the_reference_runs(setup, reason):
    """An unbuilt (or broken) extension, or a torch too old for its operators: the package imports,
    extension_status() says why, the ops run their references after one FallbackWarning, and their
    results are the references'."""
    script = f'''
import sys, warnings
import torch
{setup}
from mmlinattn.ops import (FallbackWarning, extension_status, laplacian_kernel,
                           newton_schulz_inverse, polarity_linear_attention)
from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference
from mmlinattn.ops.newton_schulz.reference import newton_schulz_inverse_reference
from mmlinattn.ops.polarity_attention.reference import polarity_linear_attention_reference
assert extension_status().startswith('not loaded: {reason}'), extension_status()
q = torch.randn(1, 2, 6, 4)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    out = laplacian_kernel(q, q)
    v = newton_schulz_inverse(out)
    y = polarity_linear_attention(q, q, q, torch.ones(2, 4) * 2)
fallbacks = [w for w in caught if issubclass(w.category, FallbackWarning)]
assert len(fallbacks) == 1 and '{reason}' in str(fallbacks[0].message), fallbacks
assert torch.equal(out, laplacian_kernel_reference(q, q, 4.0))
assert torch.equal(v, newton_schulz_inverse_reference(out, 20, 1e-2))
assert torch.equal(y, polarity_linear_attention_reference(q, q, q, torch.ones(2, 4) * 2))
'''
    env = dict(os.environ, MMLINATTN_OPS='auto')
    subprocess.run([sys.executable, '-c', script], check=True, env=env, cwd=REPO_ROOT)


def test_cuda_default_is_one_table_of_every_op():
    """auto on CUDA: the table's implementation, then the other kernel, then the reference; on
    other devices the C++ kernel, then the reference (Triton never runs there unless forced)."""
    assert set(dispatch.CUDA_DEFAULT) == set(dispatch.PACKAGES) == set(dispatch.KERNEL_DTYPES)
    for op, first in dispatch.CUDA_DEFAULT.items():
        assert dispatch.auto_order(op, 'cpu') == ('compiled', 'reference')
        if first == 'reference':  # no kernel of ours on CUDA, by design: no fallback to warn about
            assert dispatch.auto_order(op, 'cuda') == ('reference', )
            assert 'cuda' not in dispatch.KERNEL_DTYPES[op] and op not in dispatch.TRITON_KERNELS
            continue
        assert first in ('triton', 'compiled')
        order = dispatch.auto_order(op, 'cuda')
        assert order[0] == first and sorted(order[:2]) == ['compiled', 'triton']
        assert order[2] == 'reference'


def test_auto_on_cuda_runs_triton_and_says_why_it_falls_back(fresh_warnings):
    """Decided from the device type and dtype alone (no GPU needed to ask): fp32 on CUDA runs
    the Triton kernel; fp64, which it does not declare, falls back and names both reasons."""
    assert dispatch.choose('laplacian_kernel', 'cuda', torch.float32) == 'triton'
    assert dispatch.choose('laplacian_kernel', 'cuda', torch.bfloat16) == 'triton'
    with pytest.warns(FallbackWarning, match=r'the Triton kernel of laplacian_kernel takes float32, '
                      r'float16, bfloat16, not float64; .*; laplacian_kernel runs its '):
        dispatch.choose('laplacian_kernel', 'cuda', torch.float64)


@pytest.mark.parametrize('op,device,dtype,match', [
    ('laplacian_kernel', 'meta', torch.float32, "laplacian_kernel has no Triton kernel for device "
     "'meta'"),
    ('newton_schulz_inverse', 'cuda', torch.float64, 'the Triton kernel of newton_schulz_inverse '
     'takes float32, not float64'),
    ('laplacian_kernel', 'cuda', torch.float64, 'the Triton kernel of laplacian_kernel takes '
     'float32, float16, bfloat16, not float64'),
])
def test_triton_mode_says_why_it_cannot_run(monkeypatch, op, device, dtype, match):
    monkeypatch.setenv('MMLINATTN_OPS', 'triton')
    with pytest.raises(RuntimeError, match='MMLINATTN_OPS=triton but ' + match):
        dispatch.choose(op, device, dtype)


def test_newton_schulz_beyond_the_triton_tile_runs_another_implementation(monkeypatch):
    """The Triton Newton-Schulz kernel holds one matrix per program (M <= 64): a larger M on CUDA
    runs the next implementation of auto's order with a FallbackWarning, and triton mode raises."""
    limit = dispatch.TRITON_KERNELS['newton_schulz_inverse'].max_size
    args = ('newton_schulz_inverse', 'cuda', torch.float32)
    assert dispatch.choose_for_size(*args, limit) == 'triton'
    with pytest.warns(FallbackWarning, match=f'takes sizes up to {limit}, got {limit + 1}'):
        assert dispatch.choose_for_size(*args, limit + 1) in ('compiled', 'reference')
    monkeypatch.setenv('MMLINATTN_OPS', 'triton')
    with pytest.raises(RuntimeError, match=f'MMLINATTN_OPS=triton but .* up to {limit}'):
        dispatch.choose_for_size(*args, limit + 1)


def run_script(script, **env):
    """``script`` in a fresh interpreter with ``env`` (None removes a variable)."""
    full_env = dict(os.environ)
    for key, value in env.items():
        full_env.pop(key, None)
        if value is not None:
            full_env[key] = value
    subprocess.run([sys.executable, '-c', script], check=True, env=full_env, cwd=REPO_ROOT)


def test_triton_on_cpu_needs_the_interpreter():
    """Without TRITON_INTERPRET=1, MMLINATTN_OPS=triton on CPU tensors says how to run it; with
    it, triton mode runs the kernels on CPU tensors while auto keeps the C++ kernel/reference."""
    run_script("""
import pytest, torch
from mmlinattn.ops import dispatch, extension_status, laplacian_kernel
with pytest.raises(RuntimeError, match="MMLINATTN_OPS=triton but the Triton kernel of laplacian_kernel "
                   "runs on CPU tensors only through triton's interpreter \\(set TRITON_INTERPRET=1"):
    laplacian_kernel(torch.ones(1, 1, 2, 3), torch.ones(1, 1, 2, 3))
assert ('triton: laplacian_kernel, newton_schulz_inverse, polarity_linear_attention (CUDA)'
        in extension_status()), extension_status()
""", MMLINATTN_OPS='triton', TRITON_INTERPRET=None)
    run_script("""
import os, torch
from mmlinattn.ops import dispatch, extension_status
assert dispatch.choose('laplacian_kernel', 'cpu', torch.float16) == 'triton'
assert ('triton: laplacian_kernel, newton_schulz_inverse, polarity_linear_attention '
        '(interpreter, CPU tensors)' in extension_status()), extension_status()
os.environ['MMLINATTN_OPS'] = 'auto'
assert dispatch.choose('laplacian_kernel', 'cpu', torch.float32) in ('compiled', 'reference')
""", MMLINATTN_OPS='triton', TRITON_INTERPRET='1')


def test_without_triton_behaviour_is_as_before_and_says_why():
    """No triton (CPU-only wheels, other platforms): the package imports, extension_status() says
    why, CPU ops run as before, triton mode raises, auto on CUDA names the reason."""
    run_script("""
import sys
sys.modules['triton'] = None  # importing it now raises ImportError
import pytest, torch, warnings
from mmlinattn.ops import FallbackWarning, dispatch, extension_status, laplacian_kernel
from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference
reason = 'triton is not installed'
assert 'triton: not available: ' + reason in extension_status(), extension_status()
q = torch.randn(1, 2, 5, 3)
torch.testing.assert_close(laplacian_kernel(q, q), laplacian_kernel_reference(q, q, 4.0))
with pytest.warns(FallbackWarning, match=reason + '.*laplacian_kernel runs its'):
    dispatch.choose('laplacian_kernel', 'cuda', torch.float32)
import os
os.environ['MMLINATTN_OPS'] = 'triton'
with pytest.raises(RuntimeError, match='MMLINATTN_OPS=triton but ' + reason):
    laplacian_kernel(q, q)
""", MMLINATTN_OPS='auto')


def test_import_does_not_load_the_triton_kernels():
    run_script("""
import sys
import mmlinattn
assert 'mmlinattn.ops.laplacian_kernel.triton' not in sys.modules
""")


@pytest.mark.parametrize('before', [None, 'compiled'])
def test_forced_restores_the_mode(monkeypatch, before):
    """export_onnx and the self-test rely on ``forced`` putting MMLINATTN_OPS back, also when
    the body raises."""
    if before is None:
        monkeypatch.delenv('MMLINATTN_OPS', raising=False)
    else:
        monkeypatch.setenv('MMLINATTN_OPS', before)
    with pytest.raises(KeyError):
        with dispatch.forced('reference'):
            assert os.environ['MMLINATTN_OPS'] == 'reference'
            raise KeyError('body failed')
    assert os.environ.get('MMLINATTN_OPS') == before
