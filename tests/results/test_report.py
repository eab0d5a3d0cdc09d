"""`minips report` and `minips plot`, over real and hand-written runs.

One real local run (module-scoped: processes are the slow part) feeds the report, CLI and
plot tests; hand-written metrics files with known staleness values pin down the numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from minips.cli import cli
from minips.errors import MissingExtraError, RunDirError
from minips.results.loading import load_run
from minips.results.report import (
    bin_label,
    histogram,
    percentile,
    summarize,
    time_to_target,
)
from minips.results.report_text import format_report
from minips.run.config import RunConfig
from minips.run.launch import run_local

REPO = Path(__file__).resolve().parents[2]
FAST = {"model": "mlp", "dataset": "synthetic", "lr": 0.05, "momentum": 0.5, "rule": "asgd"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """One real 2-worker asgd run with a 3x straggler: shared by every test below.

    Small batches make it last about a second, so both workers usually overlap (on a busy
    machine one may finish before the other registers; the tests only assume what the logs
    say, not which ranks ran).
    """
    out = tmp_path_factory.mktemp("run") / "asgd-hetero"
    spec = RunConfig(epochs=1, batch_size=16, workers=2, hetero=[1.0, 3.0], **FAST)
    run_local(spec, out, eval_interval=0.5)
    return out


def _update(version: int, workers: list[int], staleness: list[int], **extra) -> dict:
    return {"event": "update", "time": 0.1 * version, "version": version, "rule": "asgd",
            "workers": workers, "staleness": staleness, "scale": 1.0, **extra}  # fmt: skip


@pytest.fixture
def written_run(tmp_path) -> Path:
    """A run directory written by hand: worker 0 pushes tau 0..9, worker 1 always 20."""
    records = [_update(v, [0], [v]) for v in range(10)]
    records += [_update(10 + v, [1], [20], scale=0.05) for v in range(4)]
    records.append(_update(14, [0, 1], [0, 1], scale={"fc.w": 0.5, "fc.b": 1.0}))
    records += [
        {"event": "eval", "time": 0.5, "samples": 100, "updates": 5, "accuracy": 0.5,
         "loss": 1.0, "final": False},
        {"event": "eval", "time": 2.0, "samples": 900, "updates": 15, "accuracy": 0.9,
         "loss": 0.3, "final": True},
        {"event": "worker", "time": 1.5, "rank": 0, "slowdown": 1.0, "steps": 11, "samples": 700},
        {"event": "worker", "time": 1.5, "rank": 1, "slowdown": 4.0, "steps": 5, "samples": 300},
        {"event": "summary", "accuracy": 0.9, "loss": 0.3, "wall_s": 1.5, "samples": 1000,
         "updates": 15, "bytes_up": 2_500_000, "bytes_down": 1500, "rule": "asgd"},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "config.json").write_text(json.dumps({"rule": "asgd", "workers": 2}))
    return tmp_path


def test_percentile_is_nearest_rank():
    values = list(range(10))  # 0..9
    assert percentile(values, 50) == 4 and percentile(values, 90) == 8
    assert percentile(values, 100) == 9 and percentile(values, 0) == 0
    assert percentile([7], 90) == 7
    assert percentile([3, 1, 2], 50) == 2  # order does not matter


def test_histogram_bins_are_exact_then_powers_of_two():
    assert [bin_label(v) for v in (0, 3, 4, 7, 8, 20)] == ["0", "3", "4-7", "4-7", "8-15", "16-31"]
    assert histogram([0, 0, 2, 9]) == {"0": 2, "1": 0, "2": 1, "3": 0, "4-7": 0, "8-15": 1}
    assert histogram([]) == {}


def test_known_staleness_gives_known_percentiles(written_run):
    report = summarize(load_run(written_run), target=0.85)
    w0, w1 = report["workers"]["0"], report["workers"]["1"]
    # worker 0: tau 0..9 alone, then 0 in the shared update -> 11 pushes
    assert w0["staleness"] == {
        "count": 11, "mean": 45 / 11, "p50": 4, "p90": 8, "max": 9,
        "histogram": {"0": 2, "1": 1, "2": 1, "3": 1, "4-7": 4, "8-15": 2},
    }  # fmt: skip
    assert (w1["staleness"]["count"], w1["staleness"]["p50"], w1["staleness"]["max"]) == (5, 20, 20)
    assert w1["staleness"]["histogram"]["1"] == 1 and w1["staleness"]["histogram"]["16-31"] == 4
    assert report["staleness"]["count"] == 16 and report["staleness"]["max"] == 20
    assert w1["slowdown"] == 4.0 and w0["steps"] == 11
    assert w1["scale_mean"] == pytest.approx((4 * 0.05 + 0.75) / 5)  # a per-layer scale: its mean
    # reached 0.9 only at the final evaluation (t=2.0), credited to the end of training
    assert report["target"] == {"accuracy": 0.85, "reached": {"time": 1.5, "samples": 900}}
    text = format_report(report)
    assert "reached 0.85 at 1.50 s" in text and "bytes up 2.5 MB  down 1.5 kB" in text
    assert "16-31:4" in text


def test_time_to_target():
    evals = [
        {"time": 1, "samples": 10, "accuracy": 0.2},
        {"time": 2, "samples": 20, "accuracy": 0.8},
    ]
    assert time_to_target(evals, 0.5) == {"time": 2, "samples": 20}
    assert time_to_target(evals, 0.95) is None


def test_value_staleness_and_dropped_updates(tmp_path):
    records = [
        _update(1, [0], [1], value_staleness={"fc1": 0.5, "fc2": 2.0}, dropped=False),
        _update(2, [1], [3], value_staleness={"fc1": 1.5, "fc2": 4.0}, dropped=True),
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report = summarize(load_run(tmp_path))
    assert report["value_staleness"]["fc1"]["mean"] == 1.0
    assert report["value_staleness"]["fc2"]["max"] == 4.0
    assert report["dropped"] == 1
    assert "value staleness per layer" in format_report(report)


def test_an_interrupted_run_is_read_from_its_partial_logs(tmp_path):
    (tmp_path / "updates.jsonl").write_text(json.dumps(_update(1, [0], [2])) + "\n")
    (tmp_path / "eval.jsonl").write_text(
        json.dumps({"event": "eval", "time": 0.3, "samples": 64, "accuracy": 0.4}) + "\n"
    )
    report = summarize(load_run(tmp_path))
    assert not report["complete"] and report["summary"]["accuracy"] == 0.4
    assert report["workers"]["0"]["staleness"]["max"] == 2
    assert "INCOMPLETE" in format_report(report)
    # A server restarted after a crash logs to updates-1.jsonl: its updates count too.
    (tmp_path / "updates-1.jsonl").write_text(json.dumps(_update(2, [1], [5])) + "\n")
    report = summarize(load_run(tmp_path))
    assert report["summary"]["updates"] == 2 and report["workers"]["1"]["staleness"]["max"] == 5
    # No server left its final count (killed): the samples are the last evaluation's, said so.
    assert report["summary"]["samples"] == 64
    assert "samples 64 (the last evaluation's count; the server left none)" in format_report(report)


def test_missing_and_non_run_directories_are_one_line_errors(tmp_path):
    with pytest.raises(RunDirError, match="no such run directory"):
        load_run(tmp_path / "nope")
    with pytest.raises(RunDirError, match="not a run directory"):
        load_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(RunDirError, match="not `minips train --metrics` output; give a run dir"):
        load_run(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text("{not json\n")
    with pytest.raises(RunDirError, match="not valid JSON"):
        load_run(tmp_path)


def test_report_of_a_real_run_agrees_with_its_summary(real_run):
    summary = json.loads((real_run / "summary.json").read_text())
    report = summarize(load_run(real_run))
    assert report["complete"]
    ranks = {str(w["rank"]) for w in load_run(real_run).events("worker")}
    assert set(report["workers"]) == ranks and "0" in ranks
    for rank, worker in report["workers"].items():
        assert worker["slowdown"] == [1.0, 3.0][int(rank)]
    pushes = sum(w["staleness"]["count"] for w in report["workers"].values())
    assert pushes == report["staleness"]["count"] == summary["updates"]  # asgd: 1 push, 1 update
    assert report["staleness"]["max"] == summary["staleness_max"]
    assert report["staleness"]["mean"] == pytest.approx(summary["staleness_mean"])


def test_cli_report_text_and_json(real_run, written_run):
    result = CliRunner().invoke(cli, ["report", str(real_run), str(written_run)])
    assert result.exit_code == 0, result.output
    assert result.output.count("== ") == 2 and "clock staleness per push" in result.output
    result = CliRunner().invoke(cli, ["report", "--json", "--target", "0.5", str(real_run)])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.output)
    assert report["run"] == "asgd-hetero" and report["target"]["reached"] is not None


def _minips(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minips", *args], capture_output=True, text=True, timeout=60
    )


def test_report_as_a_real_process(real_run, tmp_path):
    done = _minips("report", str(real_run))
    assert done.returncode == 0, done.stderr
    assert "accuracy" in done.stdout and "worker" in done.stdout
    done = _minips("report", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {tmp_path}: not a run directory (no metrics.jsonl; make one with "
        "`minips run --out DIR`)"
    ]


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000


def test_plot_writes_two_pngs_headless(real_run, written_run, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.delenv("DISPLAY", raising=False)
    out = tmp_path / "figs" / "cmp.png"
    result = CliRunner().invoke(
        cli, ["plot", str(real_run), str(written_run), "--out", str(out), "--target", "0.9"]
    )
    assert result.exit_code == 0, result.output
    assert _is_png(out) and _is_png(tmp_path / "figs" / "cmp-staleness.png")


def test_plot_without_matplotlib_says_how_to_get_it(real_run, tmp_path, monkeypatch):
    from minips.results.plot import plot_accuracy

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` -> ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'minips\[plot\]'"):
        plot_accuracy([load_run(real_run)], tmp_path / "x.png")
