"""Small synthetic datasets in the standard COCO / ADE20K / ImageNet layouts (the embedded default).

Everything is a pure function of a seed: image ``i`` of split ``s`` of set ``k`` is drawn from its own
generator ``numpy.random.default_rng([seed, k, s, i])`` (:func:`toy_image_rng`), so a set can be
regenerated, or one image re-rendered with its masks, without the others. Only numpy and Pillow
are needed; stock ``mmdet.datasets.CocoDataset``, ``mmseg.datasets.ADE20KDataset`` and
``mmpretrain.datasets.ImageNet`` read the output unchanged.

Layouts (``<root>`` is :data:`TOY_DATA_ROOT` unless told otherwise)::

    <root>/coco/{train2017,val2017}/*.jpg
    <root>/coco/annotations/instances_{train,val}2017.json
    <root>/ade/ADEChallengeData2016/images/{training,validation}/ADE_{train,val}_%08d.jpg
    <root>/ade/ADEChallengeData2016/annotations/{training,validation}/ADE_{train,val}_%08d.png
    <root>/imagenet/{train,val}/<wnid>/<wnid>_%05d.JPEG
    <root>/imagenet/meta/{train,val}.txt          lines "<wnid>/<name>.JPEG <label>"

Each set root also holds ``toy_data.json``, the arguments that produced it (see :func:`make_all`).
"""
import colorsys
import json
import math
import os
import os.path as osp
import shutil
import time

import numpy as np
from PIL import Image, ImageDraw

TOY_DATA_ROOT = 'data/toy'
TOY_DATA_VERSION = 3
TOY_SETS = ('coco', 'ade', 'imagenet')
STAMP_FILE = 'toy_data.json'
JPEG_QUALITY = 90

COCO_TOY_CLASSES = ('circle', 'rectangle', 'triangle')
# Each toy-COCO class is drawn in its own hue band (red, green, blue; +-0.05) on a desaturated
# background, so that class evidence is both shape and colour: a detector fine-tuned for a few
# hundred CPU iterations learns it, and the hue-coded toy-ImageNet pretraining is relevant to it.
COCO_TOY_HUES = (0.0, 1 / 3, 2 / 3)

# Raw ADE20K label values (0 = other / ignored, k = ADE class k - 1 after reduce_zero_label).
ADE_TOY_RAW_LABELS = {
    1: 'wall', 2: 'building', 3: 'sky', 4: 'floor', 5: 'tree', 6: 'ceiling', 7: 'road',
    9: 'windowpane', 10: 'grass', 13: 'person', 15: 'door', 16: 'table', 17: 'mountain', 21: 'car',
}
ADE_TOY_CLASSES = tuple(ADE_TOY_RAW_LABELS.values())

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

# Default image counts per split; for 'imagenet' they are per class.
TOY_DEFAULT_COUNTS = {'coco': (240, 60), 'ade': (160, 40), 'imagenet': (30, 10)}

_SET_KEYS = {'coco': 1, 'ade': 2, 'imagenet': 3}
_SPLIT_KEYS = {'train': 0, 'val': 1}


def toy_image_rng(seed: int, set_name: str, split: str, index: int) -> np.random.Generator:
    """The generator that draws image ``index`` of ``split`` ('train'|'val') of ``set_name``."""
    return np.random.default_rng([seed, _SET_KEYS[set_name], _SPLIT_KEYS[split], index])


# --------------------------------------------------------------------------------------------
# Textures: float32 arrays in [0, 255], shape [H, W] (fields) or [H, W, 3] (colours)
# --------------------------------------------------------------------------------------------

def _random_colour(rng, saturation=(0.3, 1.0), value=(0.25, 1.0)) -> np.ndarray:
    hue = rng.random()
    rgb = colorsys.hsv_to_rgb(hue, rng.uniform(*saturation), rng.uniform(*value))
    return np.array(rgb, np.float32) * 255


