"""Names a person can use: the server's log says "rank 1 (host, numpy)", a worker says its
rank and host when it joins and its result in words when it ends, a worker that finds the
class full is told about --rank, `minips evaluate` says what it does and what it found,
and `minips report` shows each worker's agent, host and speed. Real processes."""

import json
import re
import select
import socket
import subprocess
import sys
import time

import pytest

from minips.worker.client import PSClient

FAST = ["--model", "mlp", "--dataset", "synthetic", "--epochs", "1"]
HOST = socket.gethostname()


def _minips(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minips", *args], capture_output=True, text=True, timeout=180, **kw
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_a_run_names_its_workers_by_rank_host_and_agent(tmp_path):
    out = tmp_path / "run"
    done = _minips("run", "--workers", "2", *FAST, "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    log = (out / "logs" / "server.log").read_text()
    for rank in (0, 1):
        assert f"rank {rank} ({HOST}, numpy) registered" in log
        worker_log = next(p for p in (out / "logs").glob("worker*.log")
                          if f"joined as rank {rank} of 2" in p.read_text())  # fmt: skip
        assert f"joined as rank {rank} of 2 (host {HOST})" in worker_log.read_text()
    report = _minips("report", str(out))
    assert report.returncode == 0, report.stderr
    header, *rows = [line for line in report.stdout.splitlines() if "samples/s" in line or
                     re.match(r"\s+[01] numpy", line)]  # fmt: skip
    assert header.split()[:4] == ["worker", "agent", "host", "samples/s"]
    assert len(rows) == 2
    for row in rows:
        rank, agent, host, speed = row.split()[:4]
        assert agent == "numpy" and host == HOST[:14] and float(speed) > 0
    (summary,) = json.loads(_minips("report", str(out), "--json").stdout)
    for rank in ("0", "1"):
        worker = summary["workers"][rank]
        assert worker["agent"] == "numpy" and worker["host"] == HOST
        assert worker["samples_per_s"] > 0
    plot = _minips("plot", str(out), "--out", str(tmp_path / "fig.png"))
    assert plot.returncode == 0, plot.stderr
    assert plot.stdout.splitlines() == [  # both files it wrote, each named
        f"accuracy:  {tmp_path / 'fig.png'}",
        f"staleness: {tmp_path / 'fig-staleness.png'}",
    ]
    assert (tmp_path / "fig.png").exists() and (tmp_path / "fig-staleness.png").exists()


def test_a_worker_that_finds_the_class_full_is_told_about_rank(tmp_path):
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "minips", "server", "--bind", endpoint, "--workers", "1", *FAST],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with PSClient(endpoint, timeout=1.0, retries=60) as seat:
            seat.stats()
            seat.hello({"role": "worker", "host": "elsewhere"})  # the one seat
            second = _minips("worker", "--connect", endpoint, "--quiet")
            seat.bye(finished=False)  # else the stopping server waits its grace for the seat
    finally:
        server.terminate()
        server.wait(30)
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert second.stderr.startswith("error: server refused the request (full)")
    assert (
        "start this one with --rank R" in second.stderr and "--heartbeat-timeout" in second.stderr
    )
    assert f"worker on {HOST}: joining {endpoint}" in second.stdout  # said at once, not silent


def test_evaluate_says_what_it_does_and_what_it_found(tmp_path):
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "minips", "server", "--bind", endpoint, "--workers", "1", *FAST],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    metrics = tmp_path / "eval.jsonl"
    try:
        with PSClient(endpoint, timeout=1.0, retries=60) as probe:
            probe.stats()
        evaluator = subprocess.Popen(
            [sys.executable, "-m", "minips", "evaluate", "--connect", endpoint,
             "--metrics", str(metrics), "--interval", "0.2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with PSClient(endpoint, timeout=5.0) as operator:
            operator.stop()
        out, err = evaluator.communicate(timeout=60)
    finally:
        server.kill()
        server.wait(30)
    first, last = out.strip().splitlines()[0], out.strip().splitlines()[-1]
    assert first == f"testing the model of {endpoint} every 0.2 s; records: {metrics}"
    final = json.loads(metrics.read_text().splitlines()[-1])
    assert final["final"]
    assert last == f"test accuracy of the final model: {final['accuracy']:.4f} " \
        f"(loss {final['loss']:.4f})"  # fmt: skip


def test_the_lab_questions_name_columns_the_report_prints():
    from pathlib import Path

    from minips.results.report_text import format_report

    root = Path(__file__).resolve().parents[2]
    notes = (root / "docs" / "instructor-notes.md").read_text()
    guide = (root / "examples" / "07_browser_class.md").read_text()
    section = notes[notes.index("## The browser lab's questions") :]
    report = {
        "path": "runs/x", "complete": True, "evals": 1, "config": {"rule": "asgd"},
        "summary": {"accuracy": 0.8, "wall_s": 10.0},
        "staleness": {"count": 0, "mean": None, "p50": None, "p90": None, "max": None},
        "workers": {},
    }  # fmt: skip
    header = next(line for line in format_report(report).splitlines() if "samples/s" in line)
    columns = header.split()
    for name in ("agent", "host", "samples/s", "mean", "max", "scale"):
        assert name in columns, name
        assert f"`{name}`" in section and f"`{name}`" in guide, name
    assert "accuracy" in format_report(report) and "wall" in format_report(report)


def test_a_worker_started_before_its_server_says_so_at_once():
    endpoint = f"tcp://127.0.0.1:{_free_port()}"  # nobody listens yet
    # "At once": before the first reply timeout, here 600 s, far past the 120 s this test
    # waits (a bound that only catches a hang, whatever the machine's speed).
    worker = subprocess.Popen(
        [sys.executable, "-m", "minips", "worker", "--connect", endpoint, "--quiet",
         "--timeout", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        said, _, _ = select.select([worker.stdout], [], [], 120)
        first = worker.stdout.readline() if said else ""
    finally:
        worker.kill()
        worker.wait(30)
    assert first == f"worker on {HOST}: joining {endpoint} ...\n", first
