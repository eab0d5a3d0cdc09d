"""The machine's datasets (the look-up order: data_dir alone, else the system and cache
directories, else the bundled sample; the install hints) are found by provision's
find_data, which every builder gives the core's loader; the core alone looks only in
data_dir and the bundled sample."""

import inspect

import pytest
from test_data_datasets import load, write_fake_dataset

import minips
from minips import trainer
from minips.classroom.web import shards
from minips.cli import client_cmd
from minips.data import IDX_FILES, SAMPLE_DIR, load_dataset
from minips.data.synthetic import make_synthetic
from minips.errors import ConfigError, DataError
from minips.provision.fetch import write_idx
from minips.provision.locations import find_data, find_dataset
from minips.results import evaluator
from minips.run import final_test, outcome, training_watch


def test_the_core_looks_only_in_data_dir_and_the_bundled_sample(tmp_path, monkeypatch):
    write_fake_dataset(tmp_path / "system" / "mnist")
    monkeypatch.setenv("MINIPS_SYSTEM_DATA", str(tmp_path / "system"))
    monkeypatch.setenv("MINIPS_DATA", str(tmp_path / "cache"))
    with pytest.raises(DataError, match="looked in nowhere"):
        load_dataset("mnist")
    assert load_dataset("mnist", find=find_data).source == str(tmp_path / "system" / "mnist")
    assert load_dataset("sample").source == str(SAMPLE_DIR)
    assert load_dataset("mnist", tmp_path / "system").source == str(tmp_path / "system" / "mnist")


def test_find_data_words_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIPS_SYSTEM_DATA", str(tmp_path / "system"))
    monkeypatch.setenv("MINIPS_DATA", str(tmp_path / "cache"))
    with pytest.raises(DataError) as info:
        load_dataset("mnist", find=find_data)
    assert str(info.value) == (
        f"dataset 'mnist' not found (looked in {tmp_path}/system/mnist, {tmp_path}/cache/mnist); "
        "run `minips data download mnist` or pass --data-dir DIR"
    )


def test_every_builder_gives_the_loader_find_data():
    assert inspect.signature(minips.Worker).parameters["find_data"].default is find_data
    assert '"find_data": find_data' in inspect.getsource(client_cmd)
    assert "dataset_from_hello(config, data_dir, find_data)" in inspect.getsource(evaluator)
    for module in (final_test, training_watch, outcome, shards, trainer):
        assert "find=find_data" in inspect.getsource(module), module.__name__


@pytest.fixture
def places(tmp_path):
    """Separate, initially empty data_dir / system / cache roots."""
    roots = {k: tmp_path / k for k in ("data_dir", "system", "cache")}
    for root in roots.values():
        root.mkdir()
    return roots


def lookup(name, places, data_dir=False, **kw):
    """find_dataset with the fixture's roots; `data_dir`: pass places["data_dir"] too."""
    given = places["data_dir"] if data_dir else None
    return find_dataset(name, given, system_dir=places["system"], cache_dir=places["cache"], **kw)


def test_lookup_order_data_dir_alone_else_system_then_cache(places):
    write_fake_dataset(places["data_dir"] / "mnist", n_train=30)
    write_fake_dataset(places["system"] / "mnist", n_train=40)
    write_fake_dataset(places["cache"] / "mnist", n_train=50)
    assert lookup("mnist", places, data_dir=True) == str(places["data_dir"] / "mnist")
    assert len(load("mnist", places, data_dir=True).y_train) == 30

    (places["data_dir"] / "mnist" / "t10k-labels-idx1-ubyte.gz").unlink()  # now incomplete
    # An explicit data_dir is authoritative: no silent fallback to other data.
    assert lookup("mnist", places, data_dir=True) is None
    with pytest.raises(DataError, match="is the only place looked in"):
        load("mnist", places, data_dir=True)
    assert lookup("mnist", places) == str(places["system"] / "mnist")
    assert len(load("mnist", places).y_train) == 40

    (places["system"] / "mnist" / "train-images-idx3-ubyte.gz").unlink()
    ds = load("mnist", places)
    assert ds.source == str(places["cache"] / "mnist") and len(ds.y_train) == 50


def test_data_dir_may_hold_the_files_directly(places):
    write_fake_dataset(places["data_dir"], n_train=30)
    assert lookup("fashion-mnist", places, data_dir=True) == str(places["data_dir"])
    # ... but a bare directory of files is never mistaken for the bundled sample.
    assert lookup("sample", places, data_dir=True) is None
    assert lookup("sample", places) == str(SAMPLE_DIR)


def test_raw_files_are_found_too(places):
    directory = places["cache"] / "fashion-mnist"
    directory.mkdir()
    for stem, array in zip(IDX_FILES.values(), make_synthetic(0, 20, 10), strict=True):
        write_idx(directory / stem, array)
    assert len(load("fashion-mnist", places).y_test) == 10


def test_environment_overrides_system_and_cache(tmp_path, monkeypatch):
    write_fake_dataset(tmp_path / "sys" / "mnist")
    write_fake_dataset(tmp_path / "cache" / "fashion-mnist")
    monkeypatch.setenv("MINIPS_SYSTEM_DATA", str(tmp_path / "sys"))
    monkeypatch.setenv("MINIPS_DATA", str(tmp_path / "cache"))
    assert find_dataset("mnist") == str(tmp_path / "sys" / "mnist")
    assert find_dataset("fashion-mnist") == str(tmp_path / "cache" / "fashion-mnist")


@pytest.mark.parametrize(
    "name, hint",
    [
        ("mnist", "minips data download mnist"),
        ("fashion-mnist", "apt-get install dataset-fashion-mnist"),
    ],
)
def test_missing_dataset_says_where_it_looked_and_what_to_do(places, name, hint):
    assert lookup(name, places) is None
    with pytest.raises(DataError) as exc:
        load(name, places)
    message = str(exc.value)
    assert "\n" not in message
    assert f"dataset {name!r} not found" in message and hint in message
    for root in (places["system"], places["cache"]):
        assert str(root / name) in message


def test_missing_message_names_the_missing_files_of_an_incomplete_set(places):
    write_fake_dataset(places["cache"] / "mnist")
    (places["cache"] / "mnist" / "t10k-images-idx3-ubyte.gz").unlink()
    with pytest.raises(DataError) as exc:
        load("mnist", places)
    assert f"{places['cache'] / 'mnist'} (missing t10k-images-idx3-ubyte[.gz])" in str(exc.value)
    with pytest.raises(DataError) as exc:
        load("mnist", places, data_dir=True)
    assert f"{places['data_dir']} (no IDX files)" in str(exc.value)


def test_unknown_name_is_a_config_error(places):
    with pytest.raises(ConfigError, match="unknown dataset 'cifar'"):
        load("cifar", places)
    with pytest.raises(ConfigError):
        find_dataset("cifar")
