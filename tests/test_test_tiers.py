"""How tools/dev/run_tests.sh spreads the slow tier: ``--dist loadgroup`` keeps every test of one
``xdist_group`` on one pytest-xdist worker, so that a module fixture they share (the demo run, a
config walk) starts once. Not every pytest/pytest-xdist pair does: under pytest 9.2, xdist 3.8's
groups are silently ignored (pytest-xdist#1386) and each worker repeats the fixture."""
import json
import os
import sys

from e2e_utils import run_checked

GROUPED_TESTS = '''
import json, os, time
import pytest

pytestmark = pytest.mark.xdist_group('shared')


@pytest.mark.parametrize('index', range(4))
def test_grouped(index):
    time.sleep(0.3)  # long enough that an idle worker would take the next test
    with open(f'grouped_{index}.json', 'w') as f:
        json.dump(os.environ['PYTEST_XDIST_WORKER'], f)


@pytest.mark.parametrize('index', range(4))
def test_alone(index):
    time.sleep(0.3)
'''


def test_slow_tier_keeps_a_group_on_one_worker(tmp_path):
    (tmp_path / 'test_grouped.py').write_text(GROUPED_TESTS)
    (tmp_path / 'pytest.ini').write_text('[pytest]\nmarkers =\n    xdist_group(name): one worker\n')
    run_checked([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-n', '2', '--dist',
                 'loadgroup'], cwd=tmp_path, env=dict(os.environ), timeout=300)
    workers = {json.loads((tmp_path / f'grouped_{i}.json').read_text()) for i in range(4)}
    assert len(workers) == 1, f'one xdist_group ran on {sorted(workers)}'
