"""write_whole: a file is replaced whole or left as it was."""

import os

import pytest

from minips.results import whole_file
from minips.results.whole_file import partial_path, write_whole


def test_a_file_is_written_whole_in_a_new_folder_and_nothing_is_left_beside_it(tmp_path):
    path = tmp_path / "new" / "summary.json"
    write_whole(path, "{}\n")
    assert path.read_text() == "{}\n"
    assert os.listdir(path.parent) == ["summary.json"]


def test_a_write_cut_before_the_rename_leaves_the_old_content(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old\n")

    def killed(src, dst):
        raise KeyboardInterrupt  # the process stopped between the write and the rename

    monkeypatch.setattr(whole_file.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_whole(path, "new\n")
    assert path.read_text() == "old\n"
    assert partial_path(path).read_text() == "new\n"
    assert partial_path(path).name == ".summary.json.partial"  # what a new run clears
