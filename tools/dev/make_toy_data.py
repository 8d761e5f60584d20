"""Write the synthetic toy datasets (COCO instances, ADE20K semantic, ImageNet classification).

    python tools/dev/make_toy_data.py [--out data/toy] [--seed 0] [--what coco ade imagenet]
                                      [--num-train N] [--num-val N] [--force]

A set that already exists with the same arguments is skipped; ``--force`` regenerates it. The
generation code is ``tools/dev/toy_data/``; it needs numpy, Pillow and OpenCV (which mmcv
installs), not torch and not an installed mmlinattn.
"""
import argparse
import sys
import time

import toy_data  # tools/dev/toy_data: the script's folder is on sys.path


def parse_args(argv=None):
    defaults = ', '.join(f'{name} {train}/{val}'
                         for name, (train, val) in toy_data.TOY_DEFAULT_COUNTS.items())
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default=toy_data.TOY_DATA_ROOT,
                        help='root folder; sets go to <out>/coco, <out>/ade, <out>/imagenet '
                        '(default: %(default)s)')
    parser.add_argument('--seed', type=int, default=0, help='random seed (default: %(default)s)')
    parser.add_argument('--what', nargs='+', choices=toy_data.TOY_SETS,
                        default=list(toy_data.TOY_SETS), help='which sets to write (default: all)')
    parser.add_argument('--num-train', type=int, default=None,
                        help='training images per set, per class for imagenet '
                        f'(default: {defaults} train/val)')
    parser.add_argument('--num-val', type=int, default=None,
                        help='validation images per set, per class for imagenet (default: see --num-train)')
    parser.add_argument('--force', action='store_true', help='regenerate even if up to date')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        results = toy_data.make_all(args.out, seed=args.seed, what=args.what,
                                    num_train=args.num_train, num_val=args.num_val, force=args.force)
    except (ValueError, FileExistsError) as err:
        sys.exit(f'error: {err}')
    if any(result['status'] == 'written' for result in results.values()):
        print(f'toy data ready in {time.perf_counter() - start:.1f} s')


if __name__ == '__main__':
    main()
