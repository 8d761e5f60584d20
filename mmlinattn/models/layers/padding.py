"""Bottom/right padding of a spatial size up to a multiple (patches, windows, landmark pooling)."""


def pad_to_multiple(size: int, multiple: int) -> int:
    """The padding ``ceil(size / multiple) * multiple - size`` (0 for multiples).

    Written with floor division of non-negative numbers: with symbolic sizes ``(-size) % multiple``
    becomes a ``PythonMod`` that inductor (torch 2.14) cannot bound when it lowers the pad (so
    ``torch.compile(dynamic=True)`` of Pola-PVT failed), ``size % 2`` nests a ``Mod`` in every later
    size (Pola-Swin's patch merging: inductor's C++ backend then spent minutes in sympy on its
    strides), and ``-(-size // multiple)`` is a division of a negative number, which the dynamo ONNX
    export rounds toward zero instead of down.
    """
    return (size + multiple - 1) // multiple * multiple - size
