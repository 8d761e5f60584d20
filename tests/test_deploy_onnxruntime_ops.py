"""The Laplacian kernel as one ONNX node run by the project's onnxruntime op library, and the
mmdeploy contexts (mmlinattn.deploy): export, numerics against the reference at shapes other than
the traced one, argument errors, and that every context restores what it changed."""
import os

import numpy as np
import pytest
import torch

from mmlinattn.deploy import mmdeploy as deploy_ctx
from mmlinattn.deploy import onnxruntime as deploy_ort
from mmlinattn.ops import laplacian_kernel
from mmlinattn.ops.dispatch import forced
from mmlinattn.ops.laplacian_kernel.onnx import DOMAIN, OP_TYPE, export_as_custom_node
from mmlinattn.ops.laplacian_kernel.reference import laplacian_kernel_reference

onnx = pytest.importorskip('onnx')
ort = pytest.importorskip('onnxruntime')


@pytest.fixture(scope='module')
def ops_library():
    path = deploy_ort.ops_library_path()
    if path is None:
        message = (f'{deploy_ort.LIBRARY_NAME} was not built (ONNXRUNTIME_INCLUDE_DIR unset when '
                   'the extension was compiled; tools/dev/setup_env.sh sets it)')
        if os.environ.get('CI', '').lower() == 'true':
            pytest.fail(message)
        pytest.skip(message)
    return path


def kernel_then_mix(q, k, lam, kernel):
    """K(q, k) k + sum_rows((K(k, k) + I) k): two kernels, the second followed by an op whose size
    comes from the kernel's output (a graph that took the traced size there fails elsewhere)."""
    square = kernel(k, k, lam).to(k.dtype)  # the casts of a compute dtype, as in the models
    square = square + torch.eye(square.shape[-1], dtype=square.dtype)
    return kernel(q, k, lam) @ k + (square @ k).sum(-2, keepdim=True)


class KernelThenMix(torch.nn.Module):

    def __init__(self, lam):
        super().__init__()
        self.lam = lam

    def forward(self, q, k):
        return kernel_then_mix(q, k, self.lam, laplacian_kernel)


def export(path, lam=3.0, custom_node=True):
    q, k = torch.randn(2, 3, 40, 12), torch.randn(2, 3, 16, 12)
    axes = {0: 'b', 1: 'h', 2: 'n', 3: 'd'}
    with forced('reference'), (export_as_custom_node() if custom_node else torch.no_grad()):
        torch.onnx.export(KernelThenMix(lam), (q, k), str(path), dynamo=False, opset_version=11,
                          input_names=['q', 'k'], output_names=['out'],
                          dynamic_axes={'q': axes, 'k': {**axes, 2: 'm'}, 'out': axes})
    return onnx.load(str(path))


def session(path, threads=2):
    return ort.InferenceSession(str(path), deploy_ort.session_options(threads),
                                providers=['CPUExecutionProvider'])


def test_export_writes_one_custom_node_per_kernel_and_no_elementwise_distance(tmp_path):
    model = export(tmp_path / 'k.onnx', lam=3.0)
    nodes = [n for n in model.graph.node if n.domain == DOMAIN]
    assert [n.op_type for n in nodes] == [OP_TYPE, OP_TYPE]
    assert all(onnx.helper.get_attribute_value(n.attribute[0]) == pytest.approx(3.0) for n in nodes)
    assert {(o.domain, o.version) for o in model.opset_import} >= {(DOMAIN, 1)}
    assert not [n for n in model.graph.node if n.op_type == 'Abs']
    standard = export(tmp_path / 's.onnx', custom_node=False)
    assert not [n for n in standard.graph.node if n.domain == DOMAIN]
    assert [n for n in standard.graph.node if n.op_type == 'Abs']


@pytest.mark.parametrize('shape', [(2, 3, 40, 16, 12), (1, 2, 301, 49, 37), (3, 1, 129, 17, 5),
                                   (1, 1, 1, 1, 1)])
