"""The developers' and CI's scripts and the benchmark cases: run from a checkout, not shipped with the
package (``setup.py``'s ``MIM_TOOLS`` lists what is). A package so that ``tools/benchmark.py`` and the
tests import ``dev.benchmarks`` with ``tools/`` on ``sys.path``."""
