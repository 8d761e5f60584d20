"""A pickle module for ``torch.load(..., weights_only=False, pickle_module=restricted_unpickler)``
that never runs code from the file.

It rebuilds what torch's own ``weights_only`` loader rebuilds (tensors, storages, dtypes, plain
containers) and :data:`MMENGINE_CHECKPOINT_GLOBALS`. Every other class the file names becomes an
inert :class:`UnloadedObject`: its instances are made with ``object.__new__`` and keep the pickled
arguments, state and items as data; the class is never imported, constructed or asked to set its
state. A file that *calls* anything else when loaded (a pickle REDUCE of ``os.system``,
``pathlib.Path.touch``, ``getattr``, a class constructor, ...) fails with
:class:`UnsafeCheckpointError` before the call.

What mmengine 0.10.7's runner pickles beside tensors and plain containers (read with
``pickletools`` from the checkpoints it writes): ``HistoryBuffer`` objects in the message hub, whose
``__getstate__`` adds the class's table of statistics methods, which pickle protocol 2 writes as
``getattr(HistoryBuffer, 'min')`` (and ``max``, ``current``, ``mean``); numpy arrays inside them
(``_reconstruct``, ``ndarray``, ``dtype``), and numpy scalars (``scalar``; e.g. the runtime info's
``eta``). Allow-listing ``builtins.getattr`` itself would let a file reach any attribute of any
allowed object, so it is allow-listed only as :func:`history_buffer_statistic`, which resolves
exactly those four methods.
"""
import _compat_pickle
import pickle
from typing import Set

import numpy as np
from mmengine.logging import HistoryBuffer
from torch import _weights_only_unpickler


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The file would run code (call something outside the allow-list) when unpickled."""


# The statistics HistoryBuffer._set_default_statistics registers on its class.
HISTORY_BUFFER_STATISTICS = ('min', 'max', 'current', 'mean')


def history_buffer_statistic(owner, name: str):
    """What ``builtins.getattr`` may resolve in a checkpoint: ``HistoryBuffer.<statistic>``."""
    if owner is HistoryBuffer and name in HISTORY_BUFFER_STATISTICS:
        return getattr(HistoryBuffer, name)
    raise UnsafeCheckpointError(f'its pickle calls getattr({owner!r}, {name!r})')


def _numpy_globals() -> list:
    reconstruct = np.zeros(0).__reduce__()[0]  # numpy.core (numpy 1) / numpy._core (numpy 2)
    scalar = np.float64(0).__reduce__()[0]
    named = [(fn, f'{package}.multiarray.{fn.__name__}') for fn in (reconstruct, scalar)
             for package in ('numpy.core', 'numpy._core')]
    dtype_classes = [getattr(np.dtypes, name) for name in np.dtypes.__all__]
    return [np.ndarray, np.dtype, *dtype_classes, *named]


# For torch.serialization.safe_globals: entries are objects (found under module.qualname) or
# (object, name found in the file) pairs.
MMENGINE_CHECKPOINT_GLOBALS = [HistoryBuffer, (history_buffer_statistic, 'builtins.getattr'),
                               *_numpy_globals()]


def _allowed_globals() -> dict:
    """'module.name' -> object: torch's weights_only defaults and MMENGINE_CHECKPOINT_GLOBALS."""
    allowed = dict(_weights_only_unpickler._get_allowed_globals())  # torch's tensor-rebuild list
    for entry in MMENGINE_CHECKPOINT_GLOBALS:
        obj, name = entry if isinstance(entry, tuple) else (entry,
                                                            f'{entry.__module__}.{entry.__qualname__}')
        allowed[name] = obj
    return allowed


class _RefusesCalls(type):
    """Metaclass of the placeholders: a pickle REDUCE that would call the named object fails."""

    def __call__(cls, *args, **kwargs):
        raise UnsafeCheckpointError(f'its pickle calls {cls.class_path}(...)')

    def __repr__(cls):
        return cls.class_path or cls.__qualname__


class UnloadedObject(metaclass=_RefusesCalls):
    """An object of a class the file names but that is not rebuilt (``class_path``): the arguments
    its pickle gives ``__new__``, its pickled ``state`` and its dict/list ``items``, as data."""

    class_path = ''

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.new_args, obj.state, obj.items, obj.list_items = args, None, {}, []
        return obj

    def __setstate__(self, state):
        self.state = state

    def __setitem__(self, key, value):
        self.items[key] = value

    def append(self, item):
        self.list_items.append(item)

    def extend(self, items):
        self.list_items.extend(items)

    def __repr__(self):
        return f'<UnloadedObject {self.class_path}>'


class Unpickler(pickle.Unpickler):
    """Resolves only the allow-listed globals; any other one becomes an UnloadedObject subclass."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._allowed = _allowed_globals()
        self._placeholders = {}

    def find_class(self, module: str, name: str):
        if (module, name) in _compat_pickle.NAME_MAPPING:  # Python 2 names (protocol 2)
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        path = f'{module}.{name}'
        if path in self._allowed:
            return self._allowed[path]
        if path not in self._placeholders:
            self._placeholders[path] = _RefusesCalls(name.rpartition('.')[2], (UnloadedObject, ),
                                                     {'class_path': path, '__module__': __name__})
        return self._placeholders[path]


def load(file, **kwargs):
    return Unpickler(file, **kwargs).load()


def unloaded_class_paths(obj) -> Set[str]:
    """The ``class_path`` of every UnloadedObject in ``obj``, through containers and placeholders."""
    found, seen, todo = set(), set(), [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, UnloadedObject):
            found.add(item.class_path)
            todo += [item.new_args, item.state, item.items, item.list_items]
        elif isinstance(item, dict):
            todo += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo += list(item)
    return found
