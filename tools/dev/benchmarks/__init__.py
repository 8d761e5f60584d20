"""Op benchmark modules of tools/benchmark.py; the module contract is in common.py."""
