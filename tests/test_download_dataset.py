"""tools/misc/download_dataset.py. Each converter on a small archive written here, with every kind of
annotation defect counted, and --max-size scaling images and annotations; the refusals (a truncated
or corrupt archive, offline without --archive, a folder the tool did not write), the atomic
replacement and the up-to-date stamp. Then the real archives of the shared data folder, each
converted once, against their published counts."""
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest
from PIL import Image

from e2e_utils import ROOT, SHARED_ARCHIVES, shared_archive
from misc import download_dataset as dd

TOOL = os.path.join(ROOT, 'tools', 'misc', 'download_dataset.py')


def image_bytes(size, fmt='JPEG', noise=False):
    """An encoded RGB image of ``size`` (w, h): grey, or random pixels (bytes unique in a zip)."""
    pixels = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), np.uint8) if noise else \
        np.full((size[1], size[0], 3), 128, np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def label_bytes(values):
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(values, np.uint8)).save(buffer, 'PNG')
    return buffer.getvalue()


def write_zip(path, files, compression=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, 'w', compression) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return str(path)


def write_tar(path, files):
    with tarfile.open(path, 'w:gz') as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return str(path)


def polygon(xs, ys):
    return {'shape_attributes': {'name': 'polygon', 'all_points_x': xs, 'all_points_y': ys},
            'region_attributes': {}}


def via(entries):
    """VIA's via_region_data.json: ``{filename + size: entry}``."""
    return json.dumps({f'{name}123': dict(filename=name, size=123, regions=regions, file_attributes={})
                       for name, regions in entries.items()}).encode()


def balloon_files():
    """Train: a.jpg (a rectangle kept; a 2-point polygon; a vertical line; a rectangle region), b.jpg
    (regions as a list: a triangle with 2 points outside the 100x80 image), neg.jpg (no entry) and an
    entry for ghost.jpg (no image). Val: v.jpg with one triangle."""
    rect = {'shape_attributes': {'name': 'rect', 'x': 1, 'y': 1, 'width': 5, 'height': 5}}
    train = via({'a.jpg': {'0': polygon([10, 50, 50, 10], [10, 10, 40, 40]), '1': polygon([5, 20], [5, 20]),
                           '2': polygon([30, 30, 30], [5, 20, 60]), '3': rect},
                 'b.jpg': [polygon([-5, 60, 120], [10, 70, 10])],
                 'ghost.jpg': [polygon([1, 5, 1], [1, 1, 5])]})
    val = via({'v.jpg': {'0': polygon([0, 20, 0], [0, 0, 20])}})
    jpeg = image_bytes((100, 80))
    return {'balloon/train/via_region_data.json': train, 'balloon/train/a.jpg': jpeg,
            'balloon/train/b.jpg': jpeg, 'balloon/train/neg.jpg': jpeg,
            'balloon/val/via_region_data.json': val, 'balloon/val/v.jpg': jpeg}


def load_json(path):
    with open(path) as f:
        return json.load(f)


def hidden_names(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith('.'))


def test_balloon_counts_every_defect_and_writes_coco(tmp_path, capsys):
    archive = write_zip(tmp_path / 'balloon_dataset.zip', balloon_files())
    report = dd.prepare('balloon', str(tmp_path / 'data'), archive)
    assert report.splits == {'train': {'images': 3, 'instances': 2}, 'val': {'images': 1, 'instances': 1}}
    assert {k: n for k, n in report.defects.items() if n} == {
        dd.SHORT_POLYGON: 1, dd.ZERO_AREA_BOX: 1, dd.NON_POLYGON_REGION: 1, dd.POINT_OUTSIDE: 2,
        dd.LABEL_WITHOUT_IMAGE: 1, dd.IMAGE_WITHOUT_LABEL: 1}
    out = capsys.readouterr().out
    assert '       1  label file without image (skipped)' in out
    assert '       2  point outside the image (clipped)' in out
    root = tmp_path / 'data' / 'balloon'
    coco = load_json(root / 'annotations' / 'instances_train.json')
    assert coco['categories'] == [{'id': 1, 'name': 'balloon'}]
    assert [(i['id'], i['file_name'], i['width'], i['height']) for i in coco['images']] == [
        (1, 'a.jpg', 100, 80), (2, 'b.jpg', 100, 80), (3, 'neg.jpg', 100, 80)]  # neg.jpg: a negative
    a, b = coco['annotations']
    assert (a['id'], a['image_id'], a['category_id'], a['iscrowd']) == (1, 1, 1, 0)
    assert a['bbox'] == [10, 10, 40, 30] and a['area'] == 1200
    assert a['segmentation'] == [[10, 10, 50, 10, 50, 40, 10, 40]]
    assert b['image_id'] == 2 and b['segmentation'] == [[0, 10, 60, 70, 100, 10]]  # clipped to the image
    assert b['bbox'] == [0, 10, 100, 60] and b['area'] == 3000
    assert sorted(os.listdir(root / 'train')) == ['a.jpg', 'b.jpg', 'neg.jpg']
    assert len(load_json(root / 'annotations' / 'instances_val.json')['annotations']) == 1


