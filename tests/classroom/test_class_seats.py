"""The class as a teacher meets it while seats are empty: one waiting line that names the
free seats and counts down (no `training 0/N` repeated), the progress total by the seats
actually taken, a seat never taken named so in the report and on the dashboard, joined
tabs that wait shown as waiting, and a reloaded tab's totals kept whole. Real processes
where the behaviour is between processes."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
import urllib.request

import pytest
from test_server_support import running_server

from minips.classroom.dashboard.collector import Collector, worker_rows
from minips.classroom.web.slots import SeatWatch
from minips.results.rundir import report_from_stats
from minips.worker.client import PSClient


def _row(rank: int, alive: bool = True, pushes: int = 0, samples: int = 0, **more) -> dict:
    return {"worker": f"w{rank}", "rank": rank, "alive": alive, "finished": False,
            "observer": False, "clock": pushes, "pushes": pushes, "samples": samples,
            "bytes_in": 0, "bytes_out": 0, "info": {"agent": "browser"}, **more}  # fmt: skip


def test_the_waiting_line_names_the_free_seats_counts_down_and_the_total_follows_them():
    watch = SeatWatch(slots=4, join_wait=30.0, started=100.0)
    stats = {"world_size": 4, "uptime": 1.0,
             "workers": [_row(0), _row(1), _row(2, pushes=5, samples=320)]}  # fmt: skip
    watch.update(stats, now=110.0)
    waiting = watch.waiting(stats, now=110.0)
    assert waiting == {"seats": "1 of 4 browser seats (free: rank 3)", "left_s": 20.0,
                       "then": "the run goes on without them"}  # fmt: skip
    # 2000 examples per epoch, 2 epochs: each rank's shard is 500 a pass.
    assert watch.progress_total(stats, 2000, 2, None, now=110.0) == 4000
    watch.update(stats, now=131.0)  # the join wait is over: rank 3 is given up
    assert watch.waiting(stats, now=131.0) is None
    assert watch.free_seats(stats, now=131.0) == {"waited": [], "given_up": [3]}
    # total: three shards whole, none of the seat nobody took
    assert watch.progress_total(stats, 2000, 2, None, now=131.0) == 3000
    assert watch.progress_total(stats, 2000, 2, 2500, now=131.0) == 2500
    # a tab that left is waited for from when it left, then counts what it trained
    gone = {**stats, "workers": [_row(0), _row(1), _row(2, alive=False, pushes=5, samples=320)]}
    watch = SeatWatch(slots=3, join_wait=30.0, started=0.0)
    gone["world_size"] = 3
    watch.update(gone, now=200.0)
    assert watch.waiting(gone, now=210.0)["seats"] == (
        "1 of 3 browser seats (free: rank 2 (its browser left))"
    )
    watch.update(gone, now=231.0)
    assert watch.free_seats(gone, now=231.0)["given_up"] == [2]


def test_the_dashboard_shows_joined_tabs_and_empty_seats_waiting_then_never_taken():
    stats = {
        "world_size": 3,
        "uptime": 5.0,
        "samples": 0,
        "updates": 0,
        "workers": [_row(0), _row(1, pushes=3)],
    }
    rows = {row["rank"]: row["state"] for row in worker_rows(stats, [])}
    assert rows == {0: "waiting", 1: "training", 2: "waiting"}
    collector = Collector("tcp://127.0.0.1:9")
    collector._publish(stats)
    collector.finish({"samples": 0})
    ended = {row["rank"]: row["state"] for row in collector.snapshot()["workers"]}
    assert ended == {0: "stopped", 1: "stopped", 2: "never taken"}


def test_a_reloaded_tab_keeps_its_seats_totals_in_stats_and_the_report():
    params = {"fc.w": __import__("numpy").zeros((3, 4), "float32")}
    grads = {"fc.w": __import__("numpy").ones((3, 4), "float32")}
    # A world of 2 with one tab: its first pull waits out the assembly, which ends at the
    # heartbeat timeout (the short one here: the waiting is not what this checks).
    with running_server(params=params, world_size=2, heartbeat_timeout=2.0) as server:
        pushes = 0
        for _ in range(2):  # the tab, then the same tab reloaded (the same worker id)
            with PSClient(server.endpoint, timeout=10, worker_id="tab") as tab:
                assert tab.hello({"agent": "browser"})["rank"] == 0
                for _ in range(3):
                    version = tab.pull().version
                    tab.push(grads, base=version, samples=64)
                    pushes += 1
                tab.bye(finished=False)  # the gateway's bye when the WebSocket closes
        with PSClient(server.endpoint, timeout=10) as operator:
            stats = operator.stats()
    rows = [w for w in stats["workers"] if w["rank"] == 0 and not w["observer"]]
    assert [(w["steps"], w["pushes"], w["samples"]) for w in rows] == [(6, 6, 384)]
    report = report_from_stats(stats, 0)
    assert (report["steps"], report["samples"]) == (6, 384)


def _lines(proc: subprocess.Popen, seen: list[str], until: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            line = proc.stdout.readline()
            assert line, f"the run ended first: {seen}"
            seen.append(line.rstrip("\n"))
            if until in line:
                return line.rstrip("\n")
    raise AssertionError(f"no {until!r} in {timeout} s: {seen}")


def test_a_class_with_an_empty_seat_waits_in_one_line_and_reports_it_never_taken(tmp_path):
    pytest.importorskip("websockets", reason="browser seats need pip install '.[web]'")
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--model", "mlp", "--dataset", "synthetic",
         "--workers", "2", "--browser", "1", "--epochs", "1", "--listen", "127.0.0.1:0",
         "--join-wait", "15", "--heartbeat-timeout", "8", "--dashboard",
         "--dashboard-listen", "127.0.0.1:0", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen: list[str] = []
    try:
        url = _lines(proc, seen, "dashboard: ").split("dashboard: ")[1]
        waiting = _lines(proc, seen, "waiting for 1 of 1 browser seat")
        assert "then the run goes on without them" in waiting and "s left" in waiting
        snapshot = json.loads(urllib.request.urlopen(url + "snapshot.json", timeout=10).read())
        assert "waiting" in {row["state"] for row in snapshot.get("workers", [])}, snapshot
        proc.wait(timeout=300)
        seen += [line.rstrip("\n") for line in proc.stdout]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, seen
    assert not any(line.startswith("training 0/") for line in seen), seen
    assert sum(line.startswith("waiting for") for line in seen) <= 2, seen  # free ranks named
    progress = [line for line in seen if line.startswith("training ")]
    assert progress[-1].startswith("training 1000/1000 samples (100%)"), seen  # rank 0's shard
    report = subprocess.run([sys.executable, "-m", "minips", "report", str(out)],
                            capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    assert "1 of 2 workers took part (1 seat never taken)" in report, report
    assert any(line.split()[:3] == ["1", "-", "-"] and line.endswith("never taken")
               for line in report.splitlines()), report  # fmt: skip


def test_the_waiting_line_is_one_line_rewritten_on_a_terminal_and_printed_once_elsewhere():
    import io

    from minips.cli.progress import ProgressBar

    waiting = {"seats": "1 of 4 browser seats (free: rank 3)", "then": "the run goes on"}
    for terminal in (True, False):
        bar = ProgressBar()
        bar._stream, bar._on_terminal = io.StringIO(), terminal
        for left in (20.0, 19.8, 19.6):  # the launcher asks every 0.2 s
            bar.update(0, 4000, {"waiting": {**waiting, "left_s": left}})
        text = bar._stream.getvalue()
        if terminal:
            assert text.count("\r") == 3 and "\n" not in text, text
            assert text.endswith("waiting for 1 of 4 browser seats (free: rank 3): 20 s left, "
                                 "then the run goes on\x1b[K")  # fmt: skip
        else:
            assert text == "waiting for 1 of 4 browser seats (free: rank 3): 20 s left, then " \
                           "the run goes on\n", text  # fmt: skip


def test_a_tab_reloaded_in_chromium_keeps_its_seats_samples_and_steps(tmp_path):
    """F5 in a real headless Chromium: the seat's row in the server's final stats (what the
    dashboard shows and the report reads) counts its whole shard, not the work since."""
    from test_web_browser import _done, _final_stats
    from test_web_seats import EPOCHS, SHARD_STEPS, _server_args
    from test_web_support import Chromium, require_browser, server_process, wait_for

    from minips.classroom.web import start_gateway

    require_browser()
    browser = Chromium(tmp_path)
    try:
        with server_process(tmp_path, *_server_args(tmp_path, 2)) as endpoint:
            gateway = start_gateway(endpoint)
            try:
                (_, reloaded), (_, other) = [browser.open(gateway.url) for _ in range(2)]
                wait_for(lambda: browser.status(reloaded).get("steps", 0) >= 10, 60, "steps")
                before = browser.status(reloaded)
                browser.call("Page.reload", reloaded)  # F5
                wait_for(lambda: _done(browser, reloaded), 120, "the reloaded tab to finish")
                wait_for(lambda: _done(browser, other), 120, "the other tab to finish")
            finally:
                gateway.close()
    finally:
        browser.close()
    stats = _final_stats(tmp_path / "updates.jsonl")
    (row,) = [w for w in stats["workers"] if w["worker"] == before["workerId"]]
    shard = EPOCHS * 1000  # synthetic: 2000 examples, two shards
    assert shard <= row["samples"] <= shard + 64, row  # at most the step in flight, again
    # Its steps: the shard's, plus at most the one in flight at the reload, done again (the
    # clock, set forward to the other tab's at the rejoin, is no count of them).
    assert row["steps"] - EPOCHS * SHARD_STEPS in (0, 1) and row["pushes"] == row["steps"], row
    report = report_from_stats(stats, row["rank"])  # what `minips report` reads of the seat
    assert (report["steps"], report["samples"]) == (row["steps"], row["samples"])
    (shown,) = [r for r in worker_rows(stats, []) if r["rank"] == row["rank"]]  # the dashboard
    assert (shown["steps"], shown["samples"]) == (row["steps"], row["samples"])
