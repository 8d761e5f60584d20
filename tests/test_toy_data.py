"""The synthetic toy datasets: determinism, format validity, CLI idempotence, stock dataset loading."""
import colorsys
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from dev.toy_data import make_all, read_stamp
from dev.toy_data.ade import ADE_TOY_RAW_LABELS, make_toy_ade
from dev.toy_data.coco import (COCO_TOY_CLASSES, COCO_TOY_HUES, make_toy_coco, mask_to_polygons,
                               render_coco_scene)
from dev.toy_data.common import toy_image_rng
from dev.toy_data.imagenet import (IMAGENET_TOY_CLASSES, IMAGENET_TOY_NUM_CLASSES, IMAGENET_TOY_WNIDS,
                                   make_toy_imagenet)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CLI = osp.join(ROOT, 'tools', 'dev', 'make_toy_data.py')
SEED = 3
COCO_COUNTS = (12, 6)
ADE_COUNTS = (4, 3)
IMAGENET_COUNTS = (3, 2)   # per class


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory):
    """All three sets, small, written once for the module."""
    root = str(tmp_path_factory.mktemp('toy'))
    make_toy_coco(osp.join(root, 'coco'), *COCO_COUNTS, seed=SEED)
    make_toy_ade(osp.join(root, 'ade'), *ADE_COUNTS, seed=SEED)
    make_toy_imagenet(osp.join(root, 'imagenet'), *IMAGENET_COUNTS, seed=SEED)
    return root


def _read(path) -> bytes:
    with open(path, 'rb') as f:
        return f.read()


def _image(path) -> np.ndarray:
    return np.asarray(Image.open(path))


def _files(folder) -> list:
    return sorted(osp.relpath(osp.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


def _decode(polygons, height, width) -> np.ndarray:
    mask_utils = pytest.importorskip('pycocotools.mask')
    return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(polygons, height, width))).astype(bool)


def _iou(a, b) -> float:
    return (a & b).sum() / max((a | b).sum(), 1)


# ------------------------------------------------------------------------------- determinism

@pytest.mark.parametrize('maker, counts', [(make_toy_coco, (3, 2)), (make_toy_ade, (2, 2)),
                                           (make_toy_imagenet, (1, 1))])
def test_same_seed_same_files_other_seed_other_files(tmp_path, maker, counts):
    first, second, other = (str(tmp_path / name) for name in ('first', 'second', 'other'))
    maker(first, *counts, seed=0)
    maker(second, *counts, seed=0)
    maker(other, *counts, seed=1)
    names = _files(first)
    assert names == _files(second) == _files(other)
    differing = 0
    for name in names:
        a, b, c = (osp.join(root, name) for root in (first, second, other))
        if name.endswith(('.jpg', '.JPEG', '.png')):
            assert np.array_equal(_image(a), _image(b)), name
            pixels_c = _image(c)
            differing += pixels_c.shape != _image(a).shape or not np.array_equal(pixels_c, _image(a))
        else:
            assert _read(a) == _read(b), name
            differing += _read(a) != _read(c)
    assert differing >= len(names) // 2


# ------------------------------------------------------------------------------- COCO