def test_balloon_from_a_tar_archive(tmp_path):
    archive = write_tar(tmp_path / 'balloon.tar.gz', balloon_files())
    report = dd.prepare('balloon', str(tmp_path / 'data'), archive)
    assert report.splits['train'] == {'images': 3, 'instances': 2}


def test_coco128_counts_every_defect_and_uses_coco_ids(tmp_path):
    from mmdet.datasets.coco import CocoDataset
    assert dd.COCO_CLASSES == CocoDataset.METAINFO['classes']
    lines = ['0 0.1 0.1 0.5 0.1 0.5 0.5',  # person: kept
             '79 0.2 0.2 1.2 0.2 0.2 0.8',  # toothbrush, one point outside: clipped
             '5 0.1 0.1 0.2 0.2',  # two points
             '80 0.1 0.1 0.2 0.1 0.2 0.2',  # no class 80
             '3 0.1 0.5 0.3 0.5 0.6 0.5',  # a horizontal line: zero-area box
             '2 0.1 0.2 0.3', 'x 0.1 0.1 0.2 0.2 0.3 0.1', '']  # malformed twice; an empty line
    files = {'coco128-seg/images/train2017/000000000001.jpg': image_bytes((100, 50)),
             'coco128-seg/images/train2017/000000000002.jpg': image_bytes((100, 50)),  # no labels
             'coco128-seg/labels/train2017/000000000001.txt': '\n'.join(lines).encode(),
             'coco128-seg/labels/train2017/000000000003.txt': b'0 0.1 0.1 0.5 0.1 0.5 0.5',  # no image
             'coco128-seg/labels/train2017.cache': b'not a label', 'coco128-seg/README.txt': b''}
    report = dd.prepare('coco128-seg', str(tmp_path / 'data'), write_zip(tmp_path / 'c.zip', files))
    assert report.splits == {'train2017': {'images': 2, 'instances': 2}}
    assert {k: n for k, n in report.defects.items() if n} == {
        dd.POINT_OUTSIDE: 1, dd.SHORT_POLYGON: 1, dd.UNKNOWN_CLASS: 1, dd.ZERO_AREA_BOX: 1, dd.MALFORMED: 2,
        dd.LABEL_WITHOUT_IMAGE: 1, dd.IMAGE_WITHOUT_LABEL: 1}
    coco = load_json(tmp_path / 'data' / 'coco128' / 'annotations' / 'instances_train2017.json')
    categories = {c['id']: c['name'] for c in coco['categories']}
    assert len(categories) == 80 and categories[1] == 'person' and categories[2] == 'bicycle'
    assert categories[90] == 'toothbrush' and 12 not in categories and max(categories) == 90
    person, toothbrush = coco['annotations']
    assert (person['category_id'], person['bbox'], person['area']) == (1, [10, 5, 40, 20], 400)
    assert toothbrush['category_id'] == 90 and toothbrush['bbox'] == [20, 10, 80, 30]
    assert [i['file_name'] for i in coco['images']] == ['000000000001.jpg', '000000000002.jpg']
    assert sorted(os.listdir(tmp_path / 'data' / 'coco128' / 'train2017')) == [
        '000000000001.jpg', '000000000002.jpg']


