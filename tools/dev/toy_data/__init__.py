"""The bundled synthetic data sets of the tools and tests (``tools/dev/make_toy_data.py``). Tool code,
not part of the installed plugin; the ``--toy-data`` config overlay is ``tools/_toy_overlay.py``."""
from .scenes import TOY_DATA_ROOT, TOY_DEFAULT_COUNTS, TOY_SETS, make_all

__all__ = ['TOY_DATA_ROOT', 'TOY_DEFAULT_COUNTS', 'TOY_SETS', 'make_all']
