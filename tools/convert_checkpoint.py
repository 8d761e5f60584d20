"""Convert an official PolaFormer ImageNet checkpoint to this package's keys.

    python tools/convert_checkpoint.py pola_pvt_t.pth pretrained/pola_pvt_tiny.pth --arch pola_pvt_tiny
    python tools/convert_checkpoint.py pola_swin_t.pth pola_swin_t_in1k.pth --arch pola_swin_tiny --keep-head

Without ``--keep-head`` the output holds the backbone weights, for dense prediction:
``model.backbone.init_cfg=dict(type='Pretrained', checkpoint=DST)`` (backbones also convert official
files themselves when ``init_cfg`` points at one). With ``--keep-head`` it is an mmpretrain
``ImageClassifier`` state dict (``backbone.*``, ``head.fc.*``) for ``configs/pola_*_8xb128_in1k.py``
and ``tools/test.py``. The result is checked against the backbone built for ``--arch``: every dropped
key is listed with the reason, missing and unexpected keys are listed by name (the command fails
on them unless ``--allow-mismatch``), and a shape mismatch fails naming the key. The backbone is
built for the input size (and Pola-Swin window size) that SRC's shapes give (e.g. the official
Pola-Swin-B at 384^2, window 12), or for ``--img-size`` / ``--window-size`` when given. SRC is read
without running code from it (its config and argparse objects stay inert records) unless
``--unsafe-trust-checkpoint``:

    python tools/convert_checkpoint.py pola_swin_b_384.pth pola_swin_b_384_in1k.pth --arch pola_swin_base --keep-head
"""
import argparse
import pickle
import sys
from collections import OrderedDict

import torch

from mmlinattn.checkpoint import load_checkpoint_file
from mmlinattn.models.backbones.base import check_shapes, format_keys, strip_prefix, unwrap_state_dict
from mmlinattn.models.backbones.polaformer_converter import ARCHS, convert_official, official_model_settings


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='official checkpoint ({"model": state_dict, ...})')
    parser.add_argument('dst', help='where to write the converted checkpoint')
    parser.add_argument('--arch', required=True, choices=sorted(ARCHS), help='the model of SRC')
    parser.add_argument('--keep-head', action='store_true',
                        help='keep the 1000-class head and write an mmpretrain classifier state dict')
    parser.add_argument('--allow-mismatch', action='store_true',
                        help='write DST even if keys are missing or unexpected (they are still listed)')
    parser.add_argument('--unsafe-trust-checkpoint', action='store_true',
                        help='fully unpickle SRC, which can run any code it holds; only for files '
                        'you trust. Default: tensors and plain data only')
    parser.add_argument('--img-size', type=int,
                        help='input size SRC was trained at (default: read from its shapes)')
    parser.add_argument('--window-size', type=int,
                        help='Pola-Swin window size of SRC (default: read from its shapes)')
    return parser.parse_args(argv)


def build_backbone(arch: str, state_dict, img_size=None, window_size=None):
    """The backbone of ``arch`` for the input (and window) size of ``state_dict``'s shapes, or the
    ones given."""
    from mmlinattn.models.backbones import PolaPVT, PolaSwin
    family, variant = ARCHS[arch]
    if window_size is not None and family != 'swin':
        raise ValueError(f'--window-size applies to Pola-Swin only, not {arch}')
    needs_file = img_size is None or (family == 'swin' and window_size is None)
    settings = official_model_settings(state_dict, family) if needs_file else {}
    if img_size is not None:
        settings['pretrain_img_size'] = img_size
    if window_size is not None:
        settings['window_size'] = window_size
    backbone_type = PolaPVT if family == 'pvt' else PolaSwin
    return backbone_type(arch=variant, out_indices=(3, ), **settings)


def convert(src: str, arch: str, keep_head: bool, img_size=None, window_size=None,
            unsafe_trust_checkpoint: bool = False):
    """-> (converted state dict, dropped key -> reason, missing keys, unexpected keys)."""
    family, _ = ARCHS[arch]
    state_dict = unwrap_state_dict(
        load_checkpoint_file(src, unsafe_trust_checkpoint=unsafe_trust_checkpoint))
    converted, dropped = convert_official(state_dict, family, keep_head=keep_head)
    backbone = build_backbone(arch, state_dict, img_size, window_size)
    weights = strip_prefix(converted, 'backbone.' if keep_head else '')
    check_shapes(backbone, weights, source=src)
    expected = set(backbone.state_dict())
    missing = sorted(expected - set(weights))
    unexpected = sorted(set(weights) - expected)
    if keep_head:
        head = {k: v for k, v in converted.items() if not k.startswith('backbone.')}
        missing += sorted({'head.fc.weight', 'head.fc.bias'} - set(head))
        unexpected += sorted(set(head) - {'head.fc.weight', 'head.fc.bias'})
    return converted, dropped, missing, unexpected


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        converted, dropped, missing, unexpected = convert(args.src, args.arch, args.keep_head,
                                                          args.img_size, args.window_size,
                                                          args.unsafe_trust_checkpoint)
    except (ValueError, FileNotFoundError, pickle.UnpicklingError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    for key, reason in dropped.items():
        print(f'dropped {key}: {reason}')
    print(f'missing keys: {format_keys(missing)}')
    print(f'unexpected keys: {format_keys(unexpected)}')
    if (missing or unexpected) and not args.allow_mismatch:
        print(f'error: {args.src} does not match {args.arch}; nothing written '
              '(--allow-mismatch writes it anyway)', file=sys.stderr)
        return 1
    meta = dict(source=args.src, arch=args.arch, keep_head=args.keep_head, converted_by='mmlinattn')
    torch.save({'state_dict': OrderedDict(converted), 'meta': meta}, args.dst)
    print(f'wrote {len(converted)} tensors to {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
