"""Data preparation tools (``download_dataset.py``), as in mmdet's ``tools/misc``."""
