"""What a new user meets first, each pinned: the message they see, the file they get."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_server_support import running_server

from minips.cli.progress import ProgressBar
from minips.errors import DataError, MissingExtraError, RunDirError
from minips.ops.checkpoint_file import save_store
from minips.results.loading import load_run
from minips.results.metrics import MetricsLog
from minips.results.report import summarize
from minips.results.report_text import format_report
from minips.run.build import make_server
from minips.run.config import RunConfig, TrainConfig
from minips.trainer import train
from minips.worker.client import PSClient

REPO = Path(__file__).resolve().parents[2]
TINY = {"model": "mlp", "dataset": "synthetic", "epochs": 1}


def _cli(*args: str, env: dict | None = None, cwd: Path | None = None):
    env = {**os.environ, **(env or {})}
    argv = [sys.executable, "-m", "minips", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_an_explicit_data_dir_is_the_only_place_looked_in(tmp_path):
    # The bundled sample exists, but --data-dir says where the data is: not found there.
    with pytest.raises(DataError) as caught:
        train(TrainConfig(dataset="sample", data_dir=str(tmp_path / "nonexistent")))
    assert f"looked in {tmp_path / 'nonexistent' / 'sample'})" in str(caught.value)
    assert "--data-dir" in str(caught.value)


def test_a_train_model_starts_a_distributed_run_and_train_continues_a_checkpoint(tmp_path):
    saved = tmp_path / "model.npz"
    model, _ = train(TrainConfig(**TINY, momentum=0.5), save=saved)
    # `minips run --resume model.npz`: the server starts from the single-process model.
    server = make_server(RunConfig(**TINY, resume=str(saved), bind="tcp://127.0.0.1:*"))
    try:
        assert server.store.version == 32  # one update per step of the trainer
        for name, value in model.params.items():
            np.testing.assert_array_equal(server.store.params[name], value)
        assert server.store.optimizer.velocity  # momentum carried over too
        checkpoint = tmp_path / "checkpoint.npz"
        save_store(server.store, checkpoint)
    finally:
        server.close()
    # `minips train --resume checkpoint.npz` continues from the server's checkpoint.
    proc = _cli("train", "--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--quiet",
                "--resume", str(checkpoint), "--save", str(tmp_path / "again.npz"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    meta = np.load(tmp_path / "again.npz")["meta"]
    assert json.loads(str(meta))["spec"]["name"] == "mlp"
    assert int(np.load(tmp_path / "again.npz")["version"]) == 64


def test_report_and_plot_take_trains_metrics_file(tmp_path):
    metrics = tmp_path / "baseline.jsonl"
    with MetricsLog(metrics) as log:
        train(TrainConfig(**TINY), log)
    report = summarize(load_run(metrics))
    assert report["config"]["rule"] == "train" and report["summary"]["accuracy"] > 0.5
    assert "train, 1 worker," in format_report(report)
    proc = _cli("report", str(metrics))
    assert proc.returncode == 0 and "train, 1 worker," in proc.stdout, proc.stderr
    pytest.importorskip("matplotlib")
    proc = _cli("plot", str(metrics), "--out", str(tmp_path / "p.png"))
    assert proc.returncode == 0 and (tmp_path / "p.png").stat().st_size > 0, proc.stderr
    with pytest.raises(RunDirError, match="not `minips train --metrics` output"):
        load_run(tmp_path / "p.png")


def test_a_run_directory_is_fresh_or_refused_and_force_clears_the_old_run(tmp_path):
    out = tmp_path / "run"
    (out / "logs").mkdir(parents=True)
    (out / "worker-3.json").write_text("{}")
    (out / "logs" / "worker-3.log").write_text("old")
    (out / "run.lock").write_text("")  # every run leaves its lock file: a run's folder
    proc = _cli("run", "--out", str(out), "--quiet")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "already holds files" in proc.stderr and "--force" in proc.stderr
    proc = _cli("run", "--out", str(out), "--quiet", "--force", "--model", "mlp",
                "--dataset", "synthetic", "--epochs", "1", "--workers", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not (out / "worker-3.json").exists() and not (out / "logs" / "worker-3.log").exists()
    assert "1 worker" in format_report(summarize(load_run(out)))
    assert "1 workers" not in format_report(summarize(load_run(out)))


def test_progress_off_a_terminal_is_a_line_every_few_seconds(capsys):
    with ProgressBar(interval=3600) as bar:
        for done in range(0, 6001, 64):
            bar.update(done, 6000, {"train_loss": 0.5})
    lines = capsys.readouterr().err.splitlines()
    # The first update and the end: not one line per update (94 updates here).
    assert lines == ["training 0/6000 samples (0%) loss 0.500",
                     "training 5952/6000 samples (99%) loss 0.500"]  # fmt: skip


@pytest.mark.parametrize(
    "args, env, names",
    [
        (["run", "--workers", "abc"], {}, "--workers"),
        (["run"], {"MINIPS_RUN_WORKERS": "abc"}, "MINIPS_RUN_WORKERS"),
        (["train", "--model", "nope"], {}, "--model"),
        (["worker"], {}, "--connect"),
        (["run", "--no-such-option"], {}, "--no-such-option"),
    ],
)
def test_every_click_error_is_one_error_line_naming_the_option_or_variable(args, env, names):
    proc = _cli(*args, env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert names in proc.stderr


def test_help_lists_models_and_datasets_and_mentions_the_variables():
    assert "MINIPS_" in _cli("--help").stdout
    text = _cli("run", "--help").stdout
    for name in ("lenet5", "mlp", "sample", "fashion-mnist", "mnist", "synthetic"):
        assert name in text
    assert "evaluate" in _cli("--help").stdout  # the evaluator is a visible command


def test_observers_are_not_logged_with_a_rank(caplog):
    caplog.set_level(logging.INFO, logger="minips.server")
    with running_server(world_size=4) as server, PSClient(server.endpoint) as evaluator:
        evaluator.hello({"role": "observer"})
        evaluator.bye()
    text = caplog.text
    assert f"observer {evaluator.worker_id} registered" in text
    assert "rank 4" not in text and "(rank" not in text


def test_an_interrupted_runs_report_shows_what_it_knows_of_the_time(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"rule": "asgd", "workers": 2}))
    (tmp_path / "eval.jsonl").write_text(
        json.dumps({"event": "eval", "time": 8.31, "samples": 64, "accuracy": 0.4}) + "\n"
    )
    text = format_report(summarize(load_run(tmp_path)))
    assert "wall - s" not in text and "logged 8.31 s" in text


def test_the_matplotlib_hint_is_the_readmes(monkeypatch):
    import minips.results.plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(MissingExtraError) as caught:
        minips.results.plot._pyplot()
    hint = str(caught.value).split(": ", 1)[1]
    assert hint == "pip install 'minips[plot]'"
    assert f"`{hint}`" in (REPO / "README.md").read_text()
