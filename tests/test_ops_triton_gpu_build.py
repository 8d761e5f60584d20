"""The Triton kernels built for real GPUs, without one.

The interpreter tests check the kernels' logic on CPU tensors; they cannot see whether a kernel
fits a GPU. Triton's compiler and the ``ptxas`` it ships need no GPU, so here every kernel launch
that the launchers make (each op, forward and backward, fp32 / fp16 / bf16, every tile size) is
recorded on CPU tensors instead of run, then compiled to a cubin for sm_80 (A100) and sm_90
(H100, H200), and its shared memory is held to the smallest opt-in limit of the GPUs since Ampere
(99 KiB per block on sm_86 / sm_89; A100 has 163 KiB, H100 227 KiB). A kernel over it would fail
at its first launch on such a GPU with Triton's ``OutOfResources``.

Recording and compiling run in a spawned worker: the kernel modules are imported there without
``TRITON_INTERPRET`` (they then hold compilable ``JITFunction``s), and never in this process.
"""
import concurrent.futures
import multiprocessing

import pytest
import torch

# both tests read one module fixture that compiles for both architectures: one worker runs them
pytestmark = pytest.mark.xdist_group('triton_gpu_build')

ARCHS = (80, 90)
SHARED_MEMORY_LIMIT = 99 * 1024  # bytes per block, opt-in, on sm_86 / sm_89
TRITON_TYPES = {torch.float32: 'fp32', torch.float16: 'fp16', torch.bfloat16: 'bf16'}
LAUNCH_OPTIONS = ('num_warps', 'num_stages')


# ---- run in the worker --------------------------------------------------------------------

class _Recorder:
    """Stands in for ``torch.library.wrap_triton``: ``wrapped(kernel)[grid](*args, **kwargs)``
    records the launch instead of running it."""

    def __init__(self):
        self.launches = []

    def __call__(self, kernel):
        recorder = self

        class _Grid:

            def __getitem__(self, grid):
                return lambda *args, **kwargs: recorder.launches.append((kernel, args, kwargs))

        return _Grid()


def _argument_type(name, value):
    if isinstance(value, torch.Tensor):
        return '*' + TRITON_TYPES[value.dtype]
    if isinstance(value, bool):
        return 'i1'
    if isinstance(value, int):
        return 'i32' if -2**31 <= value < 2**31 else 'i64'
    if isinstance(value, float):
        return 'fp32'
    raise TypeError(f'argument {name} of type {type(value).__name__}')


def _launch_spec(kernel, args, kwargs):
    """(kernel name, signature, constexprs, options) of one recorded launch, as ``triton.compile``
    takes them; constexprs left to their defaults included."""
    options = {k: kwargs[k] for k in LAUNCH_OPTIONS if k in kwargs}
    bound = dict(zip(kernel.arg_names, args))
    bound.update({k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS})
    signature, constexprs = {}, {}
    for param in kernel.params:
        value = bound[param.name] if param.name in bound else param.default
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = 'constexpr', value
        else:
            signature[param.name] = _argument_type(param.name, value)
    return kernel.fn.__name__, signature, constexprs, options


def _record_launches():
    """Every distinct launch the three ops' Triton launchers make, forward and backward, in each
    dtype they take and at each tile configuration."""
    from mmlinattn.ops.laplacian_kernel import triton as laplacian
    from mmlinattn.ops.newton_schulz import triton as newton_schulz
    from mmlinattn.ops.polarity_attention import triton as polarity
    recorder = _Recorder()
    torch.library.wrap_triton = recorder
    laplacian.wrap_triton = polarity.wrap_triton = recorder
    polarity.interpreted = lambda: True  # its launchers accept CPU tensors only when interpreted
    gen = torch.Generator().manual_seed(0)
    for dtype in TRITON_TYPES:
        q, k = torch.randn(1, 2, 5, 7, generator=gen), torch.randn(1, 2, 6, 7, generator=gen)
        q, k = q.to(dtype), k.to(dtype)
        out = laplacian._forward(q, k, 4.0)
        laplacian._backward(out, q, k, out, 4.0, True, True)

        v = torch.randn(1, 2, 6, 6, generator=gen).to(dtype)
        power = torch.full((2, 7), 2.0, dtype=dtype)
        out, state, den = polarity.polarity_triton_forward(q, k, v, power, 1e-6)
        polarity.polarity_triton_backward(out, q, k, v, power, out, state, den)
    for m in sorted({newton_schulz.block_size(m) for m in range(1, newton_schulz.MAX_M + 1)}):
        a = torch.eye(m).expand(2, m, m)
        newton_schulz.newton_schulz_triton_forward(a, 20, 1e-2, True)
        newton_schulz.newton_schulz_triton_backward(a, a, 20, 1e-2)
    specs = {}
    for launch in recorder.launches:
        name, signature, constexprs, options = _launch_spec(*launch)
        key = (name, tuple(signature.items()), tuple(constexprs.items()),
               tuple(options.items()))
        specs[key] = launch[0]
    return [(kernel, dict(sig), dict(const), dict(opts))
            for (_, sig, const, opts), kernel in specs.items()]


def _compile_all(arch):
    """[(kernel name, its signature's pointer types and constexprs, shared memory in bytes)]
    for every recorded launch compiled for sm_<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    target = GPUTarget('cuda', arch, 32)
    built = []
    for kernel, signature, constexprs, options in _record_launches():
        compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=target,
                                  options=options)
        pointers = sorted({t for t in signature.values() if t.startswith('*')})
        built.append((kernel.fn.__name__, f'{pointers} {constexprs} {options}',
                      compiled.metadata.shared))
    return built


# ---- the tests ----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def compiled_kernels():
    """{arch: [(kernel, configuration, shared bytes)]}, one worker per architecture."""
    context = multiprocessing.get_context('spawn')
    with concurrent.futures.ProcessPoolExecutor(len(ARCHS), mp_context=context) as pool:
        return dict(zip(ARCHS, pool.map(_compile_all, ARCHS)))


@pytest.mark.slow
@pytest.mark.parametrize('arch', ARCHS)
def test_every_triton_kernel_fits_the_shared_memory_of_every_gpu(compiled_kernels, arch):
    built = compiled_kernels[arch]
    names = {name for name, _, _ in built}
    # every kernel of the three ops was launched, so none escapes the check
    assert names == {'_forward_kernel', '_backward_kernel', '_newton_schulz_forward_kernel',
                     '_newton_schulz_backward_kernel', '_outer_reduce_kernel',
                     '_feature_matmul_kernel', '_feature_grad_kernel', '_den_grad_kernel'}
    over = [f'{name} {config}: {shared} bytes' for name, config, shared in built
            if shared > SHARED_MEMORY_LIMIT]
    assert not over, (f'over the {SHARED_MEMORY_LIMIT}-byte shared memory limit on sm_{arch}:\n'
                      + '\n'.join(over))
