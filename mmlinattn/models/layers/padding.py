"""Bottom/right padding of a spatial size up to a multiple (patches, windows, landmark pooling)."""


def pad_to_multiple(size: int, multiple: int) -> int:
    """The padding ``ceil(size / multiple) * multiple - size`` (0 for multiples).

    Floor division of non-negative numbers only: with symbolic sizes a ``%`` becomes a ``Mod`` that
    inductor cannot bound or simplify cheaply, and the dynamo ONNX export rounds a negative
    division toward zero.
    """
    return (size + multiple - 1) // multiple * multiple - size