def test_onnxruntime_matches_the_reference_at_other_shapes(tmp_path, ops_library, shape):
    """Traced at one shape, run at others (rows across the 128-row tasks, keys off the 16-key pad,
    odd head dims)."""
    export(tmp_path / 'k.onnx', lam=3.0)
    b, h, n, m, d = shape
    torch.manual_seed(0)
    q, k = torch.randn(b, h, n, d), torch.randn(b, h, m, d)
    (out, ) = session(tmp_path / 'k.onnx').run(None, {'q': q.numpy(), 'k': k.numpy()})
    expected = kernel_then_mix(q.double(), k.double(), 3.0, laplacian_kernel_reference)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_the_custom_node_matches_the_standard_operator_export(tmp_path, ops_library):
    export(tmp_path / 'k.onnx')
    export(tmp_path / 's.onnx', custom_node=False)
    q, k = torch.randn(1, 2, 77, 9), torch.randn(1, 2, 20, 9)
    feed = {'q': q.numpy(), 'k': k.numpy()}
    (custom, ), (standard, ) = (session(tmp_path / name).run(None, feed) for name in ('k.onnx', 's.onnx'))
    np.testing.assert_allclose(custom, standard, rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_refused_with_the_names(tmp_path, ops_library):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node(OP_TYPE, ['q', 'k'], ['out'], domain=DOMAIN, **{'lambda': 0.0})], 'g',
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in 'qk'],
        [onnx.helper.make_tensor_value_info('out', onnx.TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid('', 11),
                                                         onnx.helper.make_opsetid(DOMAIN, 1)])
    onnx.save(model, str(tmp_path / 'bad_lambda.onnx'))
    q = np.zeros((1, 1, 4, 3), np.float32)
    with pytest.raises(Exception, match='lambda must be a positive finite number'):
        session(tmp_path / 'bad_lambda.onnx').run(None, {'q': q, 'k': q})
    export(tmp_path / 'k.onnx')
    with pytest.raises(Exception, match='same batch, heads and head dim'):
        session(tmp_path / 'k.onnx').run(None, {'q': q, 'k': np.zeros((1, 1, 4, 5), np.float32)})


def test_eager_results_do_not_change_inside_the_export_context():
    q, k = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 6, 4)
    with export_as_custom_node():
        inside = laplacian_kernel(q, k, 2.0)
    torch.testing.assert_close(inside, laplacian_kernel(q, k, 2.0))


def test_a_missing_library_is_named_with_the_fix(monkeypatch):
    monkeypatch.setattr(deploy_ort, 'ops_library_path', lambda: None)
    with pytest.raises(RuntimeError, match='ONNXRUNTIME_INCLUDE_DIR'):
        deploy_ort.session_options()
    assert deploy_ort.session_options(ops_library=False) is not None
    assert deploy_ort.session_options(ops_library=None) is not None  # where built: here, not


def test_options_with_the_library_where_built_run_the_custom_node(tmp_path):
    export(tmp_path / 'k.onnx')
    q, k = np.random.randn(2, 3, 40, 12).astype(np.float32), np.random.randn(2, 3, 16, 12).astype(np.float32)
    where_built = ort.InferenceSession(str(tmp_path / 'k.onnx'), deploy_ort.session_options(2, ops_library=None),
                                       providers=['CPUExecutionProvider'])
    np.testing.assert_allclose(where_built.run(None, {'q': q, 'k': k})[0],
                               session(tmp_path / 'k.onnx').run(None, {'q': q, 'k': k})[0])


def test_the_deploy_config_key_is_checked():
    assert deploy_ctx.laplacian_kernel_form({}) == 'custom_op'
    assert deploy_ctx.laplacian_kernel_form(
        {'mmlinattn_export': {'laplacian_kernel': 'standard_ops'}}) == 'standard_ops'
    with pytest.raises(ValueError, match="mmlinattn_export.laplacian_kernel must be one of"):
        deploy_ctx.laplacian_kernel_form({'mmlinattn_export': {'laplacian_kernel': 'fused'}})


