"""The toy ImageNet-layout classification set: ten classes (ImageNet-1k's first ten), a shape in a
class hue on a random texture (read unchanged by ``mmpretrain.datasets.ImageNet``).

    <root>/imagenet/{train,val}/<wnid>/<wnid>_%05d.JPEG
    <root>/imagenet/meta/{train,val}.txt          lines "<wnid>/<name>.JPEG <label>"
"""
import colorsys
import math
import os
import os.path as osp

import numpy as np

from .common import (TOY_DEFAULT_COUNTS, add_noise, blend, check_counts, draw_mask, ramp, random_background,
                     save_jpeg, to_uint8, toy_image_rng)

# The first ten synsets of the sorted ImageNet-1k list, so label k is ImageNet-1k class k.
IMAGENET_TOY_WNIDS = ('n01440764', 'n01443537', 'n01484850', 'n01491361', 'n01494475',
                      'n01496331', 'n01498041', 'n01514668', 'n01514859', 'n01518878')
# ImageNet-1k class names 0..9, spelled as in mmpretrain's IMAGENET_CATEGORIES.
IMAGENET_TOY_CLASSES = (
    'tench, Tinca tinca', 'goldfish, Carassius auratus',
    'great white shark, white shark, man-eater, man-eating shark, Carcharodon carcharias',
    'tiger shark, Galeocerdo cuvieri', 'hammerhead, hammerhead shark',
    'electric ray, crampfish, numbfish, torpedo', 'stingray', 'cock', 'hen', 'ostrich, Struthio camelus')
IMAGENET_TOY_NUM_CLASSES = len(IMAGENET_TOY_WNIDS)

_IMAGENET_SIZE_RANGE = (64, 160)
_IMAGENET_SHAPES = ('disk', 'square', 'triangle', 'ring', 'cross')


def render_imagenet_image(rng, label):
    """One image of class ``label`` (0-based): a shape (``label % 5``) in a class hue.

    The hue is ``label / 10`` (+-0.03), the background a random low-saturation texture, the
    position, size, rotation and shading random: uint8 [H, W, 3].
    """
    if not 0 <= label < IMAGENET_TOY_NUM_CLASSES:
        raise ValueError(f'label must be in [0, {IMAGENET_TOY_NUM_CLASSES}), got {label}')
    width, height = (int(v) for v in rng.integers(_IMAGENET_SIZE_RANGE[0], _IMAGENET_SIZE_RANGE[1] + 1, 2))
    image = random_background(rng, height, width)
    image = image * 0.5 + image.mean(-1, keepdims=True) * 0.5         # desaturate the background
    size = rng.uniform(0.2, 0.4) * min(width, height)
    cx, cy = rng.uniform(0.35, 0.65) * width, rng.uniform(0.35, 0.65) * height
    angle = rng.uniform(0, 2 * math.pi)
    kind = _IMAGENET_SHAPES[label % len(_IMAGENET_SHAPES)]

    def rotated(points):
        c, s = math.cos(angle), math.sin(angle)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in points]

    if kind == 'disk':
        shapes = [('ellipse', [cx - size, cy - size, cx + size, cy + size])]
    elif kind == 'square':
        shapes = [('polygon', rotated([(-size, -size), (size, -size), (size, size), (-size, size)]))]
    elif kind == 'triangle':
        shapes = [('polygon', rotated([(size * math.cos(t), size * math.sin(t))
                                       for t in (0, 2 * math.pi / 3, 4 * math.pi / 3)]))]
    elif kind == 'ring':
        shapes = [('ellipse', [cx - size, cy - size, cx + size, cy + size])]
    else:
        arm = size * 0.35
        shapes = [('polygon', rotated([(-size, -arm), (size, -arm), (size, arm), (-size, arm)])),
                  ('polygon', rotated([(-arm, -size), (arm, -size), (arm, size), (-arm, size)]))]
    mask = draw_mask(width, height, shapes)
    if kind == 'ring':
        hole = 0.55 * size
        mask &= ~draw_mask(width, height, [('ellipse', [cx - hole, cy - hole, cx + hole, cy + hole])])
    hue = (label / IMAGENET_TOY_NUM_CLASSES + rng.uniform(-0.03, 0.03)) % 1.0
    rgb = colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 1.0), rng.uniform(0.55, 1.0))
    colour = np.array(rgb, np.float32) * 255
    shading = ramp(height, width, rng.uniform(0, 2 * math.pi))
    fill = blend(shading, colour, colour * 0.7)
    image[mask] = fill[mask]
    return to_uint8(add_noise(rng, image, rng.uniform(2, 8)))


def make_toy_imagenet(out_dir, num_train=TOY_DEFAULT_COUNTS['imagenet'][0],
                      num_val=TOY_DEFAULT_COUNTS['imagenet'][1], seed=0) -> dict:
    """Write the ImageNet-layout set into ``out_dir``; ``num_train``/``num_val`` are per class."""
    check_counts(num_train, num_val)
    os.makedirs(osp.join(out_dir, 'meta'), exist_ok=True)
    counts = {}
    for split, num in (('train', num_train), ('val', num_val)):
        lines = []
        for label, wnid in enumerate(IMAGENET_TOY_WNIDS):
            class_dir = osp.join(out_dir, split, wnid)
            os.makedirs(class_dir, exist_ok=True)
            for k in range(num):
                index = label * num + k
                image = render_imagenet_image(toy_image_rng(seed, 'imagenet', split, index), label)
                name = f'{wnid}_{index:05d}.JPEG'
                save_jpeg(image, osp.join(class_dir, name))
                lines.append(f'{wnid}/{name} {label}\n')
        with open(osp.join(out_dir, 'meta', f'{split}.txt'), 'w') as f:
            f.writelines(lines)
        counts[split] = dict(images=len(lines))
    return counts