def test_coco_annotations_are_valid(toy_root):
    coco_api = pytest.importorskip('pycocotools.coco')
    for split, num_images in zip(('train', 'val'), COCO_COUNTS):
        ann_file = osp.join(toy_root, 'coco', 'annotations', f'instances_{split}2017.json')
        with open(ann_file) as f:
            content = json.load(f)
        assert set(content) == {'info', 'licenses', 'images', 'annotations', 'categories'}
        assert [(c['id'], c['name']) for c in content['categories']] == list(enumerate(COCO_TOY_CLASSES, 1))
        coco = coco_api.COCO(ann_file)
        assert len(coco.getImgIds()) == num_images
        annotation_ids = [a['id'] for a in content['annotations']]
        assert len(set(annotation_ids)) == len(annotation_ids)
        assert len({i['id'] for i in content['images']}) == num_images
        for image in content['images']:
            width, height = Image.open(osp.join(toy_root, 'coco', f'{split}2017', image['file_name'])).size
            assert (width, height) == (image['width'], image['height'])
            assert 256 <= width <= 320 and 256 <= height <= 320
        sizes = {(i['width'], i['height']) for i in content['images']}
        assert any(w != h for w, h in sizes), 'expected non-square images'
        for ann in content['annotations']:
            image = coco.imgs[ann['image_id']]
            x, y, w, h = ann['bbox']
            assert 0 <= x and 0 <= y and w > 0 and h > 0
            assert x + w <= image['width'] and y + h <= image['height']
            assert ann['iscrowd'] == 0 and ann['area'] > 0
            assert all(len(p) >= 6 and len(p) % 2 == 0 for p in ann['segmentation'])
            mask = coco.annToMask(ann)
            assert mask.shape == (image['height'], image['width'])
    with open(osp.join(toy_root, 'coco', 'annotations', 'instances_train2017.json')) as f:
        used = {a['category_id'] for a in json.load(f)['annotations']}
    assert used == {1, 2, 3}


def test_coco_polygons_reproduce_visible_masks(toy_root):
    """Re-render each val image from its seed and compare its masks with the written polygons."""
    with open(osp.join(toy_root, 'coco', 'annotations', 'instances_val2017.json')) as f:
        content = json.load(f)
    ious, occluded = [], 0
    for index, image in enumerate(content['images']):
        pixels, instances = render_coco_scene(toy_image_rng(SEED, 'coco', 'val', index))
        assert pixels.shape == (image['height'], image['width'], 3)
        anns = [a for a in content['annotations'] if a['image_id'] == image['id']]
        assert [a['category_id'] for a in anns] == [i['category_id'] for i in instances]
        masks = []
        for ann, instance in zip(anns, instances):
            mask = instance['mask']
            decoded = _decode(ann['segmentation'], image['height'], image['width'])
            ious.append(_iou(decoded, mask))
            ys, xs = np.nonzero(mask)
            assert ann['bbox'] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
            assert ann['area'] == mask.sum()
            occluded += mask.sum() < instance['full_area']
            masks.append(mask)
        if masks:   # visible parts never overlap: every pixel belongs to the topmost shape
            assert np.stack(masks).sum(0).max() == 1
    assert min(ious) >= 0.8 and np.mean(ious) >= 0.95, (min(ious), np.mean(ious))
    assert occluded >= 2


def test_coco_shapes_wear_their_class_hue_on_a_grey_background():
    """Every rendered instance's mean colour lies in its class's hue band and is saturated; the
    background (pixels of no shape) is far less saturated, whatever the class mix and occlusion."""
    for index in range(COCO_COUNTS[1]):
        pixels, instances = render_coco_scene(toy_image_rng(SEED, 'coco', 'val', index))
        pixels = pixels.astype(np.float64) / 255
        covered = np.zeros(pixels.shape[:2], bool)
        for instance in instances:
            red, green, blue = pixels[instance['mask']].mean(0)
            hue, saturation, _ = colorsys.rgb_to_hsv(red, green, blue)
            expected = COCO_TOY_HUES[instance['category_id'] - 1]
            assert min(abs(hue - expected), 1 - abs(hue - expected)) < 0.08, (index, hue, expected)
            assert saturation > 0.45, (index, saturation)
            covered |= instance['mask']
        background = pixels[~covered]
        chroma = background.max(-1) - background.min(-1)
        assert np.median(chroma) < 0.15, (index, np.median(chroma))