def camvid_files(with_test):
    """Train: a (labels 0, 10, void 11 and an unknown 12), b (label of another size), noann (no label),
    and a label 'orphan' without image; val: v; test: t when ``with_test``."""
    values = np.zeros((30, 40), np.uint8)
    values[:, 20:] = 10
    values[:10, :10] = 11
    values[20:, :10] = 12
    png = image_bytes((40, 30), 'PNG')
    files = {'camvid_mini/train/a.png': png, 'camvid_mini/trainannot/a.png': label_bytes(values),
             'camvid_mini/train/b.png': png, 'camvid_mini/trainannot/b.png': label_bytes(values[:20]),
             'camvid_mini/train/noann.png': png, 'camvid_mini/trainannot/orphan.png': label_bytes(values),
             'camvid_mini/val/v.png': png, 'camvid_mini/valannot/v.png': label_bytes(values % 11)}
    if with_test:
        files.update({'camvid_mini/test/t.png': png, 'camvid_mini/testannot/t.png': label_bytes(values % 11)})
    return files


@pytest.mark.parametrize('with_test', [False, True])
def test_camvid_with_and_without_test_split(tmp_path, with_test):
    archive = write_zip(tmp_path / 'camvid.zip', camvid_files(with_test))
    report = dd.prepare('camvid', str(tmp_path / 'data'), archive)
    splits = ['train', 'val', 'test'] if with_test else ['train', 'val']
    assert list(report.splits) == splits and all(s['images'] == 1 for s in report.splits.values())
    assert {k: n for k, n in report.defects.items() if n} == {
        dd.LABEL_WITHOUT_IMAGE: 1, dd.IMAGE_WITHOUT_MAP: 1, dd.MAP_SIZE_MISMATCH: 1,
        dd.UNKNOWN_LABEL_VALUE: 1}
    root = tmp_path / 'data' / 'camvid'
    for split in splits:
        stems = sorted(os.listdir(root / 'img_dir' / split))
        assert stems == sorted(os.listdir(root / 'ann_dir' / split)) and len(stems) == 1
    label = np.asarray(Image.open(root / 'ann_dir' / 'train' / 'a.png'))
    assert label.dtype == np.uint8 and label.shape == (30, 40)
    assert (label[:10, :10] == 255).all() and (label[20:, :10] == 255).all()  # void and unknown
    assert (label[10:20, :20] == 0).all() and (label[:, 20:] == 10).all()


def test_camvid_max_size_resizes_labels_with_nearest(tmp_path):
    archive = write_zip(tmp_path / 'camvid.zip', camvid_files(False))
    dd.prepare('camvid', str(tmp_path / 'data'), archive, max_size=20)
    root = tmp_path / 'data' / 'camvid'
    assert Image.open(root / 'img_dir' / 'train' / 'a.png').size == (20, 15)
    label = np.asarray(Image.open(root / 'ann_dir' / 'train' / 'a.png'))
    assert label.shape == (15, 20) and set(np.unique(label)) == {0, 10, 255}  # no interpolated classes


def test_cifar10_lists_for_custom_dataset(tmp_path):
    jpeg = image_bytes((32, 32))
    files = {'CIFAR-10-images-master/README.md': b'',
             'CIFAR-10-images-master/train/truck/0001.jpg': jpeg,
             'CIFAR-10-images-master/train/airplane/0000.jpg': jpeg,
             'CIFAR-10-images-master/train/dragon/0002.jpg': jpeg,  # not a CIFAR-10 class
             'CIFAR-10-images-master/test/cat/0000.jpg': jpeg}
    report = dd.prepare('cifar10', str(tmp_path / 'data'), write_zip(tmp_path / 'cifar.zip', files))
    assert report.splits == {'train': {'images': 2}, 'test': {'images': 1}}
    assert {k: n for k, n in report.defects.items() if n} == {dd.UNKNOWN_CLASS_FOLDER: 1}
    root = tmp_path / 'data' / 'cifar10'
    assert (root / 'meta' / 'train.txt').read_text() == 'airplane/0000.jpg 0\ntruck/0001.jpg 9\n'
    assert (root / 'meta' / 'test.txt').read_text() == 'cat/0000.jpg 3\n'
    assert (root / 'train' / 'truck' / '0001.jpg').read_bytes() == jpeg
    assert not (root / 'train' / 'dragon').exists()


