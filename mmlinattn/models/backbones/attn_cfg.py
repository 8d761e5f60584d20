"""A backbone's ``attn_cfg``: the settings it passes, unchanged, to every attention layer it builds.

The settings are the keyword-only parameters of the attention's constructor, which owns their
defaults and their checks; the backbone only checks that each key is one of them.
"""
import inspect
from typing import Mapping, Optional, Tuple

# Former names of attention settings -> their attn_cfg key.
RENAMED_SETTINGS = {'ns_eps': 'landmark_shift'}


def attention_settings(attention: type) -> Tuple[str, ...]:
    """The keys ``attn_cfg`` may hold for ``attention``: its constructor's keyword-only parameters."""
    return tuple(name for name, param in inspect.signature(attention).parameters.items()
                 if param.kind is inspect.Parameter.KEYWORD_ONLY)


def check_attn_cfg(backbone: str, attention: type, attn_cfg: Optional[Mapping[str, object]],
                   unknown_kwargs: Mapping[str, object]) -> dict:
    """``attn_cfg`` as a dict (None: empty, the attention's defaults).

    Raises ``TypeError`` for the keyword arguments the backbone does not take (``unknown_kwargs``),
    naming the ``attn_cfg`` key of an attention setting given to the backbone directly, and
    ``ValueError`` for an ``attn_cfg`` key that is not a setting of ``attention``.
    """
    settings = attention_settings(attention)
    for name in unknown_kwargs:
        key = RENAMED_SETTINGS.get(name, name)
        if key in settings:
            raise TypeError(f'{backbone}: {name!r} is a setting of {attention.__name__}; pass it as '
                            f'attn_cfg=dict({key}=...)')
    if unknown_kwargs:
        raise TypeError(f'{backbone} got unexpected keyword arguments {sorted(unknown_kwargs)}')
    attn_cfg = dict(attn_cfg or {})
    unknown = [key for key in attn_cfg if key not in settings]
    if unknown:
        renamed = ''.join(f'; use {RENAMED_SETTINGS[key]!r} for {key!r}' for key in unknown
                          if key in RENAMED_SETTINGS)
        raise ValueError(f'{backbone}: attn_cfg keys {unknown} are not settings of '
                         f'{attention.__name__}, which takes {list(settings)}{renamed}')
    return attn_cfg
