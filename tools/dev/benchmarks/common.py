"""Shared helpers of the benchmarks in ``tools/benchmark.py``: timing, peak memory, tables, JSON.

Module contract for an op benchmark (``tools/dev/benchmarks/ops_<name>.py``, registered by one line in
``OP_BENCHMARKS`` of ``tools/benchmark.py``); the module exposes two functions:

- ``cases(device: str) -> List[Case]``: everything to measure. ``Case.build()`` creates the inputs
  and returns the zero-argument callable that is timed (call it repeatedly: it must not
  accumulate state). Names are unique within the module; the peak-memory child process finds a
  case again by its name, so ``cases`` must be deterministic and cheap (build inputs in ``build``).
- ``summarise(results: Dict[str, Measurement], device: str) -> Section``: the table of the module
  (ratios, throughput) from the measured cases.

:func:`run_module` measures every case and calls ``summarise``.

Time: median wall time of ``repeats`` calls after one warm-up call (CUDA: synchronised before and
after each call, so it is the wall time of the GPU work).

Peak memory, above what the inputs already hold:
- CUDA: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus the memory
  allocated before the call.
- CPU: torch keeps no CPU allocator statistics, so the resident set size is measured instead, in a
  fresh Python process per case (so freed-but-retained heap of other cases cannot hide an
  allocation): build the inputs, run the op once on a tiny copy to start the thread pool, reset
  the kernel's high-water mark (``/proc/self/clear_refs`` with ``5``, Linux >= 4.0), read VmRSS,
  run the case once, read VmHWM. Peak = VmHWM - VmRSS. Large buffers come from mmap and are
  returned at free, so this is the memory the call touched at its peak (output included). Where
  the reset is refused, the value is VmHWM - VmRSS with the earlier high-water mark still in
  place, a lower bound, and the section notes say so.
"""
import dataclasses
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[], Callable[[], Any]]
    warm_up: Optional[Callable[[], Callable[[], Any]]] = None  # tiny version, for the memory child


@dataclasses.dataclass
class Measurement:
    time_ms: float
    peak_mb: Optional[float]
    peak_exact: bool = True


@dataclasses.dataclass
class Section:
    title: str
    columns: List[str]
    rows: List[Dict[str, Any]]
    notes: List[str] = dataclasses.field(default_factory=list)


def _sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], device: str, repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls after one warm-up."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def cuda_peak_mb(fn: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _proc_status_kb(key: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1])
    raise RuntimeError(f'{key} not in /proc/self/status')


def _reset_high_water_mark() -> bool:
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def cpu_peak_in_child(case: Case) -> Dict[str, Any]:
    """Runs inside the child process: see the module docstring."""
    fn = case.build()
    if case.warm_up is not None:
        case.warm_up()()
    exact = _reset_high_water_mark()
    rss = _proc_status_kb('VmRSS')
    fn()
    peak = _proc_status_kb('VmHWM')
    return {'peak_mb': max(peak - rss, 0) / 1024, 'exact': exact}


def cpu_peak_mb(module_name: str, case_name: str) -> Dict[str, Any]:
    """Peak RSS increase of one case, measured in a fresh process."""
    cmd = [sys.executable, os.path.abspath(__file__), '--peak-memory', module_name, case_name]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO_ROOT, os.path.join(REPO_ROOT, 'tools'), os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f'peak-memory child for {module_name}:{case_name} failed:\n'
                           f'{proc.stderr[-2000:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_module(module_name: str, device: str, repeats: int, log=print) -> Section:
    """Measure every case of an op-benchmark module and return its summary section."""
    module = importlib.import_module(module_name)
    results: Dict[str, Measurement] = {}
    for case in module.cases(device):
        fn = case.build()
        time_ms = time_call(fn, device, repeats)
        if device.startswith('cuda'):
            peak, exact = cuda_peak_mb(fn), True
        else:
            del fn  # the child rebuilds the inputs; free ours first
            child = cpu_peak_mb(module_name, case.name)
            peak, exact = child['peak_mb'], child['exact']
        results[case.name] = Measurement(time_ms, peak, exact)
        log(f'  {case.name}: {time_ms:.2f} ms, peak {peak:.1f} MiB')
    section = module.summarise(results, device)
    if not all(r.peak_exact for r in results.values()):
        section.notes.append('CPU peak memory is a lower bound here: the kernel refused to '
                             'reset the high-water mark (/proc/self/clear_refs).')
    return section


def format_value(value: Any) -> str:
    if value is None:
        return '-'
    if isinstance(value, float):
        if value != value:  # NaN
            return '-'
        return f'{value:.3g}' if abs(value) < 100 else f'{value:.0f}'
    return str(value)


def format_table(section: Section) -> str:
    """A plain-text table (Markdown pipe syntax, readable as is)."""
    cells = [[format_value(row.get(col)) for col in section.columns] for row in section.rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) if cells else len(col)
              for i, col in enumerate(section.columns)]
    line = lambda values: '| ' + ' | '.join(v.ljust(w) for v, w in zip(values, widths)) + ' |'
    out = [f'### {section.title}', '', line(section.columns),
           '|' + '|'.join('-' * (w + 2) for w in widths) + '|']
    out += [line(r) for r in cells]
    out += [''] + [f'- {note}' for note in section.notes]
    return '\n'.join(out)


def environment() -> Dict[str, Any]:
    """What a benchmark's numbers depend on: torch, threads, the CPU (its model and whether it has
    bf16 instructions: without them bf16 is emulated) and the GPU, the extension's state."""
    from mmlinattn.cpu_autocast import BF16_CPU_FLAGS, cpu_flags, cpu_model
    flags = cpu_flags()
    info = {'torch': torch.__version__, 'threads': torch.get_num_threads(), 'cpu': cpu_model(),
            'cpu_bf16_flags': None if flags is None else sorted(flags.intersection(BF16_CPU_FLAGS))}
    if torch.cuda.is_available():
        info['gpu'] = torch.cuda.get_device_name()
    try:
        from mmlinattn.ops import extension_status
        info['extension'] = extension_status()
    except ImportError as err:
        info['extension'] = f'mmlinattn not importable: {err}'
    return info


def write_json(path: str, sections: List[Section], meta: Dict[str, Any]) -> None:
    payload = dict(meta, sections=[dataclasses.asdict(s) for s in sections])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(payload, f, indent=2)


def publish(sections: List[Section], out: Optional[str], meta: Dict[str, Any]) -> None:
    """Print each section as a table; with ``out``, also write them and ``meta`` as JSON there."""
    for section in sections:
        print()
        print(format_table(section))
    if out:
        write_json(out, sections, meta)
        print(f'\nJSON written to {out}')


def _child_main(argv: List[str]) -> None:
    module_name, case_name = argv
    module = importlib.import_module(module_name)
    matches = [c for c in module.cases('cpu') if c.name == case_name]
    if len(matches) != 1:
        raise SystemExit(f'{module_name} has no case named {case_name!r}')
    print(json.dumps(cpu_peak_in_child(matches[0])))


if __name__ == '__main__':
    if len(sys.argv) == 4 and sys.argv[1] == '--peak-memory':
        _child_main(sys.argv[2:])
    else:
        raise SystemExit('internal entry point: common.py --peak-memory <module> <case>')
