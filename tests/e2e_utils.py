"""Helpers for the end-to-end tests: run the tools in a subprocess from the repo root, as a user would."""
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY_ROOT = os.path.join(ROOT, 'data', 'toy')


def run(args, timeout=1200, expect_ok=True, env=None):
    """Run ``python *args`` in the repo root; return the completed process (stdout+stderr in .output)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '2'))
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=full_env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.output = proc.stdout
    if expect_ok and proc.returncode != 0:
        pytest.fail(f'{" ".join(map(str, args))} exited with {proc.returncode}:\n{proc.output[-6000:]}')
    return proc


def require_toy_data(*sets):
    """Generate the toy sets if absent (the test command does this before pytest)."""
    missing = [s for s in sets if not os.path.isdir(os.path.join(TOY_ROOT, s))]
    if missing:
        run(['tools/make_toy_data.py', '--out', TOY_ROOT, '--what', *missing])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def dump_toy_config(config: str, out_path) -> str:
    """Write ``config`` pointed at the toy data as a standalone file, for the libraries' stock scripts."""
    from mmengine.config import Config
    from toy_data import use_toy_data
    cfg = Config.fromfile(os.path.join(ROOT, config))
    use_toy_data(cfg, os.path.join(ROOT, 'configs'))
    cfg.dump(str(out_path))
    return str(out_path)