def test_mask_to_polygons_handles_holes_components_and_diagonals():
    mask = np.zeros((60, 80), bool)
    mask[5:45, 5:45] = True
    mask[15:30, 15:35] = False          # a hole
    mask[50:58, 60:78] = True           # a second component
    mask[2, 60] = mask[3, 61] = True    # two pixels touching diagonally: below min_area, dropped
    polygons = mask_to_polygons(mask)
    decoded = _decode(polygons, *mask.shape)
    assert not decoded[16:29, 16:34].any(), 'the hole must stay empty'
    assert _iou(decoded, mask) >= 0.98
    # a ring-shaped region: cut into hole-free pieces whose union is the ring
    ys, xs = np.mgrid[:100, :100]
    ring = ((ys - 50) ** 2 + (xs - 50) ** 2 <= 40 ** 2) & ((ys - 50) ** 2 + (xs - 50) ** 2 > 20 ** 2)
    assert _iou(_decode(mask_to_polygons(ring), 100, 100), ring) >= 0.97
    assert mask_to_polygons(np.zeros((10, 10), bool)) == []


# ------------------------------------------------------------------------------- ADE20K

def test_ade_labels_and_images_match(toy_root):
    root = osp.join(toy_root, 'ade', 'ADEChallengeData2016')
    allowed = {0} | set(ADE_TOY_RAW_LABELS)
    seen = set()
    for split, folder, num in (('train', 'training', ADE_COUNTS[0]), ('val', 'validation', ADE_COUNTS[1])):
        images = sorted(os.listdir(osp.join(root, 'images', folder)))
        labels = sorted(os.listdir(osp.join(root, 'annotations', folder)))
        assert images == [f'ADE_{split}_{i:08d}.jpg' for i in range(1, num + 1)]
        assert labels == [name[:-4] + '.png' for name in images]
        for image_name, label_name in zip(images, labels):
            image = Image.open(osp.join(root, 'images', folder, image_name))
            label = Image.open(osp.join(root, 'annotations', folder, label_name))
            assert image.mode == 'RGB' and label.mode == 'L'
            assert image.size == label.size
            assert all(256 <= side <= 512 for side in image.size)
            values = set(np.unique(np.asarray(label)).tolist())
            assert values <= allowed, values - allowed
            seen |= values
    assert 0 in seen and len(seen - {0}) >= 5


# ------------------------------------------------------------------------------- ImageNet

def test_imagenet_meta_matches_folders(toy_root):
    root = osp.join(toy_root, 'imagenet')
    for split, per_class in zip(('train', 'val'), IMAGENET_COUNTS):
        with open(osp.join(root, 'meta', f'{split}.txt')) as f:
            entries = [line.split() for line in f.read().splitlines()]
        assert len(entries) == per_class * IMAGENET_TOY_NUM_CLASSES
        assert sorted(os.listdir(osp.join(root, split))) == list(IMAGENET_TOY_WNIDS)
        listed = []
        for path, label in entries:
            wnid = path.split('/')[0]
            assert int(label) == IMAGENET_TOY_WNIDS.index(wnid)
            assert path.endswith('.JPEG')
            assert Image.open(osp.join(root, split, path)).mode == 'RGB'
            listed.append(path)
        assert sorted(listed) == _files(osp.join(root, split))


# ------------------------------------------------------------------------------- all sets, CLI

