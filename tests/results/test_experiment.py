"""tools/experiment.py, the grid of rules x settings x seeds: a real quick grid whose table
is checked against the runs' own summaries, and the cell arithmetic on hand-made rows."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from minips.results.experiment_settings import FULL, QUICK
from minips.results.experiment_table import aggregate, cells_of, overview_table, pm

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _experiment(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "experiment.py"), "--quick", "--out", str(out),
         "--settings", "homogeneous,noniid-0.1", "--seeds", "0,1", *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, "MPLBACKEND": "Agg"},
    )  # fmt: skip


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000


def test_experiment_quick_grid(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "grid"
    # One rule (4 real `minips run`s): how rules split into cells is test_cells_of_...'s.
    done = _experiment(out, "--rules", "asgd,no-such-rule", "--lr", "0.02")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipping rule 'no-such-rule'" in done.stdout
    table = (out / "results.md").read_text()
    cells = json.loads((out / "results.json").read_text())["cells"]
    for setting in ("homogeneous", "noniid-0.1"):
        for rule in ("asgd",):
            # the cell's figures, recomputed from what the runs themselves wrote
            runs = [out / "runs" / f"{setting}-{rule}-s{seed}" for seed in (0, 1)]
            summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
            config = json.loads((runs[0] / "config.json").read_text())
            assert config["partition"] == ("iid" if setting == "homogeneous" else "dirichlet:0.1")
            accuracy = [s["accuracy"] for s in summaries]
            mean, sd = statistics.mean(accuracy), statistics.stdev(accuracy)
            (cell,) = [c for c in cells[setting] if c["rule"] == rule]
            assert cell["accuracy"] == accuracy and cell["seeds"] == [0, 1]
            assert cell["accuracy_mean"] == pytest.approx(mean)
            assert cell["accuracy_sd"] == pytest.approx(sd)
            assert (
                f"| {rule} | {mean:.4f} ± {sd:.4f} | {accuracy[0]:.4f}, {accuracy[1]:.4f} |"
                in table
            )
        assert _is_png(out / f"accuracy-{setting}.png")
        assert _is_png(out / f"staleness-{setting}.png")
    assert _is_png(out / "grid.png")
    assert "| rule | homogeneous | noniid-0.1 |" in table and "no-such-rule" not in table
    assert "time to 0.9 (s), mean ± sd" in table
    again = _experiment(out, "--rules", "asgd", "--lr", "0.02")  # an interrupted grid resumes
    assert again.returncode == 0 and again.stdout.count("reusing") == 4, again.stdout


def test_experiment_unknown_setting_is_one_line(tmp_path):
    done = _experiment(tmp_path / "grid", "--settings", "cloudy")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: unknown setting(s) cloudy (known: {', '.join(QUICK)})"
    ]
    assert not (tmp_path / "grid").exists()


def _row(seed: int, accuracy: float | None, time: float | None = None, rule="asgd") -> dict:
    if accuracy is None:
        return {"rule": rule, "seed": seed, "error": "collapsed"}
    return {"rule": rule, "seed": seed, "accuracy": accuracy, "time_to_target": time,
            "wall_s": 10.0, "staleness_mean": 1.0}  # fmt: skip


def test_cell_mean_sd_time_and_failures():
    cell = aggregate([_row(0, 0.80, 12.0), _row(1, 0.84), _row(2, 0.88, 8.0), _row(3, None)])
    assert cell["accuracy_mean"] == pytest.approx(0.84)
    assert cell["accuracy_sd"] == pytest.approx(0.04)
    assert (cell["runs"], cell["failed"], cell["reached"]) == (4, 1, 2)
    assert cell["time_to_target_mean"] == pytest.approx(10.0)
    assert overview_table({"stale": [cell]})[-1] == "| asgd | 0.8400 ± 0.0400 (1 failed) |"


def test_cells_of_a_setting_one_per_rule_in_the_order_rules_first_appear():
    rows = [_row(0, 0.5, rule="ssgd"), _row(0, 0.7), _row(1, 0.6, rule="ssgd"), _row(1, 0.9)]
    cells = cells_of(rows)
    assert [(c["rule"], c["seeds"], c["accuracy"]) for c in cells] == [
        ("ssgd", [0, 1], [0.5, 0.6]), ("asgd", [0, 1], [0.7, 0.9]),
    ]  # fmt: skip


def test_one_seed_has_no_sd():
    cell = aggregate([_row(0, 0.5)])
    assert cell["accuracy_sd"] is None and pm(0.5, None) == "0.5000 (1 seed)"
    assert pm(None, None) == "-"


def test_the_full_and_quick_grids_have_the_same_seven_settings():
    assert set(FULL) == set(QUICK) == {
        "homogeneous", "heterogeneous", "fluctuating", "heavy-tailed", "noniid-0.1",
        "noniid-1.0", "stale",
    }  # fmt: skip
    assert FULL["noniid-0.1"].options() == "--workers 4 --partition dirichlet:0.1"
    assert FULL["stale"].workers == 8
