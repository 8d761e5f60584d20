"""Bitwise equality of a computation at several torch thread counts, checked in a child process:
changing torch's thread count in-process breaks torch.linalg.inv (MKL's batched LU errors or
hangs) for every later test in that process."""
import os
import subprocess
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def assert_equal_at_thread_counts(module: str, case: str, counts=(1, 2, 3)) -> None:
    """``<module>.<case>()`` (a test module's function returning a tuple of tensors) gives
    bitwise equal tensors at each of ``counts`` torch threads, with the compiled ops forced."""
    script = f'''
import sys, torch
sys.path.insert(0, {TESTS_DIR!r})
import {module} as tests
results = []
for count in {tuple(counts)!r}:
    torch.set_num_threads(count)
    results.append(tests.{case}())
for count, other in zip({tuple(counts)[1:]!r}, results[1:]):
    for index, (a, b) in enumerate(zip(results[0], other)):
        assert torch.equal(a, b), f'output {{index}} differs between {counts[0]} and {{count}} threads'
'''
    env = dict(os.environ, MMLINATTN_OPS='compiled')
    subprocess.run([sys.executable, '-c', script], check=True, env=env, cwd=os.path.dirname(TESTS_DIR))