def _jitter(rng, colour, amount) -> np.ndarray:
    return np.clip(np.asarray(colour, np.float32) + rng.uniform(-amount, amount, 3), 0, 255)


def _smooth_field(rng, height, width, cells) -> np.ndarray:
    """Low-frequency noise in [0, 1]: a ``cells``-per-side random grid upsampled bicubically."""
    cells_y = max(2, round(cells * height / max(height, width)))
    cells_x = max(2, round(cells * width / max(height, width)))
    grid = Image.fromarray(rng.random((cells_y, cells_x)).astype(np.float32), mode='F')
    return np.clip(np.asarray(grid.resize((width, height), Image.BICUBIC)), 0, 1)


def _coordinates(height, width):
    return np.mgrid[0:height, 0:width].astype(np.float32)


def _ramp(height, width, angle) -> np.ndarray:
    """Linear ramp in [0, 1] along direction ``angle`` (radians)."""
    ys, xs = _coordinates(height, width)
    t = xs * math.cos(angle) + ys * math.sin(angle)
    return (t - t.min()) / max(float(t.max() - t.min()), 1e-6)


def _stripes(height, width, period, angle, sharp=False) -> np.ndarray:
    """Periodic stripes in [0, 1] with ``period`` pixels across direction ``angle``."""
    ys, xs = _coordinates(height, width)
    wave = 0.5 + 0.5 * np.sin(2 * math.pi * (xs * math.cos(angle) + ys * math.sin(angle)) / period)
    return (wave > 0.5).astype(np.float32) if sharp else wave


def _blend(field, colour_a, colour_b) -> np.ndarray:
    """``colour_a`` where ``field`` is 0, ``colour_b`` where it is 1: [H, W] -> [H, W, 3]."""
    return colour_a + field[..., None] * (colour_b - colour_a)


def _add_noise(rng, image, sigma) -> np.ndarray:
    return image + rng.normal(0.0, sigma, image.shape).astype(np.float32)


