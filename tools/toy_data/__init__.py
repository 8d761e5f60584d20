"""The bundled synthetic data sets of the tools and tests: generation (``scenes``) and the
``--toy-data`` config overlay (``overlay``). Tool code, not part of the installed plugin."""
from .overlay import toy_overlay_path, use_toy_data
from .scenes import TOY_DATA_ROOT, TOY_DEFAULT_COUNTS, TOY_SETS, make_all

__all__ = ['TOY_DATA_ROOT', 'TOY_DEFAULT_COUNTS', 'TOY_SETS', 'make_all', 'toy_overlay_path',
           'use_toy_data']
