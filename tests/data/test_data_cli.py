"""`minips data list` and `minips data download`: through CliRunner and as a real process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from minips.cli import cli
from minips.data import IDX_FILES
from minips.data.synthetic import make_synthetic
from minips.provision.fetch import write_idx

FILENAMES = [f"{stem}.gz" for stem in IDX_FILES.values()]


@pytest.fixture
def isolated_env(tmp_path, monkeypatch):
    """Point the system and cache directories at empty temporary folders."""
    env = {"MINIPS_SYSTEM_DATA": str(tmp_path / "system"), "MINIPS_DATA": str(tmp_path / "cache")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_list_shows_where_each_dataset_is(tmp_path, isolated_env):
    data_dir = tmp_path / "mine"
    for name, array in zip(FILENAMES, make_synthetic(0, 20, 10), strict=True):
        (data_dir / "mnist").mkdir(parents=True, exist_ok=True)
        write_idx(data_dir / "mnist" / name, array)
    result = CliRunner().invoke(cli, ["data", "list", "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    rows = dict(line.split(None, 1) for line in result.output.splitlines())
    assert rows == {
        "sample": "not found",  # an explicit --data-dir is the only place looked in
        "fashion-mnist": "not found",
        "mnist": str(data_dir / "mnist"),
        "synthetic": "generated from the seed",
    }


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_minips(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "from minips.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


def test_real_process_list_and_one_line_errors(tmp_path, isolated_env):
    listed = run_minips("data", "list", env=isolated_env)
    assert listed.returncode == 0, listed.stderr
    assert "fashion-mnist" in listed.stdout and "not found" in listed.stdout

    url = f"http://127.0.0.1:{closed_port()}/"
    failed = run_minips(
        "data",
        "download",
        "mnist",
        "--base-url",
        url,
        "--cache-dir",
        str(tmp_path),
        env=isolated_env,
    )
    assert failed.returncode == 2
    assert failed.stderr.startswith("error: could not download http://127.0.0.1:")
    assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr

    unknown = run_minips("data", "download", "cifar", env=isolated_env)
    assert unknown.returncode == 2
    assert unknown.stderr == (
        "error: unknown dataset 'cifar'; choose one of sample, fashion-mnist, mnist, synthetic\n"
    )
