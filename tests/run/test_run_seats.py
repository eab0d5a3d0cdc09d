"""`minips run` with browser seats, as a class meets it: a seat nobody takes (the run goes
on, or ends, after the join wait, saying so in one line), and a student's tab killed
mid-run and opened again (the run waits for it and finishes its samples). Real processes,
real headless Chromium."""

import json
import subprocess
import sys
import time

import pytest
from test_web_browser import _done
from test_web_seats import _crash
from test_web_support import Chromium, require_browser, wait_for

pytestmark = pytest.mark.slow
FAST = ["--model", "mlp", "--dataset", "synthetic", "--lr", "0.05"]
SEATS = ["--listen", "127.0.0.1:0", "--quiet"]


def _run(tmp_path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`minips run` with seats; the timeout only catches a hang."""
    return subprocess.run(
        [sys.executable, "-m", "minips", "run", *FAST, *SEATS, "--out", str(tmp_path / "run"),
         *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_a_seat_nobody_takes_is_announced_and_the_run_goes_on(tmp_path):
    pytest.importorskip("websockets", reason="browser seats need pip install '.[web]'")
    done = _run(tmp_path, "--workers", "2", "--browser", "1", "--epochs", "1",
                      "--join-wait", "3", "--heartbeat-timeout", "3")  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = "1 browser seat was not taken within 3 s: the run goes on with the workers it has"
    assert done.stdout.splitlines().count(line) == 1, done.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["samples"] == 1000  # the NumPy worker's shard, once


def test_a_teacher_may_end_the_run_on_an_empty_seat(tmp_path):
    pytest.importorskip("websockets", reason="browser seats need pip install '.[web]'")
    wait = ["--join-wait", "3", "--heartbeat-timeout", "3", "--empty-seats", "end"]
    done = _run(tmp_path, "--workers", "2", "--browser", "1", "--epochs", "500", *wait)
    assert done.returncode == 0, done.stderr
    assert "1 browser seat was not taken within 3 s: the run ends, as --empty-seats end asks" in (
        done.stdout
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["samples"] < 500 * 1000  # ended on the empty seat, not after 500 epochs


def test_a_killed_tab_opened_again_finishes_the_runs_samples(tmp_path):
    # The audit's case: `minips run --workers 1 --browser 1`, the tab dies mid-run. The
    # gateway gives the seat back, the run waits for it, the new tab takes the same rank.
    require_browser()
    run = subprocess.Popen(
        [sys.executable, "-m", "minips", "run", *FAST, "--listen", "127.0.0.1:0",
         "--workers", "1", "--browser", "1", "--epochs", "3", "--out", str(tmp_path / "run"),
         "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    browser = Chromium(tmp_path)
    try:
        line = run.stdout.readline()
        assert "open http://" in line, line + run.stderr.read()
        url = line.split("open ", 1)[1].split()[0]
        _, first = browser.open(url)
        wait_for(lambda: browser.status(first).get("steps", 0) >= 10, 90, "the tab to train")
        _crash(browser, first)
        time.sleep(2.0)  # the student needs a moment to open the page again
        _, again = browser.open(url)
        final = wait_for(lambda: _done(browser, again), 120, "the new tab to finish")
        rest, err = run.communicate(timeout=60)
    finally:
        browser.close()
        if run.poll() is None:
            run.kill()
        run.wait()
    assert run.returncode == 0, err
    assert final["rank"] == 0 and final["outcome"] == "finished"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["samples"] >= 0.95 * 3 * 2000, summary["samples"]  # all of it, and more
    report = json.loads((tmp_path / "run" / "worker-0.json").read_text())
    assert report["agent"] == "browser" and report["samples"] == summary["samples"]


def test_the_classroom_guide_states_the_waits_the_code_has():
    from pathlib import Path

    from minips.run.config import RunConfig
    from minips.server.server import ServerOptions

    guide = " ".join(
        (Path(__file__).resolve().parents[2] / "docs" / "classroom.md").read_text().split()
    )
    assert (
        f"`--heartbeat-timeout` seconds ({ServerOptions.heartbeat_timeout:g} by default)" in guide
    )
    assert f"`--join-wait` seconds ({RunConfig.join_wait:g} by default)" in guide
    assert "10 by default" not in guide
