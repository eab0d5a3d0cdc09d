"""`minips run --browser N`: browser slots beside (or instead of) the NumPy workers.

The options and the launcher's bookkeeping are checked directly; whole runs use
`--browser-headless` (a headless Chromium started by the run fills the slots) and are
skipped, with the reason shown, where Chromium or websockets are missing.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import pytest
from run_support import assert_clean_exits
from test_web_support import quiet_env, require_browser, wait_for

from minips.classroom.web.slots import student_url
from minips.cli import cli
from minips.errors import ConfigError
from minips.results.metrics import read_metrics
from minips.results.rundir import report_from_stats
from minips.run.config import RunConfig
from minips.run.launch import run_local

# As tests/classroom/test_web_browser.py: 2000 training examples, a shard of 1000 is 16 steps of 64.
FAST = {
    "model": "mlp",
    "dataset": "synthetic",
    "lr": 0.05,
    "momentum": 0.5,
    "epochs": 2,
    "rule": "asgd",
    "join_wait": 120.0,  # a headless Chromium on a busy machine may take long to start
}


def _row(rank, alive, agent="browser", pushes=0, samples=0):
    return {"rank": rank, "alive": alive, "observer": False, "pushes": pushes,
            "samples": samples, "info": {"agent": agent}}  # fmt: skip


def test_a_browser_rank_report_sums_every_worker_that_held_it():
    closed_tab, replacement = _row(1, False, pushes=3, samples=192), _row(1, False, pushes=13)
    stats = {"workers": [_row(0, False, pushes=16), closed_tab, replacement]}
    report = report_from_stats(stats, 1)
    assert report["steps"] == 16 and report["samples"] == 192 and report["agent"] == "browser"
    assert report_from_stats(stats, 2) is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"workers": 2, "browser": 3}, "--browser 3 is more than --workers 2"),
        ({"browser_headless": True}, "--browser-headless needs --browser N"),
        ({"browser": 1, "listen": "8080"}, "--listen wants HOST:PORT"),
    ],
)
def test_impossible_browser_options_are_one_line_errors(tmp_path, options, message):
    with pytest.raises(ConfigError, match=message):
        run_local(RunConfig(**options), tmp_path)
    assert not (tmp_path / "logs").exists()  # refused before anything started


def test_students_are_shown_the_machine_name_when_every_interface_listens():
    assert student_url("http://127.0.0.1:8080/") == "http://127.0.0.1:8080/"
    shown = student_url("http://0.0.0.0:8080/")
    assert shown.endswith(":8080/") and "0.0.0.0" not in shown


def _chromium_processes_under(path: Path) -> list[str]:
    """Command lines of running processes that mention `path` (its Chromium profile)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(path) in cmdline and "chromium" in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.slow
def test_run_with_two_headless_browser_slots_prints_the_url_and_trains(tmp_path):
    require_browser()
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet"]
    argv += ["--workers", "2", "--browser", "2", "--browser-headless"]
    argv += ["--listen", "127.0.0.1:0"] + [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items()]
    env = {**quiet_env(), "TMPDIR": str(tmp_path)}  # nothing may be left here either
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    url = (out / "web-url").read_text().strip()
    assert url.startswith("http://127.0.0.1:")  # loopback, as asked
    assert f"2 browser slot(s): open {url} in a browser" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == 2 * 2000 and summary["updates"] == 64  # every push applied
    assert summary["accuracy"] > 0.8
    assert set(summary["exit_codes"]) == {"server", "evaluator", "gateway", "chromium"}
    assert_clean_exits(summary, out)
    for rank in (0, 1):
        report = json.loads((out / f"worker-{rank}.json").read_text())
        assert report["agent"] == "browser" and report["steps"] == 32
    assert not (out / "logs/chromium-profile").exists()  # the profile was removed
    assert not list(tmp_path.glob("minips-chromium-*"))  # and none was made in TMPDIR
    assert _chromium_processes_under(tmp_path) == []  # and no browser outlives the run


