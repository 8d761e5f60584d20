"""The toy ADE20K-layout semantic set: outdoor and indoor scenes whose classes keep their own colours
and textures, with raw ADE20K labels (read unchanged by ``mmseg.datasets.ADE20KDataset``).

    <root>/ade/ADEChallengeData2016/images/{training,validation}/ADE_{train,val}_%08d.jpg
    <root>/ade/ADEChallengeData2016/annotations/{training,validation}/ADE_{train,val}_%08d.png
"""
import math
import os
import os.path as osp

import numpy as np
from PIL import Image

from .common import (TOY_DEFAULT_COUNTS, add_noise, bbox, blend, check_counts, coordinates, draw_mask, jitter,
                     ramp, random_colour, save_jpeg, smooth_field, stripes, to_uint8, toy_image_rng)

# Raw ADE20K label values (0 = other / ignored, k = ADE class k - 1 after reduce_zero_label).
ADE_TOY_RAW_LABELS = {
    1: 'wall', 2: 'building', 3: 'sky', 4: 'floor', 5: 'tree', 6: 'ceiling', 7: 'road',
    9: 'windowpane', 10: 'grass', 13: 'person', 15: 'door', 16: 'table', 17: 'mountain', 21: 'car',
}
ADE_TOY_CLASSES = tuple(ADE_TOY_RAW_LABELS.values())
_ADE_SIZE_RANGE = (256, 512)
_ADE_BASE_COLOURS = {
    1: (200, 190, 170), 2: (130, 120, 115), 3: (110, 160, 225), 4: (150, 100, 60),
    5: (45, 95, 40), 6: (228, 226, 220), 7: (95, 95, 100), 9: (150, 190, 215), 10: (75, 145, 55),
    15: (120, 75, 40), 16: (140, 95, 55), 17: (105, 110, 130),
}



def _random_fill(rng, height, width, patterned=True) -> np.ndarray:
    """A random fill: flat, gradient or (if ``patterned``) striped colour."""
    colour = random_colour(rng)
    kind = rng.integers(3 if patterned else 2)
    if kind == 0:
        image = np.broadcast_to(colour, (height, width, 3)).astype(np.float32)
    elif kind == 1:
        image = blend(ramp(height, width, rng.uniform(0, 2 * math.pi)), colour, colour * 0.55)
    else:
        image = blend(stripes(height, width, rng.uniform(4, 16), rng.uniform(0, math.pi)),
                       colour, jitter(rng, colour, 70))
    return add_noise(rng, image, rng.uniform(1, 6))


