"""The machine's datasets (system and cache directories, the install hints) are found by
provision's find_data, which every builder gives the core's loader; the core alone looks
only in data_dir and the bundled sample."""

import inspect

import pytest
from test_data_datasets import write_fake_dataset

import minips
from minips import trainer
from minips.classroom.web import shards
from minips.cli import client_cmd
from minips.data import SAMPLE_DIR, load_dataset
from minips.errors import DataError
from minips.provision.locations import find_data
from minips.results import evaluator
from minips.run import final_test, launch, outcome


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
    for module in (final_test, launch, outcome, shards, trainer):
        assert "find=find_data" in inspect.getsource(module), module.__name__
