"""``python -m mmlinattn.configs [NAME ...] [--dir]``: the paths of the shipped configs."""
import argparse
from typing import Optional, Sequence

from . import config_dir, config_path, list_configs


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog='python -m mmlinattn.configs',
        description='Print the paths of the configs that ship with mmlinattn (no argument: their names).')
    parser.add_argument('names', nargs='*', help='config names, e.g. mask_rcnn_laplacian_tiny_1x_coco.py')
    parser.add_argument('--dir', action='store_true', help='print the config folder')
    args = parser.parse_args(argv)
    if args.dir:
        print(config_dir())
    for name in args.names:
        try:
            print(config_path(name))
        except ValueError as err:
            parser.error(str(err))
    if not args.dir and not args.names:
        print('\n'.join(list_configs()))


if __name__ == '__main__':
    main()
