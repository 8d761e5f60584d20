"""Bottom/right padding of a spatial size up to a multiple (patches, windows, landmark pooling)."""
from typing import Sequence

import torch
import torch.nn.functional as F


def pad_to_multiple(size: int, multiple: int) -> int:
    """The padding ``ceil(size / multiple) * multiple - size`` (0 for multiples).

    Floor division of non-negative numbers only: with symbolic sizes a ``%`` becomes a ``Mod`` that
    inductor cannot bound or simplify cheaply, and the dynamo ONNX export rounds a negative
    division toward zero.
    """
    return (size + multiple - 1) // multiple * multiple - size


def pad_if_needed(x: torch.Tensor, padding: Sequence[int]) -> torch.Tensor:
    """``F.pad(x, padding)`` (zeros), or ``x`` itself when every pad is a plain 0.

    ``F.pad`` copies the whole tensor even with nothing to pad, and most input sizes are multiples
    already. Only Python ints count: a traced or dynamically exported graph's pads are expressions
    of the input size (tracer tensors, SymInts), so it keeps the pad for every size.
    """
    if all(type(pad) is int and pad == 0 for pad in padding):
        return x
    return F.pad(x, padding)