def test_the_contexts_restore_what_they_change():
    from torch.onnx import symbolic_opset9
    export_fn, had_cast_long = torch.onnx.export, hasattr(symbolic_opset9, '_cast_Long')
    with deploy_ctx.mmdeploy_export({}):
        assert torch.onnx.export is not export_fn
        assert hasattr(symbolic_opset9, '_cast_Long')
        assert os.environ['MMLINATTN_OPS'] == 'reference'
    assert torch.onnx.export is export_fn
    assert hasattr(symbolic_opset9, '_cast_Long') == had_cast_long
    pytest.importorskip('mmdeploy')
    from mmdeploy.backend.onnxruntime import wrapper
    saved = wrapper.ort
    with deploy_ctx.onnxruntime_sessions(threads=1):
        assert wrapper.ort.SessionOptions().intra_op_num_threads == 1
        assert wrapper.ort.InferenceSession is ort.InferenceSession
    assert wrapper.ort is saved


def test_importing_the_deploy_package_changes_nothing():
    import subprocess
    import sys
    code = ('import torch, torch.onnx.symbolic_opset9 as s; e = torch.onnx.export; '
            'import mmlinattn.deploy.mmdeploy, mmlinattn.deploy.onnxruntime; '
            'assert torch.onnx.export is e and not hasattr(s, "_cast_Long")')
    subprocess.run([sys.executable, '-c', code], check=True)


class Outputs(torch.nn.Module):

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone

    def forward(self, x):
        return tuple(self.backbone(x))


def test_a_backbone_traced_at_one_size_runs_at_another(tmp_path, ops_library):
    """LaplacianFormer-T with custom nodes, traced where every landmark grid is at its 7x7 cap and
    run where the later stages' grids are smaller (fewer landmarks than traced)."""
    from mmlinattn.registry import MODELS
    torch.manual_seed(0)
    backbone = Outputs(MODELS.build(dict(type='LaplacianFormer', arch='tiny'))).eval()
    path = tmp_path / 'backbone.onnx'
    with torch.no_grad(), forced('reference'), export_as_custom_node():
        torch.onnx.export(backbone, (torch.randn(1, 3, 256, 320), ), str(path), dynamo=False,
                          opset_version=11, input_names=['image'],
                          dynamic_axes={'image': {0: 'batch', 2: 'height', 3: 'width'}})
    assert [n for n in onnx.load(str(path)).graph.node if n.op_type == OP_TYPE]
    image = torch.randn(2, 3, 96, 160)
    got = session(path).run(None, {'image': image.numpy()})
    with torch.no_grad():
        expected = backbone(image)
    for a, b in zip(got, expected):
        assert a.shape == tuple(b.shape)
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-4)


def test_a_static_graph_loses_its_position_embedding_resizes_when_onnxruntime_loads_it(tmp_path,
                                                                                      ops_library):
    """Exported at one fixed size, the resize of the position embeddings has constant inputs only:
    onnxruntime's graph optimisation folds it, so no Resize runs per image."""
    from mmlinattn.registry import MODELS
    backbone = Outputs(MODELS.build(dict(type='LaplacianFormer', arch='tiny'))).eval()
    path, optimised = tmp_path / 'static.onnx', tmp_path / 'optimised.onnx'
    with torch.no_grad(), forced('reference'), export_as_custom_node():
        torch.onnx.export(backbone, (torch.randn(1, 3, 160, 192), ), str(path), dynamo=False,
                          opset_version=11, input_names=['image'])
    assert [n for n in onnx.load(str(path)).graph.node if n.op_type == 'Resize']
    options = deploy_ort.session_options(threads=1)
    options.optimized_model_filepath = str(optimised)
    ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])
    assert not [n for n in onnx.load(str(optimised)).graph.node if n.op_type == 'Resize']