def _ade_texture(rng, label, height, width) -> np.ndarray:
    """Class-dependent appearance [H, W, 3]: the class colour (jittered) and its own pattern."""
    base = jitter(rng, _ADE_BASE_COLOURS[label], 25)
    if label == 3:      # sky: lighter towards the horizon, soft clouds
        image = blend(ramp(height, width, math.pi / 2), base * 0.8, np.minimum(base * 1.35, 255))
        clouds = np.clip(smooth_field(rng, height, width, 8) * 2.2 - 1.3, 0, 1)[..., None]
        image = image + clouds * (240 - image)
        sigma = 2
    elif label == 2:    # building: facade with a grid of dark windows
        period_x, period_y = rng.uniform(10, 24, 2)
        ys, xs = coordinates(height, width)
        windows = ((xs % period_x) < 0.55 * period_x) & ((ys % period_y) < 0.5 * period_y)
        image = blend(windows.astype(np.float32), base, base * 0.35)
        sigma = 5
    elif label in (4, 16):  # floor / table: wood grain
        grain = stripes(height, width, rng.uniform(5, 14), rng.uniform(-0.15, 0.15) + math.pi / 2)
        image = blend(grain * smooth_field(rng, height, width, 10), base, base * 0.7)
        sigma = 4
    elif label in (5, 10):  # tree / grass: blotchy foliage
        blotches = smooth_field(rng, height, width, max(8, max(height, width) // 6))
        image = blend(blotches, base * 0.6, np.minimum(base * 1.5, 255))
        sigma = 14
    elif label == 7:    # road: grey asphalt grain
        image = np.broadcast_to(base, (height, width, 3)).astype(np.float32)
        sigma = 12
    elif label == 9:    # windowpane: reflections
        image = blend(ramp(height, width, rng.uniform(0, math.pi)), base, np.minimum(base * 1.3, 255))
        sigma = 3
    elif label == 15:   # door: vertical panels
        panels = stripes(height, width, rng.uniform(8, 20), 0.0, sharp=True)
        image = blend(panels, base, base * 0.8)
        sigma = 4
    elif label == 17:   # mountain: rock shading
        image = blend(smooth_field(rng, height, width, 12), base * 0.7, np.minimum(base * 1.3, 255))
        sigma = 6
    else:               # wall, ceiling and the rest: nearly flat
        image = np.broadcast_to(base, (height, width, 3)).astype(np.float32)
        image = image + (smooth_field(rng, height, width, 4)[..., None] - 0.5) * 20
        sigma = 3
    return add_noise(rng, image, sigma)


def _flat_texture(rng, colour, sigma):
    """A texture callable: ``colour`` [3] plus Gaussian noise of ``sigma``."""
    return lambda height, width: add_noise(
        rng, np.broadcast_to(np.asarray(colour, np.float32), (height, width, 3)), sigma)


class _SemanticCanvas:
    """An image [H, W, 3] and its raw ADE label map [H, W], painted region by region."""

    def __init__(self, width, height):
        self.width, self.height = width, height
        self.image = np.zeros((height, width, 3), np.float32)
        self.label = np.zeros((height, width), np.uint8)

    def paint(self, rng, label, shapes, texture=None) -> None:
        """Fill the union of ``shapes`` (see :func:`_draw_mask`) with ``label``.

        ``texture(height, width) -> [height, width, 3]`` colours the region's bounding box; by
        default it is the class texture :func:`_ade_texture`.
        """
        mask = draw_mask(self.width, self.height, shapes)
        box = bbox(mask)
        if box is None:
            return
        x0, y0, x1, y1 = box
        crop = mask[y0:y1, x0:x1]
        if texture is None:
            pixels = _ade_texture(rng, label, y1 - y0, x1 - x0)
        else:
            pixels = texture(y1 - y0, x1 - x0)
        self.image[y0:y1, x0:x1][crop] = pixels[crop]
        self.label[y0:y1, x0:x1][crop] = label

    def paint_other(self, rng, shapes) -> None:
        """Clutter labelled 0 ('other', ignored by mmseg), in a random colour and pattern."""
        self.paint(rng, 0, shapes, texture=lambda height, width: _random_fill(rng, height, width))


def _person_shapes(rng, foot_x, foot_y, height) -> list:
    """A standing person: head, torso and two legs, ``height`` pixels tall."""
    head = height * 0.13
    shoulder = height * rng.uniform(0.12, 0.16)
    top = foot_y - height
    legs_top = foot_y - height * 0.48
    stride = height * rng.uniform(0.02, 0.1)
    leg = height * 0.06
    return [
        ('ellipse', [foot_x - head / 2, top, foot_x + head / 2, top + head]),
        ('polygon', [(foot_x - shoulder, top + head * 1.1), (foot_x + shoulder, top + head * 1.1),
                     (foot_x + shoulder * 0.8, legs_top), (foot_x - shoulder * 0.8, legs_top)]),
        ('polygon', [(foot_x - shoulder * 0.7, legs_top), (foot_x - shoulder * 0.7 + 2 * leg, legs_top),
                     (foot_x - stride + leg, foot_y), (foot_x - stride - leg, foot_y)]),
        ('polygon', [(foot_x + shoulder * 0.7 - 2 * leg, legs_top), (foot_x + shoulder * 0.7, legs_top),
                     (foot_x + stride + leg, foot_y), (foot_x + stride - leg, foot_y)]),
    ]


def _paint_person(rng, canvas, foot_x, foot_y, height) -> None:
    """Random clothes with a skin-coloured head (the top 13 % of the figure)."""
    skin = jitter(rng, (205, 160, 130), 30)

    def texture(box_height, box_width):
        clothes = _random_fill(rng, box_height, box_width)
        head_rows = max(0, int(round(height * 0.13)) - max(0, int(math.ceil(height - foot_y))))
        clothes[:head_rows] = skin
        return add_noise(rng, clothes, 3)

    canvas.paint(rng, 13, _person_shapes(rng, foot_x, foot_y, height), texture=texture)


def _paint_tree(rng, canvas, foot_x, foot_y, height) -> None:
    """A brown trunk under two to four foliage blobs, all labelled tree."""
    trunk_w = height * 0.07
    trunk = ('rectangle', [foot_x - trunk_w, foot_y - height * 0.45, foot_x + trunk_w, foot_y])
    canvas.paint(rng, 5, [trunk], texture=_flat_texture(rng, jitter(rng, (90, 60, 30), 15), 8))
    blobs = []
    for _ in range(int(rng.integers(2, 5))):
        r = height * rng.uniform(0.18, 0.3)
        cx = foot_x + rng.uniform(-0.2, 0.2) * height
        cy = foot_y - height * rng.uniform(0.55, 0.8)
        blobs.append(('ellipse', [cx - r, cy - r, cx + r, cy + r]))
    canvas.paint(rng, 5, blobs)


def _paint_car(rng, canvas, centre_x, bottom_y, length) -> None:
    """Body and cabin in a saturated colour, two dark wheels, all labelled car."""
    h = length * 0.3
    xs = [centre_x + f * length for f in (-0.5, -0.3, -0.18, 0.2, 0.3, 0.32, 0.5)]
    body = [('rectangle', [xs[0], bottom_y - h, xs[6], bottom_y - h * 0.25]),
            ('polygon', [(xs[1], bottom_y - h), (xs[2], bottom_y - h * 1.6),
                         (xs[3], bottom_y - h * 1.6), (xs[5], bottom_y - h)])]
    r = h * 0.32
    wheels = [('ellipse', [x - r, bottom_y - 2 * r, x + r, bottom_y])
              for x in (xs[1], xs[4])]
    colour = random_colour(rng, saturation=(0.6, 1.0), value=(0.4, 1.0))
    canvas.paint(rng, 21, body, texture=_flat_texture(rng, colour, 4))
    canvas.paint(rng, 21, wheels, texture=_flat_texture(rng, (25, 25, 25), 4))


def _paint_outdoor(rng, canvas) -> None:
    """Sky, optional mountains and buildings on the horizon, grass with a road, trees, cars, people."""
    w, h = canvas.width, canvas.height
    horizon = rng.uniform(0.35, 0.6) * h
    canvas.paint(rng, 3, [('rectangle', [0, 0, w, horizon])])
    if rng.random() < 0.5:
        xs = np.linspace(-0.1 * w, 1.1 * w, int(rng.integers(4, 9)))
        peaks = horizon - rng.uniform(0.05, 0.3, len(xs)) * h
        ridge = [(-1, horizon + 1)] + list(zip(xs, peaks)) + [(w + 1, horizon + 1)]
        canvas.paint(rng, 17, [('polygon', ridge)])
    for _ in range(int(rng.integers(0, 5))):
        bx = rng.uniform(-0.1, 0.9) * w
        bw = rng.uniform(0.08, 0.3) * w
        top = horizon - rng.uniform(0.1, 0.45) * h
        canvas.paint(rng, 2, [('rectangle', [bx, top, bx + bw, horizon + 2])])
    canvas.paint(rng, 10, [('rectangle', [0, horizon, w, h])])
    vanish_x = rng.uniform(0.3, 0.7) * w
    has_road = rng.random() < 0.8
    if has_road:
        half_bottom = rng.uniform(0.25, 0.6) * w
        bottom_x = vanish_x + rng.uniform(-0.2, 0.2) * w
        road = [(vanish_x - 0.02 * w, horizon), (vanish_x + 0.02 * w, horizon),
                (bottom_x + half_bottom, h), (bottom_x - half_bottom, h)]
        canvas.paint(rng, 7, [('polygon', road)])

        def lane(t, side):
            """A point on the road's centre line at depth t (0 horizon, 1 bottom), moved sideways."""
            return (vanish_x + (bottom_x - vanish_x) * t + side * 0.004 * w * (1 + 4 * t),
                    horizon + (h - horizon) * t)

        marks = [('polygon', [lane(t, -1), lane(t + 0.07, -1), lane(t + 0.07, 1), lane(t, 1)])
                 for t in np.arange(0.05, 1.0, 0.15)]
        canvas.paint(rng, 7, marks, texture=_flat_texture(rng, (235, 235, 230), 5))

    objects = []   # (foot_y, kind, foot_x): painted far to near
    for _ in range(int(rng.integers(0, 5))):
        objects.append((rng.uniform(horizon + 0.05 * h, h), 'tree', rng.uniform(0, w)))
    if has_road:
        for _ in range(int(rng.integers(0, 3))):
            t = rng.uniform(0.2, 0.9)
            objects.append((horizon + (h - horizon) * t, 'car',
                            vanish_x + (bottom_x - vanish_x) * t + rng.uniform(-0.5, 0.5) * half_bottom * t))
    for _ in range(int(rng.integers(0, 4))):
        objects.append((rng.uniform(horizon + 0.05 * h, h), 'person', rng.uniform(0.05, 0.95) * w))
    for _ in range(int(rng.integers(1, 3))):
        objects.append((rng.uniform(horizon, h), 'other', rng.uniform(0, w)))
    for foot_y, kind, foot_x in sorted(objects, key=lambda o: o[0]):
        depth = (foot_y - horizon) / max(h - horizon, 1.0)       # 0 at the horizon, 1 at the bottom
        if kind == 'tree':
            _paint_tree(rng, canvas, foot_x, foot_y, (0.25 + 0.6 * depth) * h)
        elif kind == 'car':
            _paint_car(rng, canvas, foot_x, foot_y, (0.1 + 0.35 * depth) * w)
        elif kind == 'person':
            _paint_person(rng, canvas, foot_x, foot_y, (0.12 + 0.55 * depth) * h)
        else:   # a pole with a sign
            pole_h = (0.15 + 0.4 * depth) * h
            canvas.paint_other(rng, [('rectangle', [foot_x - 2, foot_y - pole_h, foot_x + 2, foot_y]),
                                     ('rectangle', [foot_x - pole_h * 0.15, foot_y - pole_h,
                                                    foot_x + pole_h * 0.15, foot_y - pole_h * 0.75])])


def _paint_indoor(rng, canvas) -> None:
    """A room in one-point perspective: ceiling, walls, floor, door, window, table, people."""
    w, h = canvas.width, canvas.height
    bx0, bx1 = rng.uniform(0.15, 0.4) * w, rng.uniform(0.6, 0.85) * w
    by0, by1 = rng.uniform(0.12, 0.35) * h, rng.uniform(0.55, 0.75) * h
    has_ceiling = rng.random() < 0.75
    canvas.paint(rng, 6 if has_ceiling else 1, [('polygon', [(0, 0), (w, 0), (bx1, by0), (bx0, by0)])])
    canvas.paint(rng, 1, [('polygon', [(0, 0), (bx0, by0), (bx0, by1), (0, h)])])
    canvas.paint(rng, 1, [('polygon', [(w, 0), (bx1, by0), (bx1, by1), (w, h)])])
    canvas.paint(rng, 1, [('rectangle', [bx0, by0, bx1, by1])])
    canvas.paint(rng, 4, [('polygon', [(0, h), (bx0, by1), (bx1, by1), (w, h)])])
    if rng.random() < 0.5:   # skirting board, unlabelled
        canvas.paint_other(rng, [('rectangle', [bx0, by1 - 0.02 * h, bx1, by1])])
    back_w, back_h = bx1 - bx0, by1 - by0
    if rng.random() < 0.7:
        dx = bx0 + rng.uniform(0.05, 0.6) * back_w
        dw, dh = rng.uniform(0.15, 0.3) * back_w, rng.uniform(0.6, 0.85) * back_h
        canvas.paint(rng, 15, [('rectangle', [dx, by1 - dh, dx + dw, by1])])
    if rng.random() < 0.7:
        wx = bx0 + rng.uniform(0.05, 0.6) * back_w
        ww, wh = rng.uniform(0.2, 0.35) * back_w, rng.uniform(0.25, 0.4) * back_h
        wy = by0 + rng.uniform(0.1, 0.3) * back_h
        canvas.paint(rng, 9, [('rectangle', [wx, wy, wx + ww, wy + wh])])
        bar = max(1.0, 0.04 * ww)
        canvas.paint(rng, 9, [('rectangle', [wx + ww / 2 - bar, wy, wx + ww / 2 + bar, wy + wh]),
                              ('rectangle', [wx, wy + wh / 2 - bar, wx + ww, wy + wh / 2 + bar])],
                     texture=_flat_texture(rng, (240, 240, 240), 3))
    objects = []
    if rng.random() < 0.6:
        objects.append((rng.uniform(by1 + 0.1 * (h - by1), h - 0.05 * h), 'table', rng.uniform(0.2, 0.8) * w))
    for _ in range(int(rng.integers(0, 3))):
        objects.append((rng.uniform(by1 + 0.05 * (h - by1), h), 'person', rng.uniform(0.1, 0.9) * w))
    if rng.random() < 0.6:
        objects.append((rng.uniform(by1, h), 'other', rng.uniform(0.05, 0.95) * w))
    for foot_y, kind, foot_x in sorted(objects, key=lambda o: o[0]):
        depth = (foot_y - by1) / max(h - by1, 1.0)
        if kind == 'table':
            tw, th = (0.25 + 0.3 * depth) * w, (0.12 + 0.15 * depth) * h
            leg = max(2.0, 0.03 * tw)
            left, right, top, under = foot_x - tw / 2, foot_x + tw / 2, foot_y - th, foot_y - th * 0.8
            canvas.paint(rng, 16, [('polygon', [(left, top), (right, top),
                                                (right + 0.05 * tw, under), (left - 0.05 * tw, under)]),
                                   ('rectangle', [left, under, left + leg, foot_y]),
                                   ('rectangle', [right - leg, under, right, foot_y])])
        elif kind == 'person':
            _paint_person(rng, canvas, foot_x, foot_y, (0.3 + 0.5 * depth) * h)
        else:   # a box on the floor
            size = (0.05 + 0.15 * depth) * w
            box = [foot_x - size / 2, foot_y - size, foot_x + size / 2, foot_y]
            canvas.paint_other(rng, [('rectangle', box)])


def render_ade_scene(rng):
    """Draw one ADE-layout image and its raw label map: ``(image uint8 [H, W, 3], label uint8 [H, W])``.

    Outdoor (sky, mountain, building, grass, road, tree, car, person) or indoor (ceiling, wall,
    floor, door, windowpane, table, person) scenes; every class keeps its own colour range and
    texture. Unlabelled clutter (poles, boxes, skirting boards) carries the raw value 0.
    """
    width, height = (int(v) for v in rng.integers(_ADE_SIZE_RANGE[0], _ADE_SIZE_RANGE[1] + 1, 2))
    canvas = _SemanticCanvas(width, height)
    if rng.random() < 0.6:
        _paint_outdoor(rng, canvas)
    else:
        _paint_indoor(rng, canvas)
    image = add_noise(rng, canvas.image, rng.uniform(1, 4))
    return to_uint8(image), canvas.label


def make_toy_ade(out_dir, num_train=TOY_DEFAULT_COUNTS['ade'][0],
                 num_val=TOY_DEFAULT_COUNTS['ade'][1], seed=0) -> dict:
    """Write the ADE20K-layout set into ``out_dir``/ADEChallengeData2016; returns image counts."""
    check_counts(num_train, num_val)
    root = osp.join(out_dir, 'ADEChallengeData2016')
    counts = {}
    for split, folder, num in (('train', 'training', num_train), ('val', 'validation', num_val)):
        image_dir = osp.join(root, 'images', folder)
        label_dir = osp.join(root, 'annotations', folder)
        os.makedirs(image_dir, exist_ok=True)
        os.makedirs(label_dir, exist_ok=True)
        for index in range(num):
            image, label = render_ade_scene(toy_image_rng(seed, 'ade', split, index))
            stem = f'ADE_{split}_{index + 1:08d}'
            save_jpeg(image, osp.join(image_dir, stem + '.jpg'))
            Image.fromarray(label, mode='L').save(osp.join(label_dir, stem + '.png'))
        counts[split] = dict(images=num)
    return counts
