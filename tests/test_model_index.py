"""mim's model index: ``model-index.yml`` imports one metafile per model family (configs/metafiles/),
and each config in configs/*.py is exactly one model there, with its parameters and FLOPs; the
collections the models name exist, with their paper and page. The paths are relative to the folder of
``model-index.yml`` (the checkout's root, or ``mmlinattn/.mim`` installed, where setup.py puts it next
to ``.mim/configs``): :func:`check_model_index` reads either (test_packaging.py checks the build with it).
``mim search mmlinattn`` parses the files with the ``modelindex`` package, which the last test uses too."""
import glob
import re
import os
from collections import Counter

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINING_DATA = {'ImageNet-1k', 'COCO', 'ADE20K'}


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_model_index(root):
    """Read ``root/model-index.yml`` and its metafiles with plain YAML, assert that every import and
    every model's config exists under ``root``, and return ``(collections, models)``: lists of dicts."""
    index_path = os.path.join(root, 'model-index.yml')
    assert os.path.isfile(index_path), index_path
    with open(index_path) as f:
        index = yaml.safe_load(f)
    assert set(index) == {'Import'}, sorted(index)
    imports = index['Import']
    assert imports and len(set(imports)) == len(imports), imports
    collections, models = [], []
    for relpath in imports:
        path = os.path.join(root, relpath)
        assert os.path.isfile(path), f'model-index.yml imports {relpath}, which is not in {root}'
        with open(path) as f:
            metafile = yaml.safe_load(f)
        assert set(metafile) == {'Collections', 'Models'}, (relpath, sorted(metafile))
        collections += metafile['Collections']
        models += metafile['Models']
    for model in models:
        config = model.get('Config')
        path = os.path.join(root, config) if isinstance(config, str) else None
        assert path and os.path.isfile(path), (model.get('Name'), config)
    return collections, models


@pytest.fixture(scope='module')
def index():
    return check_model_index(ROOT)


def test_every_config_is_one_model_named_as_the_config(index):
    _, models = index
    configs = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, 'configs', '*.py')))
    assert len(configs) >= 31, configs
    names = Counter(model['Name'] for model in models)
    assert [n for n, count in names.items() if count > 1] == []
    assert sorted(names) == configs  # none missing, none for a config that is not there
    for model in models:
        assert model['Config'] == f'configs/{model["Name"]}.py', model


def test_models_are_in_existing_collections(index):
    collections, models = index
    names = [c['Name'] for c in collections]
    assert len(set(names)) == len(names), names
    for model in models:
        assert model['In Collection'] in names, (model['Name'], model['In Collection'])
    assert {m['In Collection'] for m in models} == set(names)  # no collection without a model
    for collection in collections:
        assert collection['Paper']['Title'] and collection['Paper']['URL'].startswith('https://'), collection
        # relative to the root, as mmdet's and mmpretrain's (docs/ is not installed, so only here)
        assert os.path.isfile(os.path.join(ROOT, collection['README'])), collection['README']
        data = collection['Metadata']['Training Data']
        assert set(data) <= TRAINING_DATA, data


def test_models_have_parameters_flops_and_no_invented_results(index):
    _, models = index
    for model in models:
        meta = model['Metadata']
        # absolute counts, as mmpretrain writes them: a value in M or G would be a unit slip
        assert _is_number(meta['Parameters']) and 1e6 <= meta['Parameters'] <= 1e9, (model['Name'], meta)
        assert _is_number(meta['FLOPs']) and 1e8 <= meta['FLOPs'] <= 1e13, (model['Name'], meta)
        assert meta['Training Data'] in TRAINING_DATA, (model['Name'], meta)
        # nothing is trained yet: Weights only as a real file's address, Results only with metrics
        assert 'Weights' not in model or str(model['Weights']).startswith('https://'), model
        for result in model.get('Results', []):
            assert result['Task'] and result['Dataset'] and result['Metrics'], model


def test_modelindex_loads_the_index(index):
    """The reader mim uses; it reports unreadable imports and unknown collections as check errors.
    Its check takes a README path as relative to the metafile, so those (root-relative, as in mmdet's
    metafiles, and checked above) are the one kind of error expected."""
    pytest.importorskip('modelindex', reason="the modelindex package (mim's model-index) is not installed")
    from modelindex.load_model_index import load
    collections, models = index
    loaded = load(os.path.join(ROOT, 'model-index.yml'))
    assert [m.name for m in loaded.models] == [m['Name'] for m in models]
    assert [c.name for c in loaded.collections] == [c['Name'] for c in collections]
    for model, raw in zip(loaded.models, models):
        assert model.config == raw['Config'] and model.in_collection == raw['In Collection']
        assert model.metadata.parameters == raw['Metadata']['Parameters']
        assert model.metadata.flops == raw['Metadata']['FLOPs']
    errors = [(e['filepath'], error) for e in loaded.collect_check_errors() for error in e['errors']]
    readme_errors = {f'Path to README file {c["README"]} is not a valid file.' for c in collections}
    assert [e for e in errors if e[1] not in readme_errors] == []


def test_readme_models_tables_show_the_metafiles_numbers(index):
    """The README's Models tables and the metafiles carry the same params and FLOPs (both are read by
    users: the tables on the page, the metafiles through mim search); a number changed in one place
    only fails here."""
    with open(os.path.join(ROOT, 'README.md')) as f:
        readme = f.read()
    models_section = readme[readme.index('## Models'):readme.index('## Ops')]
    shown = set(re.findall(r'\d+\.\d+', models_section))
    _, models = index
    for model in models:
        params = f'{model["Metadata"]["Parameters"] / 1e6:.2f}'
        gflops = model['Metadata']['FLOPs'] / 1e9
        assert params in shown, (model['Name'], params)
        assert {f'{gflops:.2f}', f'{gflops:.1f}'} & shown, (model['Name'], gflops)
