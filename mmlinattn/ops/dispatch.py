"""Which implementation of an op runs: the pure-PyTorch reference, the C++ extension's kernel
(``compiled``) or the Triton kernel (``triton``).

- ``compiled``: the extension ``mmlinattn._ext`` registers its kernels (CPU and, when built with
  CUDA, CUDA) as ``torch.ops.mmlinattn.<name>``; each op's ``compiled.py`` adds their fake kernels
  and autograd (loaded when this module is imported).
- ``triton``: an op's ``triton.py`` defines ``torch.ops.mmlinattn.<op>_triton_*`` with
  ``torch.library.triton_op`` (:data:`TRITON_KERNELS`). It is imported on the first call that
  could run it, so ``import mmlinattn`` never imports triton. Triton kernels run on CUDA tensors,
  and on CPU tensors through triton's interpreter when ``TRITON_INTERPRET=1`` was set before
  triton was imported (how the tests run them).
- ``reference``: every op's pure-PyTorch formula (``<op>/reference.py``).

:func:`choose` decides per call, from ``MMLINATTN_OPS``, the device type and the dtype only (no
tensor values):

- ``reference`` forces the reference; ``compiled`` / ``triton`` force that implementation on the
  ops that have one of that kind for the device (:func:`has_implementation`; the others run as
  in ``auto``) and raise ``RuntimeError`` saying why where it cannot run;
- ``auto`` (the default) runs, on CUDA, :data:`CUDA_DEFAULT`'s implementation, then the other
  kernel, then the reference; on any other device the C++ kernel, then the reference. Each
  fallback is said once per process and reason with a :class:`FallbackWarning`.
- A kernel runs in a dtype it declares (:data:`KERNEL_DTYPES`, :data:`TRITON_KERNELS`); another
  input dtype runs in its compute dtype (fp32) when the kernel has that, and the result is cast
  back.

Under ``torch.compile`` / ``torch.export`` the decision is taken once while tracing (it is a
constant of the graph): changing ``MMLINATTN_OPS`` afterwards does not affect a compiled graph.
"""
import contextlib
import functools
import importlib
import os
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from .torch_compat import missing_library_api, missing_triton_api
from .validation import compute_dtype

MODES = ('auto', 'reference', 'compiled', 'triton')
_HALF_AND_FP32 = (torch.float32, torch.float16, torch.bfloat16)

# op -> the package (``mmlinattn.ops.<package>``) with its implementations, side by side.
PACKAGES = {
    'laplacian_kernel': 'laplacian_kernel',
    'newton_schulz_inverse': 'newton_schulz',
    'polarity_linear_attention': 'polarity_attention',
    'depthwise_conv2d': 'depthwise_conv',
    'roi_align': 'roi_align',
}
# op -> device type -> the dtypes its compiled (C++) kernel takes.
KERNEL_DTYPES: Dict[str, Dict[str, Tuple[torch.dtype, ...]]] = {
    'laplacian_kernel': {'cpu': (torch.float32, torch.float64, torch.bfloat16),
                         'cuda': _HALF_AND_FP32},
    'newton_schulz_inverse': {'cpu': (torch.float32, torch.float64),
                              'cuda': (torch.float32, torch.float64)},
    'polarity_linear_attention': {'cpu': (torch.float32, torch.float64, torch.bfloat16),
                                  'cuda': _HALF_AND_FP32},
    # CPU only: on CUDA, cuDNN's depthwise convolution and its gradients (the reference) are fast.
    'depthwise_conv2d': {'cpu': (torch.float32, torch.float64, torch.bfloat16)},
    # CPU only: on CUDA, mmcv's RoIAlign kernel is the one to run (mmlinattn.models.roi_extractors).
    'roi_align': {'cpu': (torch.float32, torch.float64, torch.bfloat16)},
}
# op -> the C++ extension's forward operator, whose per-device kernels are looked up.
FORWARD_OPERATORS = {
    'laplacian_kernel': 'laplacian_kernel_forward',
    'newton_schulz_inverse': 'newton_schulz_inverse',
    'polarity_linear_attention': 'polarity_linear_attention_forward',
    'depthwise_conv2d': 'depthwise_conv2d_forward',
    'roi_align': 'roi_align_forward',
}


