"""Analysis and deployment tools: attention rows and statistics (tools/analysis), the attention
visualisation, ONNX export checked in onnxruntime, and the benchmark plot. Tiny inputs, random
weights; the visualisation and export runs are in the slow tier."""
import importlib.util
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from e2e_utils import ROOT, require_toy_data, run

from analysis import (attention_streams, laplacian_inputs, layer_statistics, negative_mass,
                      one_block_per_stage, polarity_attention_rows, polarity_inputs, record_attentions,
                      row_entropy, softmax_rows, token_index)
from analysis.model_loading import build_backbone, load_config, load_image, normalisation
from mmlinattn.models.layers import LaplacianAttention, PolarityAttention, resize_pos_embed
from mmlinattn.ops.laplacian_kernel.reference import l1_distance_exportable, laplacian_kernel_reference

LAPLACIAN_CONFIG = 'configs/mask_rcnn_laplacian_tiny_1x_coco.py'
POLA_CONFIG = 'configs/mask_rcnn_pola_pvt_tiny_1x_coco.py'
POINTS = ['0.5,0.5', '0.2,0.8']


def _load_tool(name):
    path = os.path.join(ROOT, 'tools', f'{name}.py')
    spec = importlib.util.spec_from_file_location(f'tool_{name}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _backbone(config, seed=0):
    cfg = load_config(os.path.join(ROOT, config))
    torch.manual_seed(seed)
    return cfg, build_backbone(cfg)


# ---------------------------------------------------------------- export-friendly L1 distance


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('channels,per_step', [(8, 8), (13, 8), (20, 8), (5, 1), (3, 8)])
def test_exportable_l1_distance_equals_cdist_forward_and_backward(dtype, channels, per_step):
    """One step, several steps with a partial last one, one channel per step, fewer channels than
    a step."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 17, channels, generator=gen, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 3, 5, channels, generator=gen, dtype=dtype, requires_grad=True)
    k.data[0, 0, 0] = q.data[0, 0, 0]  # a tie: sign(0) = 0 in both gradients
    grad = torch.randn(2, 3, 17, 5, generator=gen, dtype=dtype)
    ours = l1_distance_exportable(q, k, channels_per_step=per_step)
    ref = torch.cdist(q, k, p=1)
    tol = dict(rtol=1e-6, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours, ref, **tol)
    dq, dk = torch.autograd.grad(ours, (q, k), grad)
    dq_ref, dk_ref = torch.autograd.grad(ref, (q, k), grad)
    torch.testing.assert_close(dq, dq_ref, **tol)
    torch.testing.assert_close(dk, dk_ref, **tol)


def test_laplacian_kernel_reference_uses_the_exportable_form_while_exporting(monkeypatch):
    q, k = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 3, 4)
    normal = laplacian_kernel_reference(q, k, 4.0)
    calls = []
    from mmlinattn.ops.laplacian_kernel import reference  # the package name is shadowed by the op
    original = reference.l1_distance_exportable
    monkeypatch.setattr(reference, 'l1_distance_exportable',
                        lambda a, b: calls.append(1) or original(a, b))
    monkeypatch.setattr(torch.compiler, 'is_exporting', lambda: True)
    exporting = laplacian_kernel_reference(q, k, 4.0)
    assert calls, 'the exporting branch was not taken'
    torch.testing.assert_close(exporting, normal, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- attention rows


@pytest.mark.parametrize(
    'config', [LAPLACIAN_CONFIG, POLA_CONFIG, 'configs/mask_rcnn_pola_swin_tiny_1x_coco.py'])
def test_attention_rows_reproduce_every_layer_output(config):
    """``A v`` rebuilt into the layer's output equals the recorded output (fp64), for every layer:
    the rows are the weights the layer really applies."""
    _, backbone = _backbone(config)
    backbone.double()
    records = record_attentions(backbone, torch.randn(1, 3, 72, 88, dtype=torch.float64))
    kinds = {type(r.module) for r in records}
    assert kinds == {LaplacianAttention} or kinds == {PolarityAttention}
    assert len({r.stage for r in records}) == (2 if 'swin' in config else 4)
    for record in records:
        module, x, (height, width) = record.module, record.x, record.hw_shape
        batch, tokens, channels = x.shape
        if isinstance(module, LaplacianAttention):
            q, landmarks, v = laplacian_inputs(module, x, record.hw_shape)
            rows = module.attention_rows(q, landmarks)
            assert rows.shape == (batch, module.num_heads, tokens, tokens)
            y = (rows @ v).transpose(1, 2).reshape(batch, tokens, channels)
            v_image = module.v(x).transpose(1, 2).reshape(batch, channels, height, width)
            out = module.proj(y + module.local_conv(v_image).flatten(2).transpose(1, 2))
        else:
            q, k, v, power, _ = polarity_inputs(module, x, record.hw_shape)
            same, opposite = polarity_attention_rows(q, k, power, module.eps)
            v1, v2 = v.chunk(2, dim=-1)
            y = torch.cat([same @ v1, opposite @ v2], dim=-1).transpose(1, 2).reshape(x.shape)
            gate = module.attention_inputs(x, record.hw_shape)[3]
            out = module.proj((y + module._local_branch(v, record.hw_shape)) * gate)
        torch.testing.assert_close(out, record.output, rtol=1e-7, atol=1e-9, msg=record.name)


def test_polarity_rows_are_normalised_and_non_negative():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 10, 4, generator=gen), torch.randn(2, 3, 6, 4, generator=gen)
    power = 1 + 4 * torch.rand(1, 3, 1, 4, generator=gen)
    for rows in polarity_attention_rows(q, k, power, eps=0.0):
        assert rows.shape == (2, 3, 10, 6) and (rows >= 0).all()
        torch.testing.assert_close(rows.sum(-1), torch.ones(2, 3, 10))


def test_entropy_and_negative_mass_formulas():
    rows = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.6, 0.6, -0.2, 0.0]])
    torch.testing.assert_close(row_entropy(rows), torch.tensor([math.log(4), 0.0, math.log(2)]))
    torch.testing.assert_close(negative_mass(rows), torch.tensor([0.0, 0.0, 0.2 / 1.4]))
    softmax = softmax_rows(torch.zeros(1, 1, 2, 3), torch.randn(1, 1, 5, 3), scale=1.0)
    torch.testing.assert_close(row_entropy(softmax), torch.full((1, 1, 2), math.log(5)))


def test_token_index_maps_image_fractions_to_row_major_tokens():
    assert token_index((0.0, 0.0), (4, 6)) == 0
    assert token_index((1.0, 1.0), (4, 6)) == 23
    assert token_index((0.5, 0.25), (4, 6)) == 1 * 6 + 3
    with pytest.raises(ValueError, match='fractions'):
        token_index((1.5, 0.0), (4, 6))


# ---------------------------------------------------------------- visualisation tool


def _assert_readable_png(path, min_colours):
    """What a reader of the figure relies on: the file exists, is a PNG that decodes, and draws
    something (more than ``min_colours`` colours, no single colour covering nearly all of it)."""
    from PIL import Image
    assert os.path.isfile(path), path
    with Image.open(path) as image:
        assert image.format == 'PNG', path
        pixels = np.asarray(image.convert('RGB'))
    colours, counts = np.unique(pixels.reshape(-1, 3), axis=0, return_counts=True)
    assert len(colours) > min_colours, f'{path}: {len(colours)} colours'
    assert counts.max() < 0.98 * counts.sum(), f'{path} is nearly blank'


def _run_visualisation(config, out_dir):
    require_toy_data('coco')
    proc = run([
        'tools/visualize_attention.py', config, '--out', out_dir, '--shape', '64', '64', '--points',
        *POINTS, '--max-queries', '100000'
    ],
               timeout=600)
    with open(os.path.join(out_dir, 'stats.json')) as f:
        return proc, json.load(f)


def _check_figures(out_dir, stats):
    """One attention figure per drawn stage (the overlays: many colours), the entropy and distance
    figures, nothing else; per layer the key count and the uniform entropy the figures compare to."""
    stages = [layer['stage'] for layer in stats['layers']]
    expected = {f'attention_stage{stage}.png' for stage in stages} | {'entropy.png', 'distances.png'}
    assert {name for name in os.listdir(out_dir) if name.endswith('.png')} == expected
    for stage in stages:
        _assert_readable_png(os.path.join(out_dir, f'attention_stage{stage}.png'), min_colours=200)
    for name in ('entropy.png', 'distances.png'):
        _assert_readable_png(os.path.join(out_dir, name), min_colours=20)
    for layer in stats['layers']:
        height, width = layer['hw_shape']
        assert layer['num_keys'] == height * width  # global attention over every token (sr 1)
        assert layer['uniform_entropy_nats'] == pytest.approx(math.log(layer['num_keys']))


def _layer_inputs(backbone, layer_names, image):
    """name -> (module, its input x in fp64, hw_shape), from one forward pass with our own hooks."""
    modules = dict(backbone.named_modules())
    captured, handles = {}, []
    for name in layer_names:
        handles.append(
            modules[name].register_forward_pre_hook(lambda m, args, name=name: captured.update(
                {name: (m, args[0].double(), tuple(args[1]))})))
    with torch.no_grad():
        backbone(image)
    for handle in handles:
        handle.remove()
    return captured


def _dense_entropy(weights):
    """weights [h, N, n] -> mean over rows of -sum p ln p, p = clamp(w, 0) / sum (per head)."""
    p = weights.detach().clamp(min=0)
    p = p / p.sum(-1, keepdim=True)
    return (-(p * torch.log(torch.where(p > 0, p, torch.ones_like(p)))).sum(-1)).mean(-1)


def _image_like_the_tool(cfg, stats):
    return load_image(stats['image'], tuple(stats['shape']), *normalisation(cfg))[1]


@pytest.mark.slow
def test_visualisation_laplacianformer_figures_and_entropies(tmp_path):
    proc, stats = _run_visualisation(LAPLACIAN_CONFIG, tmp_path)
    assert [layer['stage'] for layer in stats['layers']] == [1, 2, 3, 4]
    _check_figures(tmp_path, stats)
    assert 'stage 4' in proc.output

    # dense by hand, in fp64: K = exp(-L1/lam), W = (K(l, l) + eps I)^-1, A = K(q, l) W K(q, l)^T
    cfg, backbone = _backbone(LAPLACIAN_CONFIG)
    inputs = _layer_inputs(backbone, [layer['layer'] for layer in stats['layers']],
                           _image_like_the_tool(cfg, stats))
    backbone.double()
    for layer in stats['layers']:
        module, x, hw = inputs[layer['layer']]
        d = module.head_dims
        q_raw = F.linear(x, module.q.weight, module.q.bias)[0]  # [N, C]
        q_raw = q_raw.reshape(-1, module.num_heads, d).transpose(0, 1)  # [h, N, d]
        q = q_raw / math.sqrt(d)
        kernel = lambda a, b: torch.exp(-(a[:, :, None] - b[:, None]).abs().sum(-1) / module.lam)
        if module.landmark_ratio > 1:
            with torch.no_grad():
                landmarks = module.landmarks(q[None], hw)[0]
            eye = torch.eye(landmarks.shape[1], dtype=torch.float64)
            inverse = torch.linalg.inv(kernel(landmarks, landmarks) + module.landmark_shift * eye)
            cross = kernel(q, landmarks)
            dense = cross @ inverse @ cross.transpose(1, 2)
        else:
            dense = kernel(q, q)
        dense = dense / dense.sum(-1, keepdim=True)
        softmax = torch.softmax(q_raw @ q_raw.transpose(1, 2) / math.sqrt(d), dim=-1)
        entropies = layer['mean_row_entropy_nats']
        np.testing.assert_allclose(entropies['laplacian'], _dense_entropy(dense), atol=1e-4)
        np.testing.assert_allclose(entropies['softmax'], _dense_entropy(softmax), atol=1e-4)
        assert layer['kernel_scales']['lam'] == module.lam


@pytest.mark.slow
def test_visualisation_polaformer_figures_and_entropies(tmp_path):
    _, stats = _run_visualisation(POLA_CONFIG, tmp_path)
    assert [layer['stage'] for layer in stats['layers']] == [1, 2, 3, 4]
    _check_figures(tmp_path, stats)

    # dense by hand, in fp64: phi features, S/O = phi(q) phi(k)^T normalised as the attention does
    cfg, backbone = _backbone(POLA_CONFIG)
    inputs = _layer_inputs(backbone, [layer['layer'] for layer in stats['layers']],
                           _image_like_the_tool(cfg, stats))
    backbone.double()
    for layer in stats['layers']:
        module, x, hw = inputs[layer['layer']]
        h, d = module.num_heads, module.head_dims
        q, _ = F.linear(x, module.qg.weight, module.qg.bias)[0].chunk(2, dim=-1)
        k, _ = F.linear(x, module.kv.weight, module.kv.bias)[0].chunk(2, dim=-1)
        with torch.no_grad():
            pos = resize_pos_embed(module.positional_encoding, module.pos_grid, hw)[0]
        scale = F.softplus(module.scale[0])
        q, k = q / scale, (k + pos) / scale
        q, k = (t.reshape(-1, h, d).transpose(0, 1) for t in (q, k))  # [h, n, d]
        p = 1 + module.alpha * torch.sigmoid(module.power[0])  # [h, 1, d]
        q_pos, q_neg, k_pos, k_neg = (torch.relu(t)**p for t in (q, -q, k, -k))
        k_feat = torch.cat([k_pos, k_neg], dim=-1)
        n = k.shape[1]
        entropies = layer['mean_row_entropy_nats']
        for name, q_feat in (('same', torch.cat([q_pos, q_neg],
                                                -1)), ('opposite', torch.cat([q_neg, q_pos], -1))):
            sims = q_feat @ k_feat.transpose(1, 2)
            dense = sims / (sims.sum(-1, keepdim=True) + n * module.eps)
            np.testing.assert_allclose(entropies[name], _dense_entropy(dense), atol=1e-4)
        softmax = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1)
        np.testing.assert_allclose(entropies['softmax'], _dense_entropy(softmax), atol=1e-4)


def test_layer_statistics_kernel_scales_match_at_the_medians():
    _, backbone = _backbone(LAPLACIAN_CONFIG)
    record = record_attentions(backbone, torch.randn(1, 3, 64, 64))[0]
    stats = layer_statistics(record, max_queries=None)
    scales = stats.scales
    laplacian_at_median = math.exp(-scales['median_l1'] / scales['lam'])
    gaussian_at_median = math.exp(-scales['median_sq_l2'] / (2 * scales['sigma']**2))
    assert scales['lam'] == record.module.lam
    assert laplacian_at_median == pytest.approx(gaussian_at_median, rel=1e-9)
    tokens = record.x.shape[1]
    assert stats.l1.numel() == record.module.num_heads * tokens * (tokens - 1
                                                                   )  # self-pairs left out
    streams, _, _, _, grid = attention_streams(record)
    assert set(streams) == {'laplacian'} and grid == record.hw_shape


# ---------------------------------------------------------------- ONNX export


def _onnx_matches_pytorch(tool, config, tmp_path):
    path = str(tmp_path / 'model.onnx')
    assert tool.main([config, '--out', path, '--shape', '64', '64', '--check-shape', '96',
                      '128']) == 0
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    model, names = tool.build_model(os.path.join(ROOT, config), seed=0)  # the same seeded weights
    assert [o.name for o in session.get_outputs()] == names
    for shape in ((1, 3, 64, 64), (2, 3, 96, 128)):
        image = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            expected = model(image)  # the default ops (compiled when built), not the reference
        got = session.run(None, {'image': image.numpy()})
        assert len(got) == len(expected)
        for out, ref in zip(got, expected):
            assert out.shape == tuple(ref.shape)
            np.testing.assert_allclose(out, ref.numpy(), rtol=0, atol=1e-4)


@pytest.mark.slow
def test_onnx_export_laplacianformer_tiny_two_sizes(tmp_path, capsys):
    tool = _load_tool('export_onnx')
    _onnx_matches_pytorch(tool, LAPLACIAN_CONFIG, tmp_path)
    output = capsys.readouterr().out
    assert 'OK: onnxruntime matches PyTorch within 0.0001 on 2 input sizes' in output
    assert '96x128 out3: onnx [2, 512, 3, 4]' in output


@pytest.mark.slow
def test_onnx_export_pola_pvt_tiny_two_sizes(tmp_path):
    _onnx_matches_pytorch(_load_tool('export_onnx'), POLA_CONFIG, tmp_path)


def test_onnx_report_fails_above_tolerance(capsys):
    tool = _load_tool('export_onnx')
    rows = [
        dict(shape=(64, 64),
             output='out0',
             torch_shape=(1, 8),
             onnx_shape=(1, 8),
             max_abs_diff=2e-4),
        dict(shape=(64, 64),
             output='out1',
             torch_shape=(1, 8),
             onnx_shape=(1, 8),
             max_abs_diff=1e-6)
    ]
    assert tool.report(rows, atol=1e-4) == 1
    assert 'FAILED: 1 output(s)' in capsys.readouterr().out
    assert tool.report(rows[1:], atol=1e-4) == 0


# ---------------------------------------------------------------- benchmark plot


def test_benchmark_plot_from_json(tmp_path):
    from dev.benchmarks.plot import input_size, num_tokens, plot_json, series
    rows = []
    for name, exponent in (('linear', 1.0), ('quadratic', 2.0)):
        for size in ('224^2', '512^2', '800x1333'):
            tokens = num_tokens(*input_size({'input': size}))
            rows.append({
                'backbone': name,
                'input': size,
                'fwd ms': 1e-3 * tokens**exponent,
                'peak fwd MiB': 1e-4 * tokens**exponent,
                'fwd+bwd ms': None if size == '800x1333' else 3e-3 * tokens**exponent
            })
    json_path, png_path = tmp_path / 'bench.json', tmp_path / 'bench.png'
    json_path.write_text(json.dumps({'device': 'cpu', 'sections': [{'rows': rows}]}))
    panels = plot_json(str(json_path), str(png_path))
    assert len(panels) == 3  # fwd+bwd memory has no numbers: no panel row is invented for it
    assert input_size({'input': '800x1333'}) == (800, 1333) and num_tokens(800, 1333) == 200 * 334
    assert [x for x, _ in series(rows, 'fwd+bwd ms')['linear']] == [56 * 56, 128 * 128]
    _assert_readable_png(png_path, min_colours=20)


@pytest.mark.slow
def test_visualisation_loads_a_checkpoint(tmp_path):
    """A whole-model checkpoint (``backbone.`` keys under ``state_dict``) of the seed-1 backbone
    gives the entropies of the seed-1 random backbone, not those of the default seed 0."""
    require_toy_data('coco')
    cfg, backbone = _backbone(POLA_CONFIG, seed=1)
    checkpoint = tmp_path / 'detector.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in backbone.state_dict().items()}},
               checkpoint)
    tool = _load_tool('visualize_attention')
    assert tool.main([POLA_CONFIG, str(checkpoint), '--shape', '64', '64', '--points', '0.5,0.5',
                      '--max-heads', '1', '--max-queries', '50', '--out', str(tmp_path)]) == 0
    with open(tmp_path / 'stats.json') as f:
        stats = json.load(f)
    image = _image_like_the_tool(cfg, stats)
    got = [layer['mean_row_entropy_nats'] for layer in stats['layers']]
    for seed, same in ((1, True), (0, False)):
        _, backbone = _backbone(POLA_CONFIG, seed=seed)
        records = one_block_per_stage(record_attentions(backbone, image))
        expected = [layer_statistics(r, max_queries=50).entropy for r in records]
        assert (got == expected) == same, seed


def test_benchmark_plot_option_draws_after_the_run(tmp_path):
    import argparse
    from dev.benchmarks.plot import with_plot_option
    calls = []

    def add_arguments(parser):
        parser.add_argument('--out')

    def run_benchmark(args):  # stands in for a benchmark: writes its JSON to --out
        calls.append(args.out)
        rows = [{'backbone': 'b', 'input': size, 'fwd ms': ms, 'peak fwd MiB': ms}
                for size, ms in (('224^2', 1.0), ('512^2', 5.0))]
        with open(args.out, 'w') as f:
            json.dump({'sections': [{'rows': rows}]}, f)
        return 0

    add, main = with_plot_option(add_arguments, run_benchmark)
    parser = argparse.ArgumentParser()
    add(parser)
    figure = tmp_path / 'fig.png'
    assert main(parser.parse_args(['--plot', str(figure)])) == 0
    assert calls == [str(tmp_path / 'fig.json')]  # no --out: the JSON goes beside the figure
    _assert_readable_png(figure, min_colours=20)
    assert main(parser.parse_args(['--out', str(tmp_path / 'run.json')])) == 0  # no --plot
    assert len(list(tmp_path.glob('*.png'))) == 1


@pytest.mark.parametrize('size', [(3, 4), (7, 7), (8, 10), (25, 42), (13, 5)])
def test_exportable_capped_pooling_equals_adaptive_avg_pool(size):
    from mmlinattn.models.layers.laplacian_attention import capped_avg_pool2d_exportable
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    cap = tuple(min(s, 7) for s in size)
    torch.testing.assert_close(capped_avg_pool2d_exportable(x, (7, 7)),
                               F.adaptive_avg_pool2d(x, cap), rtol=1e-12, atol=1e-12)


def test_exportable_capped_pooling_follows_the_size_under_torch_export():
    """torch.export (the dynamo ONNX exporter's capture) with dynamic H and W: the pooling matrices
    are built from the symbolic sizes, so one program is right below and above the cap."""
    from mmlinattn.models.layers.laplacian_attention import capped_avg_pool2d_exportable

    class Pool(torch.nn.Module):
        def forward(self, x):
            return capped_avg_pool2d_exportable(x, (7, 7))

    auto = torch.export.Dim.AUTO
    program = torch.export.export(Pool(), (torch.randn(1, 2, 12, 15), ), dynamic_shapes=({2: auto, 3: auto}, ))
    for size in [(12, 15), (25, 42), (5, 9), (3, 4)]:
        x = torch.randn(1, 2, *size)
        cap = tuple(min(s, 7) for s in size)
        torch.testing.assert_close(program.module()(x), F.adaptive_avg_pool2d(x, cap), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_onnx_export_with_a_landmark_cap_stays_right_at_other_sizes(tmp_path):
    """max_landmark_grid: traced where the cap is not reached (64x64: a 2x2 landmark grid in stage
    1), run where it is (96x128: 3x4 pooled to 2x2) and the other way round."""
    from mmlinattn.models.backbones import LaplacianFormer
    tool = _load_tool('export_onnx')
    torch.manual_seed(0)
    model = LaplacianFormer(arch='tiny', attn_cfg=dict(max_landmark_grid=2), out_indices=(1, 3))
    model.init_weights()
    model.eval()
    for trace, other in (((64, 64), (96, 128)), ((96, 128), (64, 64))):
        path = str(tmp_path / f'capped_{trace[0]}.onnx')
        tool.export(model, ['out1', 'out3'], path, trace)
        results = tool.compare(model, path, [trace, other])
        assert len(results) == 4 and max(r['max_abs_diff'] for r in results) < 1e-4, results
