"""tools/dev/gpu_check.sh --bundle-deps: the packages a bare CUDA image lacks, importable from the bundle
alone (mmcv's Python code without its compiled ops)."""
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED = ('mmengine', 'mmcv', 'addict', 'yapf', 'yapf_third_party', 'termcolor')


def test_bundle_deps_is_importable_without_compiled_files(tmp_path):
    bundle = tmp_path / 'deps'
    env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_DEPS=str(bundle))
    proc = subprocess.run(['bash', 'tools/dev/gpu_check.sh', '--bundle-deps'], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(bundle)) == sorted(BUNDLED)
    compiled = [os.path.join(d, f) for d, _, files in os.walk(bundle) for f in files
                if f.endswith(('.so', '.pyc'))]
    assert compiled == []
    # the bundle first on the path: every package and what the backbones import load from it
    probe = ('import mmcv, mmengine, addict, yapf, termcolor\n'
             'from mmcv.cnn import ConvModule, build_norm_layer\n'
             'from mmcv.cnn.bricks import DropPath\n'
             'from mmengine.model import BaseModule\n'
             'import sys\n'
             'mods = (mmcv, mmengine, addict, yapf, termcolor)\n'
             'print(all(m.__file__.startswith(sys.argv[1]) for m in mods))\n'
             "print('mmcv._ext' in sys.modules)")
    run = subprocess.run([sys.executable, '-c', probe, str(bundle)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(bundle)), timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ['True', 'False']


def test_steps_run_the_selftest_first_and_print_what_decides_the_defaults():
    """The order of gpu_check.sh's steps (the self-test before the tests and benchmarks, the
    inductor compiles last) and the summary lines that decide each op's CUDA default."""
    with open(os.path.join(REPO_ROOT, 'tools', 'gpu_check.sh')) as f:
        script = f.read()
    steps = [line.split('== ')[1] for line in script.splitlines()
             if line.lstrip().startswith('echo "== ')]
    names = [step.split(' (')[0].split(' ==')[0] for step in steps]
    assert names[:6] == ['building mmlinattn._ext with CUDA', 'self-test', 'op tests',
                         'op benchmark', 'backbone benchmark', 'compile / export tests'], names
    assert '-m mmlinattn.ops.selftest "${selftest_args[@]}"' in script
    assert "--sizes '224^2' '512^2' '1024^2'" in script and 'for precision in fp32 amp' in script
    assert "grep -o 'decides: .*'" in script