@dataclass(frozen=True)
class TritonKernel:
    """An op's Triton implementation: the module that defines its operators and the forward
    operator's name in ``torch.ops.mmlinattn``, and the input dtypes it takes."""
    module: str
    forward: str
    dtypes: Tuple[torch.dtype, ...]
    max_size: Optional[int] = None  # the largest matrix size the kernel takes (one tile a matrix)

    def takes_size(self, size: int) -> bool:
        """Whether a matrix of ``size`` fits the kernel's tile (always, without a cap)."""
        return self.max_size is None or size <= self.max_size


TRITON_KERNELS: Dict[str, TritonKernel] = {
    'laplacian_kernel': TritonKernel('mmlinattn.ops.laplacian_kernel.triton',
                                     'laplacian_kernel_triton_forward', _HALF_AND_FP32),
    # fp32 only: half inputs reach it cast to the compute dtype. One program holds a matrix, and
    # at M > 64 (BLOCK 128) its tl.dot operands need 192 KiB (forward) to 320 KiB (backward) of
    # shared memory, over every GPU's limit (tests/test_ops_triton_gpu_build.py).
    'newton_schulz_inverse': TritonKernel('mmlinattn.ops.newton_schulz.triton',
                                          'newton_schulz_inverse_triton', (torch.float32, ),
                                          max_size=64),
    'polarity_linear_attention': TritonKernel('mmlinattn.ops.polarity_attention.triton',
                                              'polarity_linear_attention_triton_forward',
                                              _HALF_AND_FP32),
}

# The implementation ``auto`` runs on CUDA, per op. The default is the one this project verifies
# in CI (the Triton kernels, through the interpreter). The C++ CUDA kernels become an op's
# default only once a GPU run of tools/dev/gpu_check.sh shows them correct and faster; the measured
# winner becomes the default per op (gpu_check.sh prints the comparison that decides it).
CUDA_DEFAULT = {
    'laplacian_kernel': 'triton',
    'newton_schulz_inverse': 'triton',
    'polarity_linear_attention': 'triton',
    # No kernel of ours on CUDA: cuDNN's depthwise convolution and its gradients are fast there.
    'depthwise_conv2d': 'reference',
    # No kernel of ours on CUDA: mmcv's RoIAlign is fast there.
    'roi_align': 'reference',
}

IMPLEMENTATION_NAMES = {'compiled': 'compiled kernel', 'triton': 'Triton kernel',
                        'reference': 'pure-PyTorch reference (slower, more memory)'}


class FallbackWarning(UserWarning):
    """An op runs another implementation than ``auto``'s first choice (said once per reason)."""


def _load_extension() -> Optional[str]:
    """Load ``mmlinattn._ext`` and register the fake kernels and autograd; why not, if it fails."""
    missing_api = missing_library_api()
    if missing_api:
        return f'the extension mmlinattn._ext is not used: {missing_api}'
    try:
        importlib.import_module('mmlinattn._ext')
    except ImportError as err:  # not built, or built against another torch
        return (f'the extension mmlinattn._ext is not built ({err}); build it with '
                '`pip install -e . --no-build-isolation`')
    from .registration import missing_operators
    modules = [importlib.import_module(f'{__package__}.{package}.compiled')
               for package in PACKAGES.values()]
    missing = missing_operators([name for module in modules
                                 for name in (module.FORWARD, module.BACKWARD)])
    if missing:
        return (f'the extension mmlinattn._ext was built from other sources (it lacks the operators '
                f'{", ".join(missing)}); rebuild it with `pip install -e . --no-build-isolation`')
    for module in modules:
        module.register()
    return None


_warned = set()


def extension_loaded() -> bool:
    return _EXTENSION_ERROR is None


def ops_mode() -> str:
    mode = os.getenv('MMLINATTN_OPS', 'auto').strip().lower() or 'auto'
    if mode not in MODES:
        raise ValueError(f'MMLINATTN_OPS must be one of {MODES}, got {mode!r}')
    return mode


def has_kernel(op: str, device_type: str) -> bool:
    """Whether the extension has a kernel of ``op`` (a key of :data:`KERNEL_DTYPES`) for the
    device type ('cpu' / 'cuda')."""
    key = {'cpu': 'CPU', 'cuda': 'CUDA'}.get(device_type)
    return (extension_loaded() and key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(
        f'mmlinattn::{FORWARD_OPERATORS[op]}', key))


