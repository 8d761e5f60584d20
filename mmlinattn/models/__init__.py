from . import backbones  # noqa: F401
