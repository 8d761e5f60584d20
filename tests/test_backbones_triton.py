"""The three backbone families with every op on its Triton kernel (``MMLINATTN_OPS=triton``, run
by Triton's interpreter on CPU tensors) against the same model on the references: the outputs and
every parameter gradient.

The kernels are interpreted only if ``TRITON_INTERPRET=1`` is set before they are defined, so the
comparison runs in a fresh interpreter with that variable; this process is never put in
interpreter mode. Both fp32 runs are measured against the fp64 reference run, with the yardstick
of the compile tests: the Triton run within 4x the fp32 reference run's error, or 1e-5 relative
(some gradients of these small random models are ill-conditioned in fp32 whatever computes them).
"""
import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import json, os, sys
import torch
from mmlinattn.models.backbones import LaplacianFormer, PolaPVT, PolaSwin

family, height, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
small = dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4], depths=[1, 1, 1, 1])
build = {
    'LaplacianFormer': lambda: LaplacianFormer(arch=small, drop_path_rate=0.0),
    'PolaPVT': lambda: PolaPVT(arch=small, drop_path_rate=0.0),
    'PolaSwin': lambda: PolaSwin(arch=dict(embed_dims=32, depths=[1, 1, 2, 1],
                                           num_heads=[1, 2, 4, 8]), drop_path_rate=0.0),
}[family]
torch.manual_seed(0)
model = build().eval()
image = torch.randn(2, 3, height, width)


def run(mode, dtype):
    os.environ['MMLINATTN_OPS'] = mode
    net = model.to(dtype)
    net.zero_grad()
    outs = net(image.to(dtype))
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(dtype) for o in outs]
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    tensors = {f'output {i}': o.detach().double() for i, o in enumerate(outs)}
    tensors.update({n: p.grad.double() for n, p in net.named_parameters() if p.grad is not None})
    return tensors


exact = run('reference', torch.float64)
fp32 = run('reference', torch.float32)
triton = run('triton', torch.float32)


def error(actual, expected):
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


print(json.dumps({name: [error(triton[name], exact[name]), error(fp32[name], exact[name])]
                  for name in exact if name in triton and name in fp32}
                 | {'missing': sorted(set(exact) ^ set(triton))}))
'''


@pytest.mark.slow
@pytest.mark.parametrize('family,size', [('LaplacianFormer', (64, 96)), ('PolaPVT', (64, 96)),
                                         ('PolaSwin', (112, 144))])
def test_backbone_on_triton_kernels_equals_reference(family, size):
    env = dict(os.environ, TRITON_INTERPRET='1')
    env.pop('MMLINATTN_OPS', None)
    proc = subprocess.run([sys.executable, '-c', SCRIPT, family, *map(str, size)], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert errors.pop('missing') == []
    assert len(errors) > 10  # the outputs and the parameters' gradients
    worse = {name: (triton, fp32) for name, (triton, fp32) in errors.items()
             if triton > max(4 * fp32, 1e-5)}
    assert not worse, f'Triton vs fp64 worse than the fp32 reference: {worse}'