@functools.lru_cache(maxsize=None)
def _triton_load_error(op: str) -> Optional[str]:
    """Import ``op``'s Triton kernels (once); why they cannot run anywhere, or None."""
    if op not in TRITON_KERNELS:
        return f'{op} has no Triton kernel'
    try:
        importlib.import_module('triton')
    except ImportError:
        return 'triton is not installed (it comes with the CUDA wheels of torch on Linux)'
    missing_api = missing_triton_api()
    if missing_api:
        return missing_api
    try:
        importlib.import_module(TRITON_KERNELS[op].module)
    except Exception as err:  # a triton that does not match torch, or a kernel it rejects
        return f'the Triton kernels of {op} failed to load ({type(err).__name__}: {err})'
    return None


def triton_interpreted(op: str) -> bool:
    """Whether ``op``'s loaded Triton kernels run through triton's interpreter (CPU tensors)."""
    return _triton_load_error(op) is None and importlib.import_module(
        TRITON_KERNELS[op].module).INTERPRETED


def triton_status() -> str:
    """One line for logs: whether the Triton kernels load, and where they run."""
    loaded = [op for op in TRITON_KERNELS if _triton_load_error(op) is None]
    if not loaded:
        return 'not available: ' + '; '.join(
            sorted({_triton_load_error(op) for op in TRITON_KERNELS}))
    where = 'interpreter, CPU tensors' if triton_interpreted(loaded[0]) else 'CUDA'
    return f'{", ".join(loaded)} ({where})'


def extension_status() -> str:
    """One line for logs: which compiled backends are present, or why none is, and Triton's."""
    if not extension_loaded():
        compiled = f'not loaded: {_EXTENSION_ERROR}; the pure-PyTorch reference ops run'
    else:
        backends = ['CPU'] + (['CUDA'] if has_kernel('laplacian_kernel', 'cuda') else [])
        compiled = 'compiled (' + ', '.join(backends) + ')'
    return f'{compiled}; triton: {triton_status()}'


def run_dtype(op: str, implementation: str, device_type: str,
              dtype: torch.dtype) -> Optional[torch.dtype]:
    """The dtype ``op``'s ``implementation`` ('compiled' / 'triton') runs in for ``dtype``
    inputs: ``dtype`` itself when it takes it, else its compute dtype if it takes that, else
    None."""
    if implementation == 'triton':
        supported = TRITON_KERNELS[op].dtypes if op in TRITON_KERNELS else ()
    else:
        supported = KERNEL_DTYPES[op].get(device_type, ())
    if dtype in supported:
        return dtype
    return compute_dtype(dtype) if compute_dtype(dtype) in supported else None


def kernel_dtype(op: str, device_type: str, dtype: torch.dtype) -> Optional[torch.dtype]:
    """:func:`run_dtype` of the compiled kernel."""
    return run_dtype(op, 'compiled', device_type, dtype)


def forward_operator(op: str, implementation: str):
    """``torch.ops.mmlinattn.<forward>`` of ``op``'s 'compiled' or 'triton' implementation."""
    name = (TRITON_KERNELS[op].forward if implementation == 'triton' else FORWARD_OPERATORS[op])
    return getattr(torch.ops.mmlinattn, name)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace('torch.', '')


def _compiled_reason(op: str, device_type: str, dtype: torch.dtype) -> Optional[str]:
    if not extension_loaded():
        return _EXTENSION_ERROR
    if device_type not in KERNEL_DTYPES[op]:
        return f'{op} has no compiled kernel for device {device_type!r}'
    if not has_kernel(op, device_type):
        return (f'the extension was built without {device_type.upper()} kernels (rebuild with '
                'FORCE_CUDA=1)')
    if kernel_dtype(op, device_type, dtype) is None:
        names = ', '.join(_dtype_name(d) for d in KERNEL_DTYPES[op][device_type])
        return f'{op} on {device_type} has kernels for {names}, not {_dtype_name(dtype)}'
    return None


def _triton_reason(op: str, device_type: str, dtype: torch.dtype) -> Optional[str]:
    error = _triton_load_error(op)
    if error:
        return error
    if device_type == 'cpu' and not triton_interpreted(op):
        return (f'the Triton kernel of {op} runs on CPU tensors only through triton\'s '
                'interpreter (set TRITON_INTERPRET=1 before triton is imported)')
    if device_type not in ('cpu', 'cuda'):
        return f'{op} has no Triton kernel for device {device_type!r}'
    if run_dtype(op, 'triton', device_type, dtype) is None:
        names = ', '.join(_dtype_name(d) for d in TRITON_KERNELS[op].dtypes)
        return f'the Triton kernel of {op} takes {names}, not {_dtype_name(dtype)}'
    return None


