"""The toy COCO-format instance set: 1-6 overlapping shapes per image, each class in its own hue,
annotated with polygons of the visible part (read unchanged by ``mmdet.datasets.CocoDataset``).

    <root>/coco/{train2017,val2017}/*.jpg
    <root>/coco/annotations/instances_{train,val}2017.json
"""
import colorsys
import json
import math
import os
import os.path as osp

import cv2
import numpy as np

from .common import (TOY_DATA_VERSION, TOY_DEFAULT_COUNTS, add_noise, bbox, blend, check_counts, draw_mask,
                     ramp, random_background, save_jpeg, to_uint8, toy_image_rng)

COCO_TOY_CLASSES = ('circle', 'rectangle', 'triangle')
# Each toy-COCO class is drawn in its own hue band (red, green, blue; +-0.05) on a desaturated
# background, so that class evidence is both shape and colour: a detector fine-tuned for a few
# hundred CPU iterations learns it, and the hue-coded toy-ImageNet pretraining is relevant to it.
COCO_TOY_HUES = (0.0, 1 / 3, 2 / 3)


# --------------------------------------------------------------------------------------------
# Masks: the opening of occluded shapes, and COCO polygons traced from them
# --------------------------------------------------------------------------------------------

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


_STEP_CODES = {(1, 0): 0, (0, 1): 1, (-1, 0): 2, (0, -1): 3}   # E, S, W, N on screen (y down)
# the pixel (row, column) on the right of a unit step from corner (x, y), by direction
_RIGHT_PIXEL = {(1, 0): (0, 0), (0, 1): (0, -1), (-1, 0): (-1, -1), (0, -1): (-1, 0)}


def _boundary_loops(mask) -> list:
    """Closed boundary loops of ``mask`` [H, W] along pixel edges, as corner lists [N, 2] (x, y).

    Coordinates are pixel corners (pixel (r, c) spans [c, c+1] x [r, r+1]). Loops keep the
    foreground on their right (clockwise on screen), so outer boundaries have positive and holes
    negative shoelace area. The foreground is 4-connected and the background 8-connected: two
    foreground pixels touching only at a corner lie on different loops.

    ``cv2.findContours`` traces the background, whose connectivity it takes as 8 (its zeros, our
    foreground, as 4), on a grid of twice the resolution where every background pixel is closed
    with its edges and corners; its borders with the foreground then run along our pixel edges.
    Each loop starts after, and ends at, its first corner in raster order (at a corner the loop
    passes twice, with the lower of the directions E, S, W, N), and the loops come in that order.
    """
    h, w = mask.shape
    background = np.ones((h + 2, w + 2), np.uint8)
    background[1:-1, 1:-1] = ~mask
    grid = np.zeros((2 * h + 5, 2 * w + 5), np.uint8)   # padded pixel (r, c) at cell (2r+1, 2c+1)
    grid[1::2, 1::2] = background
    grid = cv2.dilate(grid, np.ones((3, 3), np.uint8))
    contours, _ = cv2.findContours(grid, cv2.RETR_LIST, cv2.CHAIN_APPROX_NONE)
    loops = [_corner_loop(c[:, 0, :].astype(np.int64), mask) for c in contours
             if c.min() > 0]   # a contour on the grid's edge is the outer border of the padding
    return [loop for _, loop in sorted(loops, key=lambda keyed: keyed[0])]


