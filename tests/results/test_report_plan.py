"""`minips report` says how a run sent its tensors: the plan (its name, the planner's
choice, per parameter push and pull codecs and push interval) and the link it ran behind,
read from the run's own files."""

from __future__ import annotations

import json
import subprocess
import sys

from minips.results.report_plan import link_text, plan_lines, plan_summary


def _minips(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minips", *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_the_report_of_a_planned_run_behind_a_link_shows_the_plan_and_the_link(tmp_path):
    out = tmp_path / "run"
    done = _minips("run", "--model", "mlp", "--dataset", "synthetic", "--workers", "2",
                   "--max-samples", "1000", "--plan", "auto", "--bandwidth", "20mbit",
                   "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = _minips("report", str(out)).stdout
    assert "  link: each worker's own 20mbit (--bandwidth)\n" in text, text
    plan = json.loads((out / "plan.json").read_text())
    chosen = plan["predicted"]["chosen"]
    assert f"  plan auto, the planner's {chosen} choice" in text, text
    for name, entry in plan["params"].items():  # a row per parameter the plan names
        row = next(line.split() for line in text.splitlines() if line.split()[:1] == [name])
        push = entry.get("push", "dense")
        assert row[1] == (push if isinstance(push, str) else push["codec"]), row
    report = json.loads(_minips("report", "--json", str(out)).stdout)[0]
    assert report["plan"]["name"] == "auto" and report["link"].startswith("each worker's own")


def test_a_netem_link_and_a_plan_file_without_prediction_are_named(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps(
        {"format": 1, "params": {"fc1.w": {"push": {"codec": "topk", "ratio": 0.01},
                                           "every": 2}}}))  # fmt: skip
    config = {"plan": "/somewhere/my-plan.json", "netem": "100mbit"}
    report = {"plan": plan_summary(tmp_path, config), "link": link_text(config)}
    lines = plan_lines(report)
    assert lines[0] == "  link: 100mbit at the server, shared by the workers (--netem)"
    assert lines[1] == "  plan /somewhere/my-plan.json; every other parameter dense"
    assert lines[3].split() == ["fc1.w", "topk", "ratio", "0.01", "dense", "2"]
    assert plan_lines({"plan": plan_summary(tmp_path, {"plan": "dense"}), "link": None}) == []
