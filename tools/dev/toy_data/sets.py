"""All toy sets, with a stamp per set so that an identical second call does nothing.

Layouts (``<root>`` is :data:`TOY_DATA_ROOT` unless told otherwise): see :mod:`.coco`, :mod:`.ade`,
:mod:`.imagenet`. Each set root also holds ``toy_data.json``, the arguments that produced it (see
:func:`make_all`).
"""
import json
import os
import os.path as osp
import shutil
import time

from .ade import make_toy_ade
from .coco import make_toy_coco
from .common import TOY_DATA_VERSION, TOY_DEFAULT_COUNTS
from .imagenet import make_toy_imagenet

TOY_DATA_ROOT = 'data/toy'
TOY_SETS = ('coco', 'ade', 'imagenet')
STAMP_FILE = 'toy_data.json'
_MAKERS = {'coco': make_toy_coco, 'ade': make_toy_ade, 'imagenet': make_toy_imagenet}


def read_stamp(set_dir):
    """The ``toy_data.json`` stamp of a generated set, or None when there is none."""
    path = osp.join(set_dir, STAMP_FILE)
    if not osp.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _describe(counts) -> str:
    parts = []
    for split in ('train', 'val'):
        text = f"{counts[split]['images']} {split}"
        if 'instances' in counts[split]:
            text += f" ({counts[split]['instances']} instances)"
        parts.append(text)
    return ' / '.join(parts) + ' images'


def make_all(out_root=TOY_DATA_ROOT, seed=0, what=TOY_SETS, num_train=None, num_val=None,
             force=False, log=print) -> dict:
    """Generate the sets named in ``what`` under ``out_root``/<set>, skipping up-to-date ones.

    ``num_train``/``num_val`` (None = :data:`TOY_DEFAULT_COUNTS`) apply to every set, per class
    for 'imagenet'. A set whose ``toy_data.json`` records the same arguments and version is
    skipped unless ``force``; one with other arguments is replaced. A folder without a stamp is
    not ours: it is replaced only with ``force``. Sets are written into a temporary sibling and
    renamed into place, so an interrupted run leaves no half-written set.

    Returns ``{set: {'status': 'written' | 'skipped', 'path', 'counts', 'seconds'}}``.
    """
    unknown = [name for name in what if name not in _MAKERS]
    if unknown:
        raise ValueError(f'what must name sets among {TOY_SETS}, got {list(what)}')
    results = {}
    for name in what:
        set_dir = osp.join(out_root, name)
        default_train, default_val = TOY_DEFAULT_COUNTS[name]
        args = dict(set=name, version=TOY_DATA_VERSION, seed=int(seed),
                    num_train=int(default_train if num_train is None else num_train),
                    num_val=int(default_val if num_val is None else num_val))
        stamp = read_stamp(set_dir)
        if stamp is not None and stamp.get('args') == args and not force:
            results[name] = dict(status='skipped', path=set_dir, counts=stamp['counts'], seconds=0.0)
            log(f"{name}: up to date at {set_dir} ({_describe(stamp['counts'])}, seed {seed}); skipped")
            continue
        if stamp is None and osp.exists(set_dir) and not force:
            raise FileExistsError(f'{set_dir} exists but has no {STAMP_FILE}, so it was not written by '
                                  'make_toy_data (or the run was interrupted); pass force=True '
                                  '(--force) to replace it')
        start = time.perf_counter()
        partial = osp.join(out_root, f'.{name}.partial-{os.getpid()}')
        shutil.rmtree(partial, ignore_errors=True)
        counts = _MAKERS[name](partial, args['num_train'], args['num_val'], args['seed'])
        with open(osp.join(partial, STAMP_FILE), 'w') as f:
            json.dump(dict(args=args, counts=counts), f, indent=2, sort_keys=True)
        if osp.exists(set_dir):
            shutil.rmtree(set_dir)
        os.replace(partial, set_dir)
        seconds = time.perf_counter() - start
        results[name] = dict(status='written', path=set_dir, counts=counts, seconds=seconds)
        log(f'{name}: wrote {_describe(counts)} to {set_dir} in {seconds:.1f} s')
    return results