def test_max_size_scales_images_and_annotations(tmp_path):
    files = {'balloon/train/via_region_data.json': via({'big.jpg': [polygon([20, 180, 180], [20, 20, 80])],
                                                        'small.jpg': [polygon([0, 30, 30], [0, 0, 10])]}),
             'balloon/train/big.jpg': image_bytes((200, 100)),
             'balloon/train/small.jpg': image_bytes((40, 20)),
             'balloon/val/via_region_data.json': via({}), 'balloon/val/v.jpg': image_bytes((40, 20))}
    dd.prepare('balloon', str(tmp_path / 'data'), write_zip(tmp_path / 'b.zip', files), max_size=50)
    root = tmp_path / 'data' / 'balloon'
    coco = load_json(root / 'annotations' / 'instances_train.json')
    assert [(i['file_name'], i['width'], i['height']) for i in coco['images']] == [
        ('big.jpg', 50, 25), ('small.jpg', 40, 20)]
    assert Image.open(root / 'train' / 'big.jpg').size == (50, 25)
    assert (root / 'train' / 'small.jpg').read_bytes() == files['balloon/train/small.jpg']  # copied as is
    big, small = coco['annotations']
    assert big['segmentation'] == [[5, 5, 45, 5, 45, 20]] and big['bbox'] == [5, 5, 40, 15]
    assert big['area'] == 300  # 4800 / 16
    assert small['bbox'] == [0, 0, 30, 10] and small['area'] == 150
    val = load_json(root / 'annotations' / 'instances_val.json')
    assert len(val['images']) == 1 and val['annotations'] == []  # a split of negatives only


