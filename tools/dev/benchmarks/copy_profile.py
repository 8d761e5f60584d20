"""Share of ``aten::copy_`` in one LaplacianFormer-T forward (batch 1, eval, no_grad), CPU.

    python tools/dev/benchmarks/copy_profile.py [--size 1024] [--label NAME] >> profile.jsonl

torch.profiler's self CPU time per op over one forward after a warm-up call; prints one JSON line
(total self time, aten::copy_ time, share and calls, the ten largest ops). ``max_landmark_grid=7``.
"""
import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile

from mmlinattn.models.backbones import LaplacianFormer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--size', type=int, default=1024, help='image side (default: 1024)')
    parser.add_argument('--label', default='', help='a name for this run in the JSON line')
    args = parser.parse_args()
    torch.manual_seed(0)
    model = LaplacianFormer(arch='tiny').eval()
    image = torch.randn(1, 3, args.size, args.size)
    with torch.no_grad():
        model(image)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(image)
    rows = sorted(((e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()),
                  key=lambda row: -row[1])
    total = sum(t for _, t, _ in rows)
    copy = [(t, c) for k, t, c in rows if k == 'aten::copy_']
    copy_us, copy_calls = (copy[0] if copy else (0.0, 0))
    print(json.dumps({'label': args.label, 'size': args.size, 'threads': torch.get_num_threads(),
                      'total_self_ms': total / 1e3, 'copy_ms': copy_us / 1e3,
                      'copy_share': copy_us / total, 'copy_calls': copy_calls,
                      'top': [(k, round(t / 1e3, 1), c) for k, t, c in rows[:10]]}))


if __name__ == '__main__':
    main()
