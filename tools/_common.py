"""Shared by tools/train.py and tools/test.py: argument parsing and config preparation.

Works for any mmdet, mmseg or mmpretrain config: the library is the config's ``default_scope``,
and mmengine's Runner builds everything from the registries of that scope.
"""
import argparse
import contextlib
import os
import os.path as osp

from mmengine.config import Config, DictAction

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS_DIR = osp.join(REPO_ROOT, 'configs')
SUPPORTED_SCOPES = ('mmdet', 'mmseg', 'mmpretrain')
SAFE_LOADING_HOOK = 'safe_checkpoint_loading'  # its key in configs/_base_/plugin.py's default_hooks


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--work-dir', help='folder for logs and checkpoints '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, e.g. train_cfg.max_iters=10 '
                        'train_dataloader.batch_size=1 (list keys allowed: pipeline.2.scale="(512,512)")')
    parser.add_argument('--toy-data', action='store_true',
                        help='use the bundled synthetic data set (tools/dev/make_toy_data.py, data/toy) '
                        'instead of the real one')
    parser.add_argument('--unsafe-trust-checkpoint', action='store_true',
                        help='fully unpickle the checkpoint this command loads (train: --resume / '
                        'load_from; test: CHECKPOINT), which can run any code the file holds; only '
                        'for files you trust. Default: tensors and plain data only')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none',
                        help='job launcher for distributed runs (torchrun: pytorch)')
    # torchrun passes --local-rank (older launchers --local_rank)
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def load_config(args) -> Config:
    """Read the config, apply --cfg-options and --toy-data, set work_dir and launcher."""
    if not osp.isfile(args.config):
        raise SystemExit(f'error: config file {args.config!r} does not exist')
    cfg = Config.fromfile(args.config)
    scope = cfg.get('default_scope')
    if scope not in SUPPORTED_SCOPES:
        raise SystemExit(f'error: {args.config}: default_scope must be one of {SUPPORTED_SCOPES}, '
                         f'got {scope!r}')
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.toy_data:
        from _toy_overlay import use_toy_data
        use_toy_data(cfg, CONFIGS_DIR)
    cfg.launcher = args.launcher
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    return cfg


def _plugin_types(node, where='model'):
    if isinstance(node, dict):
        if isinstance(node.get('type'), str) and node['type'].startswith('mmlinattn.'):
            yield where, node['type']
        for key, value in node.items():
            yield from _plugin_types(value, f'{where}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _plugin_types(value, f'{where}.{i}')


def check_plugin_types(cfg: Config) -> None:
    """Name the config key and the registered choices when a ``mmlinattn.X`` type does not exist."""
    from mmlinattn.registry import MODELS
    for where, type_name in _plugin_types(cfg.get('model', {})):
        if MODELS.get(type_name.split('.', 1)[1]) is None:
            choices = ', '.join(sorted(MODELS.module_dict))
            raise SystemExit(f'error: {where}.type={type_name!r} is not registered by mmlinattn; '
                             f'registered types: {choices}')


def init_cpu_distributed(cfg: Config) -> None:
    """Distributed runs without CUDA (CPU debugging under torchrun).

    mmengine 0.10.7's pytorch launcher calls ``torch.cuda.set_device`` unconditionally, and its DDP
    wrapper passes ``device_ids=[local_rank]``, which DDP rejects for CPU modules. Without CUDA the
    process group is initialised here with gloo (the Runner then skips its own initialisation) and
    the model is wrapped with ``device_ids=None``.
    """
    import torch
    import torch.distributed as dist
    if cfg.launcher != 'pytorch' or torch.cuda.is_available() or dist.is_initialized():
        return
    print('[mmlinattn] no CUDA device: using the gloo backend for distributed training', flush=True)
    cfg.env_cfg.setdefault('dist_cfg', {})['backend'] = 'gloo'
    dist.init_process_group(backend='gloo', rank=int(os.environ['RANK']),
                            world_size=int(os.environ['WORLD_SIZE']))
    if cfg.get('model_wrapper_cfg') is None:
        cfg.model_wrapper_cfg = dict(
            type='MMDistributedDataParallel', device_ids=None, broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))


def _dataset_roots(cfg: Config, splits):
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        dataset = loader['dataset']
        while isinstance(dataset.get('dataset'), dict):
            dataset = dataset['dataset']
        datasets = dataset.get('datasets', [dataset]) if dataset.get('type') == 'ConcatDataset' \
            else [dataset]
        for ds in datasets:
            if ds.get('data_root'):
                yield f'{split}_dataloader', ds['data_root']


def check_data_roots(cfg: Config, splits) -> None:
    """Fail early, naming the folder and the fix, when a data set's data_root is missing."""
    for where, root in _dataset_roots(cfg, splits):
        if not osp.isdir(root):
            raise SystemExit(
                f'error: the data root {root!r} of {where} does not exist (working directory '
                f'{os.getcwd()}). Put the data set there in its standard layout (see '
                'docs/tools.md, "Data"), override it with --cfg-options, or run on the bundled synthetic '
                'set with --toy-data (after `python tools/dev/make_toy_data.py`).')


def use_safe_checkpoint_loading(cfg: Config, unsafe_trust_checkpoint: bool) -> None:
    """Every checkpoint the run loads (load_from, resume) goes through
    :class:`mmlinattn.hooks.SafeCheckpointLoadingHook`, the one loading path of the stock tools as
    well: the project's configs name it in ``default_hooks``; any other config gets it here.
    ``unsafe_trust_checkpoint`` (--unsafe-trust-checkpoint) sets the hook's opt-in."""
    if unsafe_trust_checkpoint and not (cfg.get('load_from') or cfg.get('resume')):
        raise SystemExit('error: --unsafe-trust-checkpoint: this run loads no checkpoint (give '
                         '--resume [FILE] or load_from)')
    if cfg.get('default_hooks') is None:
        cfg.default_hooks = {}
    hook = cfg.default_hooks.get(SAFE_LOADING_HOOK) or dict(type='mmlinattn.SafeCheckpointLoadingHook')
    if unsafe_trust_checkpoint:
        hook['unsafe_trust_checkpoint'] = True
    cfg.default_hooks[SAFE_LOADING_HOOK] = hook


@contextlib.contextmanager
def refused_checkpoint_ends_the_command():
    """A checkpoint the hook refuses ends the command with the reason and the opt-in, not a
    traceback."""
    from mmlinattn.checkpoint import UnsafeCheckpointError
    try:
        yield
    except UnsafeCheckpointError as err:
        raise SystemExit(f'error: {err}') from None


def close_distributed() -> None:
    """End the process group once the run is done: a gloo group left to interpreter exit can abort
    a rank after its work ("terminate called without an active exception")."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def build_runner(cfg: Config):
    """Check the plugin types, set up CPU-only distributed runs, then build the Runner."""
    import mmlinattn  # noqa: F401  (registers the plugin before the config's custom_imports)
    check_plugin_types(cfg)
    init_cpu_distributed(cfg)
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)
