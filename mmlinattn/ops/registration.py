"""How an op's operators are registered with ``torch.library``, one helper for every op.

An op has a forward and a backward operator with fixed schemas (:class:`OperatorPair`). The C++
extension (``ops/csrc``) defines its pair and their CPU / CUDA kernels; a Triton implementation
defines a pair of the same schemas with ``torch.library.triton_op``. Both get the op's fake
(meta) kernels and one autograd formula, written once per op in ``<op>/compiled.py`` and
parametrised by the backward operator it calls. So ``torch.compile(fullgraph=True)``,
``torch.export`` and ``torch.library.opcheck`` see ordinary operators.

The backward operators have no autograd formula: double backward is not supported.
"""
from dataclasses import dataclass
from typing import Callable, Sequence, Tuple

import torch

LIBRARY = 'mmlinattn'

# backward operator (a callable with the backward schema) -> (backward, setup_context) for
# torch.library.register_autograd.
AutogradFactory = Callable[[Callable], Tuple[Callable, Callable]]


@dataclass(frozen=True)
class OperatorPair:
    """An op's forward and backward operators: schemas, fake kernels and autograd formula."""
    forward_schema: str  # '(Tensor q, ...) -> Tensor', without the operator name
    backward_schema: str
    fake_forward: Callable
    fake_backward: Callable
    autograd: AutogradFactory


def qualified_name(name: str) -> str:
    return f'{LIBRARY}::{name}'


def missing_operators(names: Sequence[str]) -> list:
    """The operators among ``names`` that ``torch.ops.mmlinattn`` lacks (e.g. an extension built
    from other sources)."""
    return [name for name in names if not hasattr(getattr(torch.ops, LIBRARY), name)]


def register_defined(pair: OperatorPair, forward: str, backward: str) -> None:
    """Fake kernels and autograd for operators already defined elsewhere (the C++ extension)."""
    torch.library.register_fake(qualified_name(forward), pair.fake_forward)
    torch.library.register_fake(qualified_name(backward), pair.fake_backward)
    backward_op = getattr(getattr(torch.ops, LIBRARY), backward)
    formula, setup = pair.autograd(backward_op)
    torch.library.register_autograd(qualified_name(forward), formula, setup_context=setup)


def define_triton(pair: OperatorPair, forward: str, forward_impl: Callable, backward: str,
                  backward_impl: Callable) -> Tuple[Callable, Callable]:
    """Define ``mmlinattn::<forward>`` / ``<backward>`` with ``torch.library.triton_op`` from
    functions that launch their kernels through ``torch.library.wrap_triton``, with the pair's
    schemas, fake kernels and autograd. Returns the two operators."""
    ops = []
    for name, impl, schema, fake in ((forward, forward_impl, pair.forward_schema,
                                      pair.fake_forward),
                                     (backward, backward_impl, pair.backward_schema,
                                      pair.fake_backward)):
        op = torch.library.triton_op(qualified_name(name), impl, mutates_args=(), schema=schema)
        op.register_fake(fake)  # the shared fake kernel, also under the interpreter
        ops.append(op)
    formula, setup = pair.autograd(ops[1])
    ops[0].register_autograd(formula, setup_context=setup)
    return ops[0], ops[1]