_REASONS = {'compiled': _compiled_reason, 'triton': _triton_reason}


def unavailable(implementation: str, op: str, device_type: str,
                dtype: torch.dtype) -> Optional[str]:
    """Why ``op``'s ``implementation`` ('reference', 'compiled', 'triton') cannot run on inputs
    of ``dtype`` on ``device_type``, or None (the reference always runs)."""
    return None if implementation == 'reference' else _REASONS[implementation](op, device_type,
                                                                                dtype)


@contextlib.contextmanager
def forced(mode: str):
    """``MMLINATTN_OPS=mode`` for the duration (eager use: a compiled graph keeps its choice)."""
    saved = os.environ.get('MMLINATTN_OPS')
    os.environ['MMLINATTN_OPS'] = mode
    try:
        yield
    finally:
        if saved is None:
            del os.environ['MMLINATTN_OPS']
        else:
            os.environ['MMLINATTN_OPS'] = saved


def auto_order(op: str, device_type: str) -> Tuple[str, ...]:
    """The implementations ``auto`` tries, in order (the reference always runs). An op whose
    :data:`CUDA_DEFAULT` is the reference runs it on CUDA by design, without a warning."""
    if device_type == 'cuda':
        first = CUDA_DEFAULT[op]
        if first == 'reference':
            return ('reference', )
        return (first, 'compiled' if first == 'triton' else 'triton', 'reference')
    return ('compiled', 'reference')


def has_implementation(op: str, implementation: str, device_type: str) -> bool:
    """Whether ``op`` has an ``implementation`` ('compiled' / 'triton') for the device type at
    all, installed or not: not on CUDA where its :data:`CUDA_DEFAULT` is the reference, and no
    Triton one outside :data:`TRITON_KERNELS`."""
    if device_type == 'cuda' and CUDA_DEFAULT[op] == 'reference':
        return False
    return op in TRITON_KERNELS if implementation == 'triton' else True


@torch.compiler.assume_constant_result
def choose(op: str, device_type: str, dtype: torch.dtype) -> str:
    """``'compiled'``, ``'triton'`` or ``'reference'`` for ``op`` on inputs of ``dtype`` on
    ``device_type``.

    Decided from the mode, the installed kernels and their declarations only, so the result is a
    constant of a compiled graph. A fallback in ``auto`` mode warns once per reason.
    """
    mode = ops_mode()
    if mode == 'reference':
        return 'reference'
    if mode != 'auto' and has_implementation(op, mode, device_type):
        reason = _REASONS[mode](op, device_type, dtype)
        if reason:
            raise RuntimeError(f'MMLINATTN_OPS={mode} but {reason}')
        return mode
    reasons = []
    for implementation in auto_order(op, device_type):
        reason = unavailable(implementation, op, device_type, dtype)
        if reason is None:
            break
        reasons.append(reason)
    message = '; '.join(reasons)
    if reasons and message not in _warned:
        _warned.add(message)
        warnings.warn(f'mmlinattn: {message}; {op} runs its {IMPLEMENTATION_NAMES[implementation]}'
                      '. Said once per process.', FallbackWarning, stacklevel=4)
    return implementation


def choose_for_size(op: str, device_type: str, dtype: torch.dtype, size: int) -> str:
    """:func:`choose`, then the next implementation of ``auto``'s order where the Triton kernel's
    :attr:`TritonKernel.max_size` is below ``size`` (a shape, so no tensor value is read); in
    ``triton`` mode that is an error."""
    implementation = choose(op, device_type, dtype)
    kernel = TRITON_KERNELS.get(op)
    if implementation != 'triton' or kernel is None or kernel.takes_size(size):
        return implementation
    reason = f'the Triton kernel of {op} takes sizes up to {kernel.max_size}, got {size}'
    if ops_mode() == 'triton':
        raise RuntimeError(f'MMLINATTN_OPS=triton but {reason}')
    for fallback in auto_order(op, device_type):
        if fallback != 'triton' and unavailable(fallback, op, device_type, dtype) is None:
            break
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f'mmlinattn: {reason}; it runs its {IMPLEMENTATION_NAMES[fallback]}. Said '
                      'once per process.', FallbackWarning, stacklevel=3)
    return fallback


# Last: loading registers every op's compiled.py, whose package imports the names above.
_EXTENSION_ERROR = _load_extension()