@pytest.mark.slow
def test_a_headless_browser_leaves_nothing_in_the_tmpdir_it_used():
    """Chromium, stopped at the run's end, leaves org.chromium.Chromium.* folders in its
    TMPDIR: the run gives it a folder of its own there and removes it. A short TMPDIR (a
    test's tmp_path is too deep for Chromium's socket: /tmp would be used instead)."""
    require_browser()
    tmpdir = Path(tempfile.mkdtemp(prefix="mw", dir="/tmp"))
    try:
        argv = [sys.executable, "-m", "minips", "run", "--out", str(tmpdir / "run"), "--quiet"]
        argv += ["--workers", "1", "--browser", "1", "--browser-headless"]
        argv += ["--listen", "127.0.0.1:0"]
        argv += [f"--{k.replace('_', '-')}={v}" for k, v in {**FAST, "epochs": 1}.items()]
        env = {**quiet_env(), "TMPDIR": str(tmpdir)}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads((tmpdir / "run/worker-0.json").read_text())["agent"] == "browser"
        assert sorted(p.name for p in tmpdir.iterdir()) == ["run"]
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


@pytest.mark.slow
def test_mixed_run_with_dasgd_and_a_sample_budget_stops_the_browser_too(tmp_path, monkeypatch):
    require_browser()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    lines = []
    # Epochs to spare: the budget (two passes over the data) is what ends the run.
    options = {**FAST, "epochs": 20, "rule": "dasgd"}
    config = RunConfig(workers=2, browser=1, browser_headless=True, listen="127.0.0.1:0",
                       max_samples=4000, **options)  # fmt: skip
    summary = run_local(config, tmp_path / "run", eval_interval=0.5, announce=lines.append)
    assert len(lines) == 1 and "1 browser slot(s): open http://127.0.0.1:" in lines[0]
    reports = {}
    for rank in (0, 1):
        report = json.loads((tmp_path / f"run/worker-{rank}.json").read_text())
        reports[report.get("agent", "numpy")] = report
    assert set(reports) == {"browser", "numpy"}
    assert summary["rule"] == "dasgd" and summary["accuracy"] > 0.8
    assert 4000 <= summary["samples"] < 4000 + 2 * 64  # stopped at the budget
    assert_clean_exits(summary, tmp_path / "run")
    # The browser stopped at the server's stop: at most one push arrived after it (not
    # one more per remaining epoch), so its accepted pushes match what it trained.
    assert not (tmp_path / "run/logs/chromium-profile").exists()  # the profile was removed
    browser = reports["browser"]
    updates = [r for r in read_metrics(tmp_path / "run/metrics.jsonl") if r["event"] == "update"]
    applied = sum(record["workers"].count(browser["rank"]) for record in updates)
    assert applied <= browser["steps"] <= applied + 1


@pytest.mark.slow
def test_interrupting_the_launcher_closes_the_headless_browser(tmp_path):
    require_browser()
    argv = [sys.executable, "-m", "minips", "run", "--out", str(tmp_path / "run"), "--quiet"]
    argv += ["--browser", "1", "--workers", "1", "--browser-headless", "--listen", "127.0.0.1:0"]
    argv += ["--model", "mlp", "--dataset", "synthetic", "--epochs", "100"]
    env = {**quiet_env(), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(argv, env=env, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for(lambda: list(tmp_path.glob("run/updates.jsonl")), 60, "the run to train")
        wait_for(lambda: _chromium_processes_under(tmp_path), 10, "the browser")
        proc.send_signal(signal.SIGINT)  # the launcher only: it must stop its children itself
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in err
    wait_for(lambda: not _chromium_processes_under(tmp_path), 10, "chromium to exit")
    # Its profile is gone, or, if the launcher's patience ran out first on a busy machine,
    # left in the run directory (the next run clears it): never in TMPDIR.
    assert not list(tmp_path.glob("minips-chromium-*"))
    # Nothing at all is left in the run's process group: a child the launcher killed at the
    # end of its patience may take a moment to be reaped once the launcher has gone.
    wait_for(lambda: not _group_alive(proc.pid), 10, "the run's process group to be empty")


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("guide", ["docs/classroom.md", "examples/07_browser_class.md"])
def test_classroom_commands_name_real_options(guide):
    from test_examples import _commands_in

    commands = _commands_in((Path(__file__).resolve().parents[2] / guide).read_text())
    assert any(words[0] == "run" and "--browser" in words for words in commands)
    for words in commands:
        command = cli.get_command(click.Context(cli), words[0])
        assert command is not None, f"{guide}: no command minips {words[0]}"
        known = {opt for param in command.params for opt in param.opts}
        unknown = [w for w in words[1:] if w.startswith("--") and w not in known]
        assert not unknown, f"{guide}: minips {words[0]} has no option {unknown}"
