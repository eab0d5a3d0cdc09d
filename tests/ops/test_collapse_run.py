"""A collapse seen by real processes: `minips run --workers 2 --lr 3` (LeNet-5 on the sample
diverges at once) says so while it runs, stops early, exits with status 3 and records it;
a by-hand `minips server` logs the same line."""

import json
import os
import subprocess
import sys
import threading
import time

from test_by_hand_processes import _finish, _free_port, _minips

from minips.cli.ps_cmd import COLLAPSED


def _lines_with_times(stream, into):
    for line in stream:
        into.append((time.monotonic(), line.rstrip("\n")))


def test_minips_run_with_a_learning_rate_far_too_large_stops_early_and_says_so(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--workers", "2", "--lr", "3", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=_lines_with_times, args=(proc.stdout, lines))
    reader.start()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == COLLAPSED, err
    reader.join()
    said = [(at, line) for at, line in lines if line.startswith("collapsed: ")]
    assert len(said) == 1, lines  # one line, while the run went (then the summary lines)
    assert "try a smaller --lr than 3" in said[0][1]
    assert "Traceback" not in err and "Traceback" not in "".join(line for _, line in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["collapse"]["line"] == said[0][1] and summary["ended"] == "collapsed"
    assert summary["collapse"]["sign"] in ("nonfinite", "loss", "accuracy")
    # Stopped early (not the 5 epochs of 2 workers): the measure of "within the first
    # seconds" that does not depend on the machine's speed.
    assert summary["samples"] < 5 * 5500
    assert lines[-1][1] == f"stopped early, exit status {COLLAPSED}: {said[0][1]}"
    report = subprocess.run(
        [sys.executable, "-m", "minips", "report", str(out)], capture_output=True, text=True
    )
    assert "COLLAPSED, stopped after" in report.stdout


def test_a_by_hand_server_logs_the_collapse_in_the_same_line(tmp_path):
    port = _free_port()
    server = _minips(
        ["server", "--bind", f"tcp://127.0.0.1:{port}", "--workers", "2", "--lr", "3",
         "--epochs", "1"],
        tmp_path,
    )  # fmt: skip
    time.sleep(1)
    workers = [
        _minips(["worker", "--connect", f"tcp://127.0.0.1:{port}", "--quiet"], tmp_path)
        for _ in range(2)
    ]
    for worker in workers:
        _finish(worker, timeout=300)
    _, err = _finish(server, timeout=120)  # every rank finished: it stops by itself
    logged = [line for line in err.splitlines() if "collapsed: " in line]
    assert len(logged) == 1, err
    assert logged[0].split("collapsed: ", 1)[1].endswith("try a smaller --lr than 3 (e.g. 0.3)")
