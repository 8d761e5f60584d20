"""Bottom/right padding of a spatial size up to a multiple (patches, windows, landmark pooling)."""


def pad_to_multiple(size: int, multiple: int) -> int:
    """The padding ``ceil(size / multiple) * multiple - size`` (0 for multiples).

    Written with floor division rather than ``(-size) % multiple``: with symbolic sizes the modulo
    becomes a ``PythonMod`` that inductor (torch 2.14) cannot bound when it lowers the pad, so
    ``torch.compile(dynamic=True)`` of Pola-PVT failed on it; floor division it handles.
    """
    return -(-size // multiple) * multiple - size