def _run_cli(*args):
    result = subprocess.run([sys.executable, CLI, *args], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_cli_skips_up_to_date_sets_and_force_regenerates(tmp_path):
    out = str(tmp_path / 'toy')
    args = ('--out', out, '--num-train', '2', '--num-val', '1', '--seed', '5')
    first = _run_cli(*args)
    assert all(f'{name}: wrote' in first for name in ('coco', 'ade', 'imagenet')), first
    stamps = {name: read_stamp(osp.join(out, name)) for name in ('coco', 'ade', 'imagenet')}
    assert stamps['coco']['args'] == dict(set='coco', version=stamps['coco']['args']['version'],
                                          seed=5, num_train=2, num_val=1)
    assert stamps['imagenet']['counts']['train']['images'] == 2 * IMAGENET_TOY_NUM_CLASSES
    stamp_mtime = os.stat(osp.join(out, 'coco', 'toy_data.json')).st_mtime_ns

    second = _run_cli(*args)
    assert second.count('skipped') == 3, second
    assert os.stat(osp.join(out, 'coco', 'toy_data.json')).st_mtime_ns == stamp_mtime

    forced = _run_cli(*args, '--what', 'coco', '--force')
    assert 'coco: wrote' in forced and 'ade' not in forced
    changed = _run_cli('--out', out, '--num-train', '3', '--num-val', '1', '--seed', '5', '--what', 'ade')
    assert 'ade: wrote 3 train' in changed
    assert len(os.listdir(osp.join(out, 'ade', 'ADEChallengeData2016', 'images', 'training'))) == 3
    assert not [name for name in os.listdir(out) if name.startswith('.')], 'temporary folders left behind'


def test_make_all_refuses_foreign_folder_and_bad_arguments(tmp_path):
    foreign = tmp_path / 'coco'
    foreign.mkdir()
    (foreign / 'mine.txt').write_text('not toy data')
    with pytest.raises(FileExistsError, match='--force'):
        make_all(str(tmp_path), what=('coco',), num_train=1, num_val=1, log=lambda line: None)
    assert (foreign / 'mine.txt').exists()
    with pytest.raises(ValueError, match='what must name sets'):
        make_all(str(tmp_path), what=('cityscapes',))
    with pytest.raises(ValueError, match='num_train must be a positive integer'):
        make_all(str(tmp_path / 'new'), what=('ade',), num_train=0, num_val=1, log=lambda line: None)


# ------------------------------------------------------------------------------- stock datasets

def test_mmdet_coco_dataset_reads_toy_coco(toy_root):
    pytest.importorskip('mmdet')
    from mmdet.datasets import CocoDataset
    for split, num_images in zip(('train', 'val'), COCO_COUNTS):
        dataset = CocoDataset(data_root=osp.join(toy_root, 'coco'),
                              ann_file=f'annotations/instances_{split}2017.json',
                              data_prefix=dict(img=f'{split}2017/'), metainfo=dict(classes=COCO_TOY_CLASSES),
                              filter_cfg=None, pipeline=[])
        assert len(dataset) == num_images
        info = dataset[0]
        assert osp.isfile(info['img_path'])
        assert info['instances'] and all(i['bbox_label'] in (0, 1, 2) for i in info['instances'])
        assert all(len(i['mask'][0]) >= 6 for i in info['instances'])


def test_mmseg_ade20k_dataset_reads_toy_ade(toy_root):
    pytest.importorskip('mmseg')
    from mmseg.datasets import ADE20KDataset
    root = osp.join(toy_root, 'ade', 'ADEChallengeData2016')
    dataset = ADE20KDataset(data_root=root, data_prefix=dict(img_path='images/validation',
                                                             seg_map_path='annotations/validation'),
                            pipeline=[])
    assert len(dataset) == ADE_COUNTS[1]
    info = dataset[0]
    assert info['reduce_zero_label'] is True
    assert osp.isfile(info['img_path']) and osp.isfile(info['seg_map_path'])
    names = dataset.metainfo['classes']
    for raw, name in ADE_TOY_RAW_LABELS.items():
        assert names[raw - 1].strip() == name


def test_mmpretrain_imagenet_reads_toy_imagenet(toy_root):
    pytest.importorskip('mmpretrain')
    from mmpretrain.datasets import ImageNet
    from mmpretrain.datasets.categories import IMAGENET_CATEGORIES
    assert IMAGENET_TOY_CLASSES == IMAGENET_CATEGORIES[:IMAGENET_TOY_NUM_CLASSES]
    root = osp.join(toy_root, 'imagenet')
    for split, per_class in zip(('train', 'val'), IMAGENET_COUNTS):
        for kwargs in (dict(split=split), dict(ann_file=f'meta/{split}.txt', data_prefix=split)):
            dataset = ImageNet(data_root=root, pipeline=[], **kwargs)
            assert len(dataset) == per_class * IMAGENET_TOY_NUM_CLASSES
            labels = sorted({dataset.get_data_info(i)['gt_label'] for i in range(len(dataset))})
            assert labels == list(range(IMAGENET_TOY_NUM_CLASSES))
            assert osp.isfile(dataset.get_data_info(0)['img_path'])
