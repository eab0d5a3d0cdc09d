"""A trained model is never replaced by an older one (minips/ops/checkpoint_keep.py).

A server started on a checkpoint path that holds a checkpoint resumes from it or writes
beside it; the previous file keeps the best earlier version (checkpoint_file.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_server_support import SHAPES, make_params

from minips.ops.checkpoint_file import file_version, previous_path, save_store, write_checkpoint
from minips.ops.ops_options import OpsOptions
from minips.ops.server_ops import ServerOps
from minips.rules import make_rule
from minips.run.config import RunConfig
from minips.server.server import ParameterServer
from minips.state.store import SGD, ParameterStore


def _saved(path: Path, version: int, params=None) -> None:
    """A checkpoint of `params` (the tests' model) at `version` at `path`, keeping the one
    before it."""
    params = make_params() if params is None else params
    store = ParameterStore(params, SGD(params, lr=0.1))
    store.version = version
    save_store(store, path, keep_previous=True)


def _serve_and_stop(path: Path, params=None, **options) -> ParameterServer:
    """A server with checkpoint path `path`, stopped at once (its final checkpoint written)."""
    params = make_params() if params is None else params
    options = OpsOptions(checkpoint_path=path, stop_grace=0.1, **options)
    server = ParameterServer(params, make_rule("asgd"), SGD(params, lr=0.1), options,
                             operations=ServerOps)  # fmt: skip
    try:
        server.request_stop()
        server.run()
    finally:
        server.close()
    return server


def test_a_server_started_on_a_trained_checkpoint_resumes_from_it_and_keeps_both_files(tmp_path):
    path = tmp_path / "checkpoint.npz"
    _saved(path, 11)
    _saved(path, 86)
    for _ in range(2):  # started and stopped twice, as a user trying the README would
        server = _serve_and_stop(path)
        assert server.store.version == 86
        assert server.ops.checkpoints.said.startswith(f"resumed from {path} at version 86")
        assert file_version(path) == 86 and file_version(previous_path(path)) == 86


def test_a_checkpoint_it_cannot_resume_from_is_left_and_the_server_writes_beside_it(tmp_path):
    path = tmp_path / "checkpoint.npz"
    other = {"w": np.zeros((2, 2), np.float32)}  # another model's checkpoint
    _saved(path, 40, other)
    server = _serve_and_stop(path)
    assert (
        server.store.version == 0 and server.ops.checkpoints.path == tmp_path / "checkpoint.2.npz"
    )
    assert server.ops.checkpoints.said.endswith(f"this server's checkpoints go to {tmp_path}/"
                                            "checkpoint.2.npz and it starts untrained, at "
                                            "version 0")  # fmt: skip
    assert file_version(path) == 40 and file_version(tmp_path / "checkpoint.2.npz") == 0
    assert sorted(np.load(path).files) == sorted(["meta", "version", "param/w", "param_version/w"])


def test_a_damaged_checkpoint_is_passed_over_for_the_whole_one_before_it(tmp_path):
    """As a run's crash recovery does: the newest whole file, said in one line; the
    server's checkpoints then replace the damaged file, the previous one staying."""
    path = tmp_path / "checkpoint.npz"
    _saved(path, 24)
    _saved(path, 96)
    os.truncate(path, path.stat().st_size // 2)
    server = _serve_and_stop(path)
    assert server.store.version == 24 and server.ops.checkpoints.path == path
    said = server.ops.checkpoints.said
    assert said.startswith(f"{path} is damaged: resumed from {previous_path(path)} at version 24")
    assert file_version(path) == 24 and file_version(previous_path(path)) == 24
    assert not (tmp_path / "checkpoint.2.npz").exists()


def test_with_no_whole_checkpoint_the_server_says_it_starts_untrained(tmp_path):
    path = tmp_path / "checkpoint.npz"
    _saved(path, 24)
    _saved(path, 96)
    for damaged in (path, previous_path(path)):
        os.truncate(damaged, damaged.stat().st_size // 2)
    server = _serve_and_stop(path)
    assert server.store.version == 0
    said = server.ops.checkpoints.said
    assert said.startswith(f"{path} is left as it is (checkpoint {path} is damaged"), said
    assert said.endswith("checkpoint.2.npz and it starts untrained, at version 0"), said


def test_resuming_from_an_older_checkpoint_writes_beside_the_newer_one(tmp_path):
    path = tmp_path / "checkpoint.npz"
    _saved(path, 5)
    _saved(path, 9)
    server = _serve_and_stop(path, resume=previous_path(path))
    assert server.store.version == 5 and "holds version 9" in server.ops.checkpoints.said
    assert file_version(path) == 9 and file_version(previous_path(path)) == 5
    assert file_version(tmp_path / "checkpoint.2.npz") == 5


def test_resuming_from_the_checkpoint_path_itself_says_nothing(tmp_path):
    path = tmp_path / "checkpoint.npz"
    _saved(path, 3)
    server = _serve_and_stop(path, resume=path)
    assert server.ops.checkpoints.said is None and server.ops.checkpoints.path == path


def _arrays(version: int) -> dict[str, np.ndarray]:
    arrays = {"version": np.array(version, np.int64), "meta": np.array("{}")}
    for name, shape in SHAPES.items():
        arrays[f"param/{name}"] = np.zeros(shape, np.float32)
        arrays[f"param_version/{name}"] = np.array(0, np.int64)
    return arrays


def test_the_previous_file_keeps_the_best_earlier_version(tmp_path):
    path = tmp_path / "c.npz"
    for version in (10, 20):
        write_checkpoint(path, _arrays(version), keep_previous=True)
    assert (file_version(path), file_version(previous_path(path))) == (20, 10)
    write_checkpoint(path, _arrays(20), keep_previous=True)  # the same version again
    assert (file_version(path), file_version(previous_path(path))) == (20, 20)
    write_checkpoint(path, _arrays(5), keep_previous=True)  # written over on purpose
    assert (file_version(path), file_version(previous_path(path))) == (5, 20)
    write_checkpoint(path, _arrays(6), keep_previous=True)  # 5 < 20: the previous stays
    assert (file_version(path), file_version(previous_path(path))) == (6, 20)
    path.write_bytes(b"PK\x03\x04 damaged")
    write_checkpoint(path, _arrays(7), keep_previous=True)  # a damaged one pushes out nothing
    assert (file_version(path), file_version(previous_path(path))) == (7, 20)


def test_a_writer_killed_before_the_new_file_is_renamed_in_leaves_the_latest_in_place(
    tmp_path, monkeypatch
):
    path = tmp_path / "c.npz"
    write_checkpoint(path, _arrays(10), keep_previous=True)
    real_replace = os.replace

    def killed_before_the_last_rename(src, dst):
        if Path(dst) == path:
            raise KeyboardInterrupt  # SIGKILL, OOM: the process ends here
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_before_the_last_rename)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(path, _arrays(20), keep_previous=True)
    monkeypatch.undo()
    assert (file_version(path), file_version(previous_path(path))) == (10, 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz", "c.prev.npz"]


def test_minips_server_on_a_runs_config_keeps_its_trained_model(tmp_path):
    """`minips server --config RUN/config.json`, stopped with SIGINT twice (issue 34)."""
    checkpoint = tmp_path / "checkpoint.npz"
    config = RunConfig(model="mlp", workers=1, checkpoint=str(checkpoint),
                       bind="tcp://127.0.0.1:*")  # fmt: skip
    (tmp_path / "config.json").write_text(config.to_json())
    from minips.run.build import make_server

    for version in (4, 12):  # a trained model at 12, the one before it at 4
        server = make_server(config)
        server.store.version = version
        server.ops.checkpoints.save()
        server.close()
    for _ in range(2):
        server = subprocess.Popen(
            [sys.executable, "-m", "minips", "server", "--config", str(tmp_path / "config.json")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        first = server.stdout.readline()
        said = server.stdout.readline()
        assert first.startswith("minips server on "), first
        assert said.startswith(f"resumed from {checkpoint} at version 12"), said
        time.sleep(0.2)
        server.send_signal(signal.SIGINT)
        rest, _ = server.communicate(timeout=60)
        assert server.returncode == 0, rest
        assert "version 12" in rest
        assert file_version(checkpoint) == 12 and file_version(previous_path(checkpoint)) == 12
