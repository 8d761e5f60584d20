"""The bundled synthetic data sets of the tools and tests (``tools/dev/make_toy_data.py``), one module
per set (``coco``, ``ade``, ``imagenet``) and what they share (``common``); ``sets.make_all`` writes
them. Tool code, not part of the installed plugin; the ``--toy-data`` config overlay is
``tools/_toy_overlay.py``."""
from .sets import TOY_DATA_ROOT, TOY_SETS, make_all, read_stamp
from .common import TOY_DEFAULT_COUNTS

__all__ = ['TOY_DATA_ROOT', 'TOY_DEFAULT_COUNTS', 'TOY_SETS', 'make_all', 'read_stamp']