def truncated(path):
    data = open(path, 'rb').read()
    with open(path, 'wb') as f:
        f.write(data[:len(data) * 2 // 3])
    return path


def crc_broken(path):
    """A stored (uncompressed) zip with one byte of an image changed: its central directory is
    intact, only the CRC check finds it."""
    data = bytearray(open(path, 'rb').read())
    offset = data.index(image_bytes((64, 64), noise=True)) + 1000
    data[offset] ^= 0xFF
    with open(path, 'wb') as f:
        f.write(bytes(data))
    return path


@pytest.mark.parametrize('damage', ['truncated zip', 'crc-broken zip', 'truncated tar.gz'])
def test_damaged_archive_is_refused_with_nothing_written(tmp_path, damage):
    files = dict(balloon_files(), **{'balloon/train/noise.jpg': image_bytes((64, 64), noise=True)})
    if damage == 'truncated zip':
        archive = truncated(write_zip(tmp_path / 'b.zip', files))
    elif damage == 'crc-broken zip':
        archive = crc_broken(write_zip(tmp_path / 'b.zip', files, zipfile.ZIP_STORED))
    else:
        archive = truncated(write_tar(tmp_path / 'b.tar.gz', files))
    save_dir = tmp_path / 'data'
    save_dir.mkdir()
    (save_dir / 'keep.txt').write_text('other data')
    with pytest.raises(SystemExit, match='corrupt|truncated') as error:
        dd.main(['--dataset-name', 'balloon', '--save-dir', str(save_dir), '--archive', archive])
    assert 'nothing was written' in str(error.value) or 'truncated' in str(error.value)
    assert os.listdir(save_dir) == ['keep.txt']


def test_wrong_archive_is_refused_with_nothing_left(tmp_path):
    archive = write_zip(tmp_path / 'c.zip', {'cifar/train/cat/0.jpg': image_bytes((32, 32))})
    with pytest.raises(SystemExit, match=r'does not hold one balloon layout .*\(found none\)'):
        dd.prepare('balloon', str(tmp_path / 'data'), archive)
    assert not (tmp_path / 'data').exists()


def test_second_run_is_up_to_date_and_a_new_max_size_replaces(tmp_path, capsys):
    archive = write_zip(tmp_path / 'b.zip', balloon_files())
    argv = ['--dataset-name', 'balloon', '--save-dir', str(tmp_path / 'data'), '--archive', archive]
    assert dd.main(argv) == 0
    root = tmp_path / 'data' / 'balloon'
    stamp = load_json(root / dd.STAMP_NAME)
    assert stamp['dataset'] == 'balloon' and stamp['max_size'] is None and len(stamp['archive_sha256']) == 64
    assert stamp['splits']['train'] == {'images': 3, 'instances': 2}
    assert stamp['defects'][dd.POINT_OUTSIDE] == 2
    written = os.stat(root / 'train' / 'a.jpg').st_mtime_ns
    capsys.readouterr()
    assert dd.main(argv) == 0
    assert 'is up to date' in capsys.readouterr().out
    assert os.stat(root / 'train' / 'a.jpg').st_mtime_ns == written
    assert dd.main(argv + ['--max-size', '50']) == 0
    assert 'is up to date' not in capsys.readouterr().out
    assert load_json(root / dd.STAMP_NAME)['max_size'] == 50
    assert Image.open(root / 'train' / 'a.jpg').size == (50, 40)
    assert hidden_names(tmp_path / 'data') == []  # no temporary or old folders left


def test_interrupted_run_leaves_the_previous_set_and_no_temporary_folder(tmp_path, monkeypatch):
    archive = write_zip(tmp_path / 'b.zip', balloon_files())
    save_dir = tmp_path / 'data'
    real = dd.DATASETS['balloon']

    def interrupted(archive, out_dir, max_size):
        real.convert(archive, out_dir, max_size)  # every file written, then ^C before the rename
        raise KeyboardInterrupt

    monkeypatch.setitem(dd.DATASETS, 'balloon', dd.Dataset(real.urls, real.folder, interrupted))
    with pytest.raises(KeyboardInterrupt):
        dd.prepare('balloon', str(save_dir), archive)
    assert not save_dir.exists()
    monkeypatch.setitem(dd.DATASETS, 'balloon', real)
    dd.prepare('balloon', str(save_dir), archive)
    monkeypatch.setitem(dd.DATASETS, 'balloon', dd.Dataset(real.urls, real.folder, interrupted))
    with pytest.raises(KeyboardInterrupt):
        dd.prepare('balloon', str(save_dir), archive, max_size=50)
    assert os.listdir(save_dir) == ['balloon']  # the previous set, whole, and nothing hidden
    assert load_json(save_dir / 'balloon' / dd.STAMP_NAME)['max_size'] is None
    assert Image.open(save_dir / 'balloon' / 'train' / 'a.jpg').size == (100, 80)


def test_folder_not_written_by_the_tool_is_left_alone(tmp_path):
    (tmp_path / 'data' / 'balloon').mkdir(parents=True)
    (tmp_path / 'data' / 'balloon' / 'mine.txt').write_text('mine')
    archive = write_zip(tmp_path / 'b.zip', balloon_files())
    with pytest.raises(SystemExit, match='not written by this tool'):
        dd.prepare('balloon', str(tmp_path / 'data'), archive)
    assert os.listdir(tmp_path / 'data') == ['balloon']
    assert os.listdir(tmp_path / 'data' / 'balloon') == ['mine.txt']


def test_offline_without_archive_names_the_url_and_the_option(tmp_path):
    """No internet (a proxy nobody listens on): the command stops, naming what to fetch and how to
    pass it, and writes nothing."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ('no_proxy', 'all_proxy')}
    proxy = 'http://127.0.0.1:9'
    env.update(https_proxy=proxy, http_proxy=proxy, HTTPS_PROXY=proxy, HTTP_PROXY=proxy)
    command = [sys.executable, TOOL, '--dataset-name', 'balloon', '--save-dir', str(tmp_path / 'data')]
    proc = subprocess.run(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout
    assert dd.DATASETS['balloon'].urls[0] in proc.stdout and '--archive FILE' in proc.stdout, proc.stdout
    assert not (tmp_path / 'data').exists()


@pytest.fixture(scope='module')
def real_set(tmp_path_factory):
    """``convert(name, max_size=None) -> (report, folder)``, each set converted once per module."""
    save_dir = tmp_path_factory.mktemp('shared_sets')
    done = {}

    def convert(name, max_size=None):
        if (name, max_size) not in done:
            archive = shared_archive(SHARED_ARCHIVES[name])
            out = save_dir / f'{name}-{max_size}'
            report = dd.prepare(name, str(out), archive, max_size)
            done[name, max_size] = report, out / dd.DATASETS[name].folder
        return done[name, max_size]

    return convert


def load_coco(path):
    from pycocotools.coco import COCO
    return COCO(str(path))


@pytest.mark.parametrize('max_size', [None, 512])
def test_real_balloon(real_set, max_size):
    report, root = real_set('balloon', max_size)
    assert report.splits == {'train': {'images': 61, 'instances': 255},
                             'val': {'images': 13, 'instances': 50}}
    assert not any(report.defects.values())
    for split, images, instances in (('train', 61, 255), ('val', 13, 50)):
        coco = load_coco(root / 'annotations' / f'instances_{split}.json')
        assert (len(coco.imgs), len(coco.anns), list(coco.cats)) == (images, instances, [1])
        assert len(os.listdir(root / split)) == images
        if max_size:
            sizes = {i['file_name']: (i['width'], i['height']) for i in coco.imgs.values()}
            assert all(Image.open(root / split / name).size == size for name, size in sizes.items())
            assert max(max(size) for size in sizes.values()) == max_size  # the photos are up to 2048 px


def test_real_coco128(real_set):
    report, root = real_set('coco128-seg')
    assert report.splits == {'train2017': {'images': 128, 'instances': 929}}
    assert {k: n for k, n in report.defects.items() if n} == {dd.IMAGE_WITHOUT_LABEL: 2,
                                                              dd.LABEL_WITHOUT_IMAGE: 2}
    coco = load_coco(root / 'annotations' / 'instances_train2017.json')
    assert (len(coco.imgs), len(coco.anns), len(coco.cats)) == (128, 929, 80)
    assert len({a['category_id'] for a in coco.anns.values()}) == 71
    negatives = sorted(i['file_name'] for i in coco.imgs.values() if not coco.getAnnIds(imgIds=[i['id']]))
    assert negatives == ['000000000250.jpg', '000000000508.jpg']
    assert len(os.listdir(root / 'train2017')) == 128


def test_real_camvid(real_set):
    report, root = real_set('camvid')
    assert report.splits == {'train': {'images': 25}, 'val': {'images': 13}}
    assert not any(report.defects.values())
    label = np.asarray(Image.open(sorted((root / 'ann_dir' / 'train').iterdir())[0]))
    assert label.shape == (360, 480) and set(np.unique(label)) <= set(range(11)) | {255}
    assert len(os.listdir(root / 'img_dir' / 'val')) == len(os.listdir(root / 'ann_dir' / 'val')) == 13


def test_real_cifar10(real_set):
    report, root = real_set('cifar10')
    assert report.splits == {'train': {'images': 1000}, 'test': {'images': 200}}
    lines = (root / 'meta' / 'train.txt').read_text().splitlines()
    assert len(lines) == 1000 and lines[0] == 'airplane/0000.jpg 0' and lines[-1].endswith(' 9')
    assert all((root / 'train' / line.split()[0]).is_file() for line in lines)
    test_lines = (root / 'meta' / 'test.txt').read_text().splitlines()
    assert len(test_lines) == 200
    # classes interleaved: the first N lines (a dataset's indices=N) hold N/10 images of each class
    assert [int(line.split()[1]) for line in test_lines[:20]] == list(range(10)) * 2


# ------------------------------------------------------------ the evaluation sets (official layouts)

def coco_json(images, annotations):
    return json.dumps(dict(images=images, annotations=annotations, categories=[dict(id=1, name='a')])).encode()


def test_coco2017_from_its_two_official_archives_drops_what_the_archive_lacks(tmp_path):
    """val2017.zip + annotations_trainval2017.zip, read as one; a grayscale image and a crowd
    instance are COCO and stay; an annotated image missing from the archive leaves the annotations."""
    gray = io.BytesIO()
    Image.fromarray(np.full((6, 8), 90, np.uint8)).save(gray, 'JPEG')
    images = write_zip(tmp_path / 'val2017.zip', {'val2017/000001.jpg': image_bytes((8, 6)),
                                                  'val2017/000002.jpg': gray.getvalue(),
                                                  'val2017/000009.jpg': image_bytes((8, 6))})
    anns = [dict(id=1, image_id=1, category_id=1, bbox=[0, 0, 2, 2], area=4, iscrowd=0, segmentation=[]),
            dict(id=2, image_id=2, category_id=1, bbox=[1, 1, 2, 2], area=4, iscrowd=1,
                 segmentation=dict(counts=[0, 48], size=[6, 8])),
            dict(id=3, image_id=3, category_id=1, bbox=[0, 0, 1, 1], area=1, iscrowd=0, segmentation=[])]
    listed = [dict(id=i, file_name=f'00000{i}.jpg', width=8, height=6) for i in (1, 2, 3)]
    annotations = write_zip(tmp_path / 'annotations_trainval2017.zip',
                            {'annotations/instances_val2017.json': coco_json(listed, anns)})
    report = dd.prepare('coco2017', str(tmp_path / 'data'), [images, annotations])
    assert report.splits == {'val2017': {'images': 2, 'instances': 2}}
    assert {k: n for k, n in report.defects.items() if n} == {dd.ANNOTATED_IMAGE_MISSING: 1,
                                                              dd.IMAGE_NOT_ANNOTATED: 1}
    root = tmp_path / 'data' / 'coco'
    assert sorted(os.listdir(root / 'val2017')) == ['000001.jpg', '000002.jpg']
    assert (root / 'val2017' / '000002.jpg').read_bytes() == gray.getvalue()  # unchanged bytes
    coco = load_coco(root / 'annotations' / 'instances_val2017.json')
    assert sorted(coco.imgs) == [1, 2] and sorted(coco.anns) == [1, 2] and coco.anns[2]['iscrowd'] == 1


def test_ade20k_pairs_images_with_label_maps_of_their_size(tmp_path):
    top = 'ADEChallengeData2016/'
    files = {f'{top}images/validation/ADE_val_1.jpg': image_bytes((8, 6)),
             f'{top}annotations/validation/ADE_val_1.png': label_bytes(np.arange(48).reshape(6, 8) % 151),
             f'{top}images/validation/ADE_val_2.jpg': image_bytes((8, 6)),  # no map
             f'{top}images/validation/ADE_val_3.jpg': image_bytes((8, 6)),
             f'{top}annotations/validation/ADE_val_3.png': label_bytes(np.zeros((5, 8))),  # other size
             f'{top}objectInfo150.csv': b'Idx,Ratio,Train,Val,Name\n'}
    report = dd.prepare('ade20k', str(tmp_path / 'data'), write_zip(tmp_path / 'ade.zip', files))
    assert report.splits == {'validation': {'images': 1}}
    assert {k: n for k, n in report.defects.items() if n} == {dd.IMAGE_WITHOUT_MAP: 1, dd.MAP_SIZE_MISMATCH: 1}
    root = tmp_path / 'data' / 'ade' / 'ADEChallengeData2016'
    assert os.listdir(root / 'images' / 'validation') == ['ADE_val_1.jpg']
    assert (root / 'annotations' / 'validation' / 'ADE_val_1.png').read_bytes() == \
        files[f'{top}annotations/validation/ADE_val_1.png']  # 0 = other, kept for reduce_zero_label
    assert (root / 'objectInfo150.csv').is_file()


def test_imagenet_takes_an_archive_with_labels_only(tmp_path, capsys):
    files = {'ILSVRC2012_img_val/ILSVRC2012_val_00000001.JPEG': image_bytes((8, 8)),
             'ILSVRC2012_img_val/ILSVRC2012_val_00000002.JPEG': image_bytes((8, 8)),
             'ILSVRC2012_img_val/ILSVRC2012_val_00000003.JPEG': image_bytes((8, 8)),  # no label
             'val_labels.txt': b'ILSVRC2012_val_00000002.JPEG 999\nILSVRC2012_val_00000001.JPEG 65\n'
                               b'ILSVRC2012_val_00000007.JPEG 3\nILSVRC2012_val_00000001.JPEG x\n'}
    report = dd.prepare('imagenet', str(tmp_path / 'data'), write_zip(tmp_path / 'in.zip', files))
    assert report.splits == {'val': {'images': 2}}
    assert {k: n for k, n in report.defects.items() if n} == {
        dd.LABEL_WITHOUT_IMAGE: 1, dd.MALFORMED_LABEL_LINE: 1, dd.IMAGE_WITHOUT_LABEL_SKIPPED: 1}
    root = tmp_path / 'data' / 'imagenet'
    assert (root / 'meta' / 'val.txt').read_text() == ('ILSVRC2012_val_00000001.JPEG 65\n'
                                                       'ILSVRC2012_val_00000002.JPEG 999\n')
    assert sorted(os.listdir(root / 'val')) == ['ILSVRC2012_val_00000001.JPEG', 'ILSVRC2012_val_00000002.JPEG']
    with pytest.raises(SystemExit, match='image-net.org'):
        dd.prepare('imagenet', str(tmp_path / 'other'))
    with pytest.raises(SystemExit, match='one label file'):
        dd.prepare('imagenet', str(tmp_path / 'other'),
                   write_zip(tmp_path / 'nolabels.zip', {'ILSVRC2012_val_00000001.JPEG': image_bytes((8, 8))}))
    with pytest.raises(SystemExit, match='evaluation set, kept at its own resolution'):
        dd.prepare('imagenet', str(tmp_path / 'other'), str(tmp_path / 'in.zip'), max_size=64)


def build_test_dataset(config, data_root):
    """The config's test dataset, read from ``data_root`` by the config's own library."""
    from mmengine.config import Config
    from mmengine.registry import DATASETS, init_default_scope
    cfg = Config.fromfile(os.path.join(ROOT, 'configs', config))
    init_default_scope(cfg.default_scope)
    dataset = cfg.test_dataloader.dataset
    dataset.data_root = str(data_root)
    return DATASETS.build(dataset)


def test_real_coco2017_val_reads_as_the_configs_test_set(real_set):
    report, root = real_set('coco2017')
    assert report.splits == {'val2017': {'images': 158, 'instances': 1424}}
    assert not any(report.defects.values())
    coco = load_coco(root / 'annotations' / 'instances_val2017.json')
    assert sum(a['iscrowd'] for a in coco.anns.values()) == 16
    dataset = build_test_dataset('mask_rcnn_laplacian_tiny_1x_coco.py', root)
    assert len(dataset) == 158  # test mode keeps every image, crowd-only ones too


def test_real_ade20k_val_reads_as_the_configs_test_set(real_set):
    report, root = real_set('ade20k')
    assert report.splits == {'validation': {'images': 10}}
    assert not any(report.defects.values())
    dataset = build_test_dataset('upernet_laplacian_tiny_512x512_160k_ade20k.py', root / 'ADEChallengeData2016')
    assert len(dataset) == 10 and dataset.reduce_zero_label
    label = np.asarray(Image.open(dataset.get_data_info(0)['seg_map_path']))
    assert label.min() == 0 and label.max() <= 150


def test_real_imagenet_val_reads_as_the_configs_test_set(real_set):
    report, root = real_set('imagenet')
    assert report.splits == {'val': {'images': 1300}}
    assert not any(report.defects.values())
    dataset = build_test_dataset('laplacianformer_tiny_8xb128_in1k.py', root)
    assert len(dataset) == 1300
    labels = {dataset.get_data_info(i)['gt_label'] for i in range(len(dataset))}
    assert len(labels) == 725 and max(labels) < 1000