def _random_background(rng, height, width, patterned=True) -> np.ndarray:
    """Gradient, smooth blobs and, if ``patterned``, stripes or checkerboard in random colours,
    plus a little noise."""
    colour_a = _random_colour(rng)
    colour_b = colour_a + rng.uniform(0.3, 1.0) * (_random_colour(rng) - colour_a)
    kind = rng.integers(4) if patterned else (0, 2)[rng.integers(2)]
    if kind == 0:
        field = _ramp(height, width, rng.uniform(0, 2 * math.pi))
    elif kind == 1:
        field = _stripes(height, width, rng.uniform(6, 48), rng.uniform(0, math.pi), rng.random() < 0.5)
    elif kind == 2:
        field = _smooth_field(rng, height, width, int(rng.integers(3, 16)))
    else:
        cell = int(rng.integers(12, 64))
        ys, xs = _coordinates(height, width)
        field = ((xs // cell + ys // cell) % 2).astype(np.float32)
    image = _blend(field, colour_a, colour_b)
    image += (_smooth_field(rng, height, width, 6)[..., None] - 0.5) * rng.uniform(0, 60)
    return _add_noise(rng, image, rng.uniform(2, 10))


def _random_fill(rng, height, width, patterned=True) -> np.ndarray:
    """A random fill: flat, gradient or (if ``patterned``) striped colour."""
    colour = _random_colour(rng)
    kind = rng.integers(3 if patterned else 2)
    if kind == 0:
        image = np.broadcast_to(colour, (height, width, 3)).astype(np.float32)
    elif kind == 1:
        image = _blend(_ramp(height, width, rng.uniform(0, 2 * math.pi)), colour, colour * 0.55)
    else:
        image = _blend(_stripes(height, width, rng.uniform(4, 16), rng.uniform(0, math.pi)),
                       colour, _jitter(rng, colour, 70))
    return _add_noise(rng, image, rng.uniform(1, 6))


def _to_uint8(image) -> np.ndarray:
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def _save_jpeg(image, path) -> None:
    Image.fromarray(_to_uint8(image), mode='RGB').save(path, quality=JPEG_QUALITY)


# --------------------------------------------------------------------------------------------
# Binary masks drawn with Pillow and turned back into COCO polygons
# --------------------------------------------------------------------------------------------

def _draw_mask(width, height, shapes) -> np.ndarray:
    """Union of ``shapes``: ('polygon', [(x, y), ...]) | ('ellipse' | 'rectangle', [x0, y0, x1, y1])."""
    canvas = Image.new('L', (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    for kind, geometry in shapes:
        if kind == 'polygon':
            draw.polygon([(float(x), float(y)) for x, y in geometry], fill=1)
        elif kind == 'ellipse':
            draw.ellipse([float(v) for v in geometry], fill=1)
        elif kind == 'rectangle':
            draw.rectangle([float(v) for v in geometry], fill=1)
        else:
            raise ValueError(f"shape kind must be 'polygon', 'ellipse' or 'rectangle', got {kind!r}")
    return np.asarray(canvas, dtype=bool)


def _bbox(mask):
    """(x0, y0, x1, y1) with exclusive x1/y1, or None for an empty mask."""
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    if rows.size == 0:
        return None
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def _binary_open(mask) -> np.ndarray:
    """3x3 opening (erosion then dilation): removes parts thinner than 3 pixels."""
    padded = np.pad(mask, 2)
    h, w = padded.shape
    eroded = np.ones((h - 2, w - 2), bool)
    for dy in range(3):
        for dx in range(3):
            eroded &= padded[dy:dy + h - 2, dx:dx + w - 2]
    eroded = np.pad(eroded, 1)
    dilated = np.zeros((h - 2, w - 2), bool)
    for dy in range(3):
        for dx in range(3):
            dilated |= eroded[dy:dy + h - 2, dx:dx + w - 2]
    return dilated[1:-1, 1:-1] & mask


def _trace_boundary_loops(mask) -> list:
    """Closed boundary loops of ``mask`` [H, W] along pixel edges, as corner lists [N, 2] (x, y).

    Coordinates are pixel corners (pixel (r, c) spans [c, c+1] x [r, r+1]). Loops keep the
    foreground on their right (clockwise on screen), so outer boundaries have positive and holes
    negative shoelace area. At a vertex shared by two diagonal foreground pixels the walk turns
    right, i.e. the foreground is 4-connected and the background 8-connected.
    """
    h, w = mask.shape
    p = np.zeros((h + 2, w + 2), bool)
    p[1:-1, 1:-1] = mask
    stride = w + 3                                    # vertex grid is (h + 3) x (w + 3)
    bits = np.zeros((h + 3, w + 3), np.uint8)         # bit d: an edge leaves this vertex in dir d
    above, below = p[:-1, :], p[1:, :]                # horizontal edges on vertex rows 1..h+1
    bits[1:h + 2, 0:w + 2] |= (below & ~above).astype(np.uint8) * 1   # E: top of a pixel
    bits[1:h + 2, 1:w + 3] |= (above & ~below).astype(np.uint8) * 4   # W: bottom of a pixel
    left, right = p[:, :-1], p[:, 1:]                 # vertical edges on vertex columns 1..w+1
    bits[1:h + 3, 1:w + 2] |= (right & ~left).astype(np.uint8) * 8    # N: left side of a pixel
    bits[0:h + 2, 1:w + 2] |= (left & ~right).astype(np.uint8) * 2    # S: right side of a pixel

    steps = (1, stride, -1, -stride)                  # E, S, W, N in flat vertex indices
    lookup = bits.ravel().tolist()
    remaining = bytearray(bits.ravel().tobytes())
    loops = []
    for start in np.flatnonzero(bits).tolist():
        while remaining[start]:
            start_dir = (remaining[start] & -remaining[start]).bit_length() - 1
            vertex, direction, corners = start, start_dir, []
            while True:
                remaining[vertex] &= ~(1 << direction)
                vertex += steps[direction]
                out = lookup[vertex]
                turn_right = (direction + 1) & 3
                if out >> turn_right & 1:
                    new_direction = turn_right
                elif out >> direction & 1:
                    new_direction = direction
                else:
                    new_direction = (direction + 3) & 3
                if new_direction != direction:
                    corners.append(vertex)
                direction = new_direction
                if vertex == start and direction == start_dir:
                    break
            corners = np.array(corners, np.int64)
            loops.append(np.stack([corners % stride - 1, corners // stride - 1], axis=1))
    return loops


def _signed_area(points) -> float:
    x, y = points[:, 0].astype(np.float64), points[:, 1].astype(np.float64)
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))


def _cut_corners(corners) -> np.ndarray:
    """Replace each corner of a pixel-edge loop [N, 2] by the midpoints of its two unit edges.

    The result [2N, 2] is the marching-squares contour: staircases become straight lines, square
    corners lose a half-pixel triangle.
    """
    corners = corners.astype(np.float64)
    to_prev = np.roll(corners, 1, 0) - corners
    to_next = np.roll(corners, -1, 0) - corners
    before = corners + 0.5 * to_prev / np.abs(to_prev).sum(1, keepdims=True)
    after = corners + 0.5 * to_next / np.abs(to_next).sum(1, keepdims=True)
    return np.stack([before, after], 1).reshape(-1, 2)


def _simplify_chain(points, tolerance) -> np.ndarray:
    """Douglas-Peucker on an open chain [N, 2]; returns a keep-mask of length N."""
    keep = np.zeros(len(points), bool)
    keep[[0, -1]] = True
    pts = points
    stack = [(0, len(points) - 1)]
    while stack:
        first, last = stack.pop()
        if last - first < 2:
            continue
        inner = pts[first + 1:last]
        a, b = pts[first], pts[last]
        ab = b - a
        norm = math.hypot(ab[0], ab[1])
        if norm == 0:
            dist = np.hypot(*(inner - a).T)
        else:
            dist = np.abs(ab[0] * (inner[:, 1] - a[1]) - ab[1] * (inner[:, 0] - a[0])) / norm
        worst = int(np.argmax(dist))
        if dist[worst] > tolerance:
            split = first + 1 + worst
            keep[split] = True
            stack += [(first, split), (split, last)]
    return keep


def _simplify_loop(points, tolerance) -> np.ndarray:
    """Douglas-Peucker on a closed loop [N, 2], split at its first point and the farthest one."""
    if len(points) <= 4:
        return points
    far = int(np.argmax(np.hypot(*(points - points[0]).T)))
    chain_a = points[:far + 1]
    chain_b = np.concatenate([points[far:], points[:1]])
    keep_a = _simplify_chain(chain_a, tolerance)
    keep_b = _simplify_chain(chain_b, tolerance)
    return np.concatenate([chain_a[keep_a], chain_b[keep_b][1:-1]])


def mask_to_polygons(mask, tolerance=0.75, min_area=4.0) -> list:
    """COCO polygons ``[[x0, y0, x1, y1, ...], ...]`` whose union is the binary ``mask`` [H, W].

    Each 4-connected component's boundary is traced along pixel edges, in pixel-corner
    coordinates (pixel (r, c) spans [c, c+1] x [r, r+1], the convention in which
    ``pycocotools.mask.frPyObjects`` rasterises integer polygons exactly), then turned into its
    marching-squares contour and simplified by Douglas-Peucker with ``tolerance`` pixels.
    COCO polygons cannot hold holes, so a region with a hole is cut at a column through the hole
    until no piece has one; the pieces share their cut edges. Polygons with fewer than three
    points or under ``min_area`` square pixels are dropped.
    """
    box = _bbox(mask)
    if box is None:
        return []
    x0, y0, x1, y1 = box
    pieces = [(np.ascontiguousarray(mask[y0:y1, x0:x1]), x0, y0)]
    polygons = []
    while pieces:
        piece, off_x, off_y = pieces.pop()
        loops = _trace_boundary_loops(piece)
        holes = [loop for loop in loops if _signed_area(loop) < 0]
        if holes:
            cut = (int(holes[0][:, 0].min()) + int(holes[0][:, 0].max())) // 2
            pieces.append((piece[:, cut:], off_x + cut, off_y))
            pieces.append((piece[:, :cut], off_x, off_y))
            continue
        for loop in loops:
            simplified = _simplify_loop(_cut_corners(loop), tolerance)
            if len(simplified) < 3 or _signed_area(simplified) < min_area:
                continue
            shifted = simplified + np.array([off_x, off_y])
            polygons.append([float(v) for v in shifted.ravel()])
    return polygons


# --------------------------------------------------------------------------------------------
# (a) COCO-format instance set
# --------------------------------------------------------------------------------------------

_COCO_SIZE_RANGE = (256, 320)
_COCO_MAX_SHAPES = 6
_MIN_VISIBLE_AREA = 100       # pixels; a less visible instance is not annotated
_MIN_VISIBLE_FRACTION = 0.25  # of the instance's full (in-image) area


def _shape_outline(rng, category, cx, cy, size) -> list:
    """Vertices of a 'circle' (radius ``size``), 'rectangle' or 'triangle' centred at (cx, cy)."""
    angle = rng.uniform(0, 2 * math.pi)
    if category == 'circle':
        n = max(16, int(2 * math.pi * size / 3))
        t = np.linspace(0, 2 * math.pi, n, endpoint=False)
        local = np.stack([size * np.cos(t), size * np.sin(t)], 1)
    elif category == 'rectangle':
        half_w, half_h = size, size * rng.uniform(0.35, 1.0)
        local = np.array([[-half_w, -half_h], [half_w, -half_h], [half_w, half_h], [-half_w, half_h]])
    elif category == 'triangle':
        t = np.array([0, 2 * math.pi / 3, 4 * math.pi / 3]) + rng.uniform(-0.35, 0.35, 3)
        radius = size * rng.uniform(0.75, 1.0, 3)
        local = np.stack([radius * np.cos(t), radius * np.sin(t)], 1)
    else:
        raise ValueError(f'category must be one of {COCO_TOY_CLASSES}, got {category!r}')
    rotation = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    return [(float(x) + cx, float(y) + cy) for x, y in local @ rotation.T]


def render_coco_scene(rng):
    """Draw one COCO toy image: a desaturated smooth background (gradient or blobs) and 1-6
    overlapping flat or shaded shapes, each in its class hue (:data:`COCO_TOY_HUES`).

    Returns ``(image, instances)``: ``image`` uint8 [H, W, 3] and, for each annotated shape
    (bottom to top), a dict with ``category_id`` (1-based in :data:`COCO_TOY_CLASSES`), ``mask``
    (bool [H, W], the visible part after later shapes are drawn over it, 3x3-opened when
    occluded) and ``full_area`` (pixels of the shape inside the image, occlusion ignored).
    Placements that would hide an earlier shape below the visibility limits are redrawn (a few
    tries); instances still below the limits are left unannotated.
    """
    width, height = (int(v) for v in rng.integers(_COCO_SIZE_RANGE[0], _COCO_SIZE_RANGE[1] + 1, 2))
    image = _random_background(rng, height, width, patterned=False)
    image = image * 0.3 + image.mean(-1, keepdims=True) * 0.7         # desaturate the background
    shapes = []   # (category_id, full mask, full area, visible mask), bottom to top
    for _ in range(int(rng.integers(1, _COCO_MAX_SHAPES + 1))):
        category_id = int(rng.integers(len(COCO_TOY_CLASSES))) + 1
        full = None
        for _attempt in range(6):
            size = math.exp(rng.uniform(math.log(12), math.log(0.4 * min(width, height))))
            cx, cy = rng.uniform(0.05, 0.95) * width, rng.uniform(0.05, 0.95) * height
            outline = _shape_outline(rng, COCO_TOY_CLASSES[category_id - 1], cx, cy, size)
            candidate = _draw_mask(width, height, [('polygon', outline)])
            if candidate.sum() < _MIN_VISIBLE_AREA:
                continue
            full = candidate
            if all(_is_visible_enough(visible & ~full, area) for _, _, area, visible in shapes):
                break
        if full is None:
            continue
        shapes = [(cid, f, area, visible & ~full) for cid, f, area, visible in shapes]
        shapes.append((category_id, full, int(full.sum()), full))
        x0, y0, x1, y1 = _bbox(full)
        fill = _class_fill(rng, category_id, y1 - y0, x1 - x0)
        crop = full[y0:y1, x0:x1]
        image[y0:y1, x0:x1][crop] = fill[crop]
    image = _add_noise(rng, image, rng.uniform(1, 5))

    instances = []
    for category_id, full, full_area, visible in shapes:
        if not np.array_equal(visible, full):
            visible = _binary_open(visible)
        if _is_visible_enough(visible, full_area):
            instances.append(dict(category_id=category_id, mask=visible, full_area=full_area))
    return _to_uint8(image), instances


def _class_fill(rng, category_id, height, width) -> np.ndarray:
    """A shape's fill in its class hue (:data:`COCO_TOY_HUES` +-0.05), flat or shaded: [h, w, 3]."""
    hue = (COCO_TOY_HUES[category_id - 1] + rng.uniform(-0.05, 0.05)) % 1.0
    colour = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 1.0), rng.uniform(0.5, 1.0)),
                      np.float32) * 255
    if rng.random() < 0.5:
        image = np.broadcast_to(colour, (height, width, 3)).astype(np.float32)
    else:
        image = _blend(_ramp(height, width, rng.uniform(0, 2 * math.pi)), colour, colour * 0.6)
    return _add_noise(rng, image, rng.uniform(1, 6))


def _is_visible_enough(visible, full_area) -> bool:
    area = int(visible.sum())
    return area >= _MIN_VISIBLE_AREA and area >= _MIN_VISIBLE_FRACTION * full_area


def coco_annotation(mask, category_id, image_id, annotation_id) -> dict:
    """A COCO instance annotation (polygons, visible bbox [x, y, w, h], pixel area) for ``mask``."""
    x0, y0, x1, y1 = _bbox(mask)
    return dict(id=annotation_id, image_id=image_id, category_id=category_id,
                segmentation=mask_to_polygons(mask), area=float(mask.sum()),
                bbox=[float(x0), float(y0), float(x1 - x0), float(y1 - y0)], iscrowd=0)


def make_toy_coco(out_dir, num_train=TOY_DEFAULT_COUNTS['coco'][0],
                  num_val=TOY_DEFAULT_COUNTS['coco'][1], seed=0) -> dict:
    """Write the COCO-format instance set into ``out_dir``; returns image/instance counts."""
    _check_counts(num_train, num_val)
    counts = {}
    categories = [dict(id=i + 1, name=name, supercategory='shape')
                  for i, name in enumerate(COCO_TOY_CLASSES)]
    os.makedirs(osp.join(out_dir, 'annotations'), exist_ok=True)
    for split, num in (('train', num_train), ('val', num_val)):
        image_dir = osp.join(out_dir, f'{split}2017')
        os.makedirs(image_dir, exist_ok=True)
        images, annotations = [], []
        for index in range(num):
            image, instances = render_coco_scene(toy_image_rng(seed, 'coco', split, index))
            image_id = index + 1
            file_name = f'{image_id:012d}.jpg'
            _save_jpeg(image, osp.join(image_dir, file_name))
            images.append(dict(id=image_id, file_name=file_name, width=image.shape[1],
                               height=image.shape[0], license=1))
            for instance in instances:
                annotations.append(coco_annotation(instance['mask'], instance['category_id'],
                                                   image_id, len(annotations) + 1))
        content = dict(
            info=dict(description='mmlinattn toy COCO-format instance set (synthetic shapes)',
                      version=str(TOY_DATA_VERSION), year=2017, contributor='mmlinattn',
                      url='', date_created='', seed=seed),
            licenses=[dict(id=1, name='synthetic, generated by mmlinattn', url='')],
            images=images, annotations=annotations, categories=categories)
        with open(osp.join(out_dir, 'annotations', f'instances_{split}2017.json'), 'w') as f:
            json.dump(content, f, separators=(',', ':'))
        counts[split] = dict(images=len(images), instances=len(annotations))
    return counts


# --------------------------------------------------------------------------------------------
# (b) ADE20K-layout semantic set
# --------------------------------------------------------------------------------------------

_ADE_SIZE_RANGE = (256, 512)
_ADE_BASE_COLOURS = {
    1: (200, 190, 170), 2: (130, 120, 115), 3: (110, 160, 225), 4: (150, 100, 60),
    5: (45, 95, 40), 6: (228, 226, 220), 7: (95, 95, 100), 9: (150, 190, 215), 10: (75, 145, 55),
    15: (120, 75, 40), 16: (140, 95, 55), 17: (105, 110, 130),
}


def _ade_texture(rng, label, height, width) -> np.ndarray:
    """Class-dependent appearance [H, W, 3]: the class colour (jittered) and its own pattern."""
    base = _jitter(rng, _ADE_BASE_COLOURS[label], 25)
    if label == 3:      # sky: lighter towards the horizon, soft clouds
        image = _blend(_ramp(height, width, math.pi / 2), base * 0.8, np.minimum(base * 1.35, 255))
        clouds = np.clip(_smooth_field(rng, height, width, 8) * 2.2 - 1.3, 0, 1)[..., None]
        image = image + clouds * (240 - image)
        sigma = 2
    elif label == 2:    # building: facade with a grid of dark windows
        period_x, period_y = rng.uniform(10, 24, 2)
        ys, xs = _coordinates(height, width)
        windows = ((xs % period_x) < 0.55 * period_x) & ((ys % period_y) < 0.5 * period_y)
        image = _blend(windows.astype(np.float32), base, base * 0.35)
        sigma = 5
    elif label in (4, 16):  # floor / table: wood grain
        grain = _stripes(height, width, rng.uniform(5, 14), rng.uniform(-0.15, 0.15) + math.pi / 2)
        image = _blend(grain * _smooth_field(rng, height, width, 10), base, base * 0.7)
        sigma = 4
    elif label in (5, 10):  # tree / grass: blotchy foliage
        blotches = _smooth_field(rng, height, width, max(8, max(height, width) // 6))
        image = _blend(blotches, base * 0.6, np.minimum(base * 1.5, 255))
        sigma = 14
    elif label == 7:    # road: grey asphalt grain
        image = np.broadcast_to(base, (height, width, 3)).astype(np.float32)
        sigma = 12
    elif label == 9:    # windowpane: reflections
        image = _blend(_ramp(height, width, rng.uniform(0, math.pi)), base, np.minimum(base * 1.3, 255))
        sigma = 3
    elif label == 15:   # door: vertical panels
        panels = _stripes(height, width, rng.uniform(8, 20), 0.0, sharp=True)
        image = _blend(panels, base, base * 0.8)
        sigma = 4
    elif label == 17:   # mountain: rock shading
        image = _blend(_smooth_field(rng, height, width, 12), base * 0.7, np.minimum(base * 1.3, 255))
        sigma = 6
    else:               # wall, ceiling and the rest: nearly flat
        image = np.broadcast_to(base, (height, width, 3)).astype(np.float32)
        image = image + (_smooth_field(rng, height, width, 4)[..., None] - 0.5) * 20
        sigma = 3
    return _add_noise(rng, image, sigma)


def _flat_texture(rng, colour, sigma):
    """A texture callable: ``colour`` [3] plus Gaussian noise of ``sigma``."""
    return lambda height, width: _add_noise(
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
        mask = _draw_mask(self.width, self.height, shapes)
        box = _bbox(mask)
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
    skin = _jitter(rng, (205, 160, 130), 30)

    def texture(box_height, box_width):
        clothes = _random_fill(rng, box_height, box_width)
        head_rows = max(0, int(round(height * 0.13)) - max(0, int(math.ceil(height - foot_y))))
        clothes[:head_rows] = skin
        return _add_noise(rng, clothes, 3)

    canvas.paint(rng, 13, _person_shapes(rng, foot_x, foot_y, height), texture=texture)


def _paint_tree(rng, canvas, foot_x, foot_y, height) -> None:
    """A brown trunk under two to four foliage blobs, all labelled tree."""
    trunk_w = height * 0.07
    trunk = ('rectangle', [foot_x - trunk_w, foot_y - height * 0.45, foot_x + trunk_w, foot_y])
    canvas.paint(rng, 5, [trunk], texture=_flat_texture(rng, _jitter(rng, (90, 60, 30), 15), 8))
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
    colour = _random_colour(rng, saturation=(0.6, 1.0), value=(0.4, 1.0))
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
    image = _add_noise(rng, canvas.image, rng.uniform(1, 4))
    return _to_uint8(image), canvas.label


def make_toy_ade(out_dir, num_train=TOY_DEFAULT_COUNTS['ade'][0],
                 num_val=TOY_DEFAULT_COUNTS['ade'][1], seed=0) -> dict:
    """Write the ADE20K-layout set into ``out_dir``/ADEChallengeData2016; returns image counts."""
    _check_counts(num_train, num_val)
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
            _save_jpeg(image, osp.join(image_dir, stem + '.jpg'))
            Image.fromarray(label, mode='L').save(osp.join(label_dir, stem + '.png'))
        counts[split] = dict(images=num)
    return counts


# --------------------------------------------------------------------------------------------
# (c) ImageNet-layout classification set
# --------------------------------------------------------------------------------------------

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
    image = _random_background(rng, height, width)
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
    mask = _draw_mask(width, height, shapes)
    if kind == 'ring':
        hole = 0.55 * size
        mask &= ~_draw_mask(width, height, [('ellipse', [cx - hole, cy - hole, cx + hole, cy + hole])])
    hue = (label / IMAGENET_TOY_NUM_CLASSES + rng.uniform(-0.03, 0.03)) % 1.0
    rgb = colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 1.0), rng.uniform(0.55, 1.0))
    colour = np.array(rgb, np.float32) * 255
    shading = _ramp(height, width, rng.uniform(0, 2 * math.pi))
    fill = _blend(shading, colour, colour * 0.7)
    image[mask] = fill[mask]
    return _to_uint8(_add_noise(rng, image, rng.uniform(2, 8)))


def make_toy_imagenet(out_dir, num_train=TOY_DEFAULT_COUNTS['imagenet'][0],
                      num_val=TOY_DEFAULT_COUNTS['imagenet'][1], seed=0) -> dict:
    """Write the ImageNet-layout set into ``out_dir``; ``num_train``/``num_val`` are per class."""
    _check_counts(num_train, num_val)
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
                _save_jpeg(image, osp.join(class_dir, name))
                lines.append(f'{wnid}/{name} {label}\n')
        with open(osp.join(out_dir, 'meta', f'{split}.txt'), 'w') as f:
            f.writelines(lines)
        counts[split] = dict(images=len(lines))
    return counts


# --------------------------------------------------------------------------------------------
# All sets, with a stamp per set so that an identical second call does nothing
# --------------------------------------------------------------------------------------------

_MAKERS = {'coco': make_toy_coco, 'ade': make_toy_ade, 'imagenet': make_toy_imagenet}


def _check_counts(num_train, num_val) -> None:
    for name, value in (('num_train', num_train), ('num_val', num_val)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f'{name} must be a positive integer, got {value!r}')


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