def _corner_loop(cells, mask):
    """(sort key, corners [N, 2]) of one traced contour of :func:`_boundary_loops`' grid."""
    h, w = mask.shape
    following = np.roll(cells, -1, 0)
    # a diagonal step skips the corner cell between two edge cells: the one with even coordinates
    skipped = np.where((cells[:, :1] % 2) == 0, np.stack([cells[:, 0], following[:, 1]], 1),
                       np.stack([following[:, 0], cells[:, 1]], 1))
    diagonal = np.abs(following - cells).sum(1) == 2
    kept = np.stack([np.ones_like(diagonal), diagonal], 1).ravel()
    path = np.stack([cells, skipped], 1).reshape(-1, 2)[kept]   # each cell, then the skipped corner
    vertices = path[(path % 2 == 0).all(1)] // 2 - 1   # corner cells -> pixel-corner coordinates
    step = tuple(int(v) for v in vertices[1] - vertices[0])
    row, col = np.array([vertices[0][1], vertices[0][0]]) + _RIGHT_PIXEL[step]
    if not (0 <= row < h and 0 <= col < w and mask[row, col]):
        vertices = vertices[::-1]
    steps = np.roll(vertices, -1, 0) - vertices
    turns = (steps != np.roll(steps, 1, 0)).any(1)
    corners = vertices[turns]
    codes = np.array([_STEP_CODES[(int(dx), int(dy))] for dx, dy in steps[turns]])
    keys = (corners[:, 1] * (w + 1) + corners[:, 0]) * 4 + codes
    first = int(np.argmin(keys))
    return int(keys[first]), np.roll(corners, -first - 1, 0)

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
    box = bbox(mask)
    if box is None:
        return []
    x0, y0, x1, y1 = box
    pieces = [(np.ascontiguousarray(mask[y0:y1, x0:x1]), x0, y0)]
    polygons = []
    while pieces:
        piece, off_x, off_y = pieces.pop()
        loops = _boundary_loops(piece)
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
# Scenes and the set
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
    image = random_background(rng, height, width, patterned=False)
    image = image * 0.3 + image.mean(-1, keepdims=True) * 0.7         # desaturate the background
    shapes = []   # (category_id, full mask, full area, visible mask), bottom to top
    for _ in range(int(rng.integers(1, _COCO_MAX_SHAPES + 1))):
        category_id = int(rng.integers(len(COCO_TOY_CLASSES))) + 1
        full = None
        for _attempt in range(6):
            size = math.exp(rng.uniform(math.log(12), math.log(0.4 * min(width, height))))
            cx, cy = rng.uniform(0.05, 0.95) * width, rng.uniform(0.05, 0.95) * height
            outline = _shape_outline(rng, COCO_TOY_CLASSES[category_id - 1], cx, cy, size)
            candidate = draw_mask(width, height, [('polygon', outline)])
            if candidate.sum() < _MIN_VISIBLE_AREA:
                continue
            full = candidate
            if all(_is_visible_enough(visible & ~full, area) for _, _, area, visible in shapes):
                break
        if full is None:
            continue
        shapes = [(cid, f, area, visible & ~full) for cid, f, area, visible in shapes]
        shapes.append((category_id, full, int(full.sum()), full))
        x0, y0, x1, y1 = bbox(full)
        fill = _class_fill(rng, category_id, y1 - y0, x1 - x0)
        crop = full[y0:y1, x0:x1]
        image[y0:y1, x0:x1][crop] = fill[crop]
    image = add_noise(rng, image, rng.uniform(1, 5))

    instances = []
    for category_id, full, full_area, visible in shapes:
        if not np.array_equal(visible, full):
            visible = _binary_open(visible)
        if _is_visible_enough(visible, full_area):
            instances.append(dict(category_id=category_id, mask=visible, full_area=full_area))
    return to_uint8(image), instances


def _class_fill(rng, category_id, height, width) -> np.ndarray:
    """A shape's fill in its class hue (:data:`COCO_TOY_HUES` +-0.05), flat or shaded: [h, w, 3]."""
    hue = (COCO_TOY_HUES[category_id - 1] + rng.uniform(-0.05, 0.05)) % 1.0
    colour = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 1.0), rng.uniform(0.5, 1.0)),
                      np.float32) * 255
    if rng.random() < 0.5:
        image = np.broadcast_to(colour, (height, width, 3)).astype(np.float32)
    else:
        image = blend(ramp(height, width, rng.uniform(0, 2 * math.pi)), colour, colour * 0.6)
    return add_noise(rng, image, rng.uniform(1, 6))


def _is_visible_enough(visible, full_area) -> bool:
    area = int(visible.sum())
    return area >= _MIN_VISIBLE_AREA and area >= _MIN_VISIBLE_FRACTION * full_area


def coco_annotation(mask, category_id, image_id, annotation_id) -> dict:
    """A COCO instance annotation (polygons, visible bbox [x, y, w, h], pixel area) for ``mask``."""
    x0, y0, x1, y1 = bbox(mask)
    return dict(id=annotation_id, image_id=image_id, category_id=category_id,
                segmentation=mask_to_polygons(mask), area=float(mask.sum()),
                bbox=[float(x0), float(y0), float(x1 - x0), float(y1 - y0)], iscrowd=0)


def make_toy_coco(out_dir, num_train=TOY_DEFAULT_COUNTS['coco'][0],
                  num_val=TOY_DEFAULT_COUNTS['coco'][1], seed=0) -> dict:
    """Write the COCO-format instance set into ``out_dir``; returns image/instance counts."""
    check_counts(num_train, num_val)
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
            save_jpeg(image, osp.join(image_dir, file_name))
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
