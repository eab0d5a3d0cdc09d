"""`minips run` and its processes, for real: a local cluster on loopback, kills, Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from run_support import assert_clean_exits

from minips.errors import ConfigError
from minips.results.metrics import read_metrics
from minips.run.config import RunConfig
from minips.run.launch import run_local
from minips.worker.client import PSClient

FAST = {"model": "mlp", "dataset": "synthetic", "lr": 0.05, "momentum": 0.5, "rule": "asgd"}


def test_two_workers_converge_on_synthetic_data(tmp_path):
    spec = RunConfig(epochs=2, workers=2, **FAST)
    summary = run_local(spec, tmp_path, eval_interval=0.5)
    assert summary["accuracy"] >= 0.9
    assert summary["samples"] == 2 * 2000  # two epochs over two disjoint halves
    assert summary["updates"] == 2 * 2 * 16  # asgd: one update per push, 16 batches per shard
    assert set(summary["exit_codes"]) == {"server", "worker-0", "worker-1", "evaluator"}
    assert_clean_exits(summary, tmp_path)
    for name in ("config.json", "metrics.jsonl", "summary.json", "checkpoint.npz"):
        assert (tmp_path / name).exists(), name
    records = read_metrics(tmp_path / "metrics.jsonl")
    events = [r["event"] for r in records]
    assert events[-1] == "summary" and events.count("summary") == 1
    assert events.count("update") == summary["updates"] and events.count("worker") == 2
    evals = [r for r in records if r["event"] == "eval"]
    assert evals[-1]["final"] and evals[-1]["accuracy"] == summary["accuracy"]
    times = [r["time"] for r in records if "time" in r]
    assert times == sorted(times)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written == {key: records[-1][key] for key in written}  # the same summary, twice


def test_bad_options_are_refused_before_any_process_starts(tmp_path):
    with pytest.raises(ConfigError, match="hetero"):
        run_local(RunConfig(workers=2, hetero=[1.0], **FAST), tmp_path)
    assert not (tmp_path / "logs").exists()


def _start_run(tmp_path: Path, *args: str) -> subprocess.Popen:
    code = "from minips.cli import main; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, "run", "--out", str(tmp_path), "--quiet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a shell job
    )


def _wait_for_workers(tmp_path: Path, count: int, timeout: float = 60) -> tuple[str, list[int]]:
    """The endpoint and the pids of `count` workers (index = rank), once they are training."""
    deadline = time.monotonic() + timeout
    endpoint_file = tmp_path / "endpoint"
    while time.monotonic() < deadline:
        if endpoint_file.exists() and endpoint_file.read_text().strip():
            with PSClient(endpoint_file.read_text().strip(), timeout=5) as client:
                stats = client.stats()
            workers = [w for w in stats["workers"] if not w["observer"] and w["alive"]]
            pids = [w["info"]["pid"] for w in sorted(workers, key=lambda w: w["rank"])]
            if len(pids) == count and stats["updates"] > 0:
                return endpoint_file.read_text().strip(), pids
        time.sleep(0.2)
    raise AssertionError("workers did not start")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_ssgd_run_finishes_when_a_worker_is_killed(tmp_path):
    proc = _start_run(
        # Long enough (about 300 barrier rounds, the slow worker setting the pace) that the
        # kill, as soon as the first update is applied, surely lands mid-run.
        tmp_path, "--rule", "ssgd", "--workers", "2", "--epochs", "20", "--hetero", "1,5",
        "--heartbeat-timeout", "2", "--model", "mlp", "--dataset", "synthetic", "--lr", "0.05",
    )  # fmt: skip
    _, pids = _wait_for_workers(tmp_path, 2)
    os.kill(pids[1], signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1].startswith("test accuracy: ")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["exit_codes"]["worker-1"] == -signal.SIGKILL
    assert summary["exit_codes"]["worker-0"] == 0
    survivor = json.loads((tmp_path / "worker-0.json").read_text())
    assert survivor["samples"] == 20 * 1000  # it finished all its epochs alone


@pytest.mark.parametrize("whole_group", [True, False], ids=["ctrl-c", "sigint-launcher"])
def test_ctrl_c_leaves_no_process_behind(tmp_path, whole_group):
    proc = _start_run(tmp_path, "--epochs", "50", "--model", "mlp", "--dataset", "synthetic")
    _, pids = _wait_for_workers(tmp_path, 2)
    if whole_group:
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    else:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing at all is left in the run's process group


def _processes_of(out: Path) -> list[int]:
    """The pids of every live process whose command line names the run folder `out`."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:  # not a process, or gone meanwhile
            continue
        if entry.name.isdigit() and str(out) in argv:
            pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launcher_killed_outright_leaves_no_process_behind(tmp_path):
    """SIGKILL gives the launcher no cleanup: its server, evaluator and workers are told by
    the kernel instead, and stop as they do on SIGTERM (the server keeps its model)."""
    proc = _start_run(tmp_path, "--epochs", "500", "--model", "mlp", "--dataset", "synthetic")
    _wait_for_workers(tmp_path, 2)
    children = [pid for pid in _processes_of(tmp_path) if pid != proc.pid]
    assert len(children) == 4, children  # the server, the evaluator, two workers
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while _processes_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_of(tmp_path) == [], "a child of the killed launcher still runs"
    with np.load(tmp_path / "checkpoint.npz") as model:
        assert int(model["version"]) > 0  # the server's stop kept what the run trained


def test_options_also_come_from_environment_variables(tmp_path):
    env = {**os.environ, "MINIPS_RUN_WORKERS": "3", "MINIPS_RUN_RULE": "ssgd"}
    code = "from minips.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "run", "--out", str(tmp_path), "--quiet", "--epochs", "1",
         "--model", "mlp", "--dataset", "synthetic", "--lr", "0.05"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["workers"], summary["rule"]) == (3, "ssgd")
    assert set(summary["exit_codes"]) == {"server", "worker-0", "worker-1", "worker-2", "evaluator"}


def test_a_sample_budget_stops_the_run_and_fast_workers_do_more(tmp_path):
    # A budget of a few seconds of training, so both workers surely join before it is spent.
    spec = RunConfig(epochs=100, workers=2, hetero=[1.0, 4.0], max_samples=30000, **FAST)
    summary = run_local(spec, tmp_path, eval_interval=0.5)
    # The server stops itself at the push that crosses the budget (one batch at most past it);
    # pushes arriving after that are answered `stop`, not applied and not counted.
    assert 30000 <= summary["samples"] < 30000 + 64
    reports = [json.loads((tmp_path / f"worker-{rank}.json").read_text()) for rank in (0, 1)]
    assert all(report["stopped_by_server"] for report in reports)
    assert reports[0]["samples"] > reports[1]["samples"]  # the 4x slower worker did less
    assert reports[0]["samples"] + reports[1]["samples"] == summary["samples"]


def test_a_worker_arriving_after_the_run_stopped_leaves_cleanly():
    from test_server_support import running_server

    from minips.worker.worker import Worker

    with running_server(stop_grace=5.0) as server:
        with PSClient(server.endpoint) as observer:
            observer.hello({"role": "observer"})  # keeps the stopping server up a while
            observer.stop()
            with PSClient(server.endpoint) as late:
                report = Worker(late).run()
            observer.bye()
    assert report.stopped_by_server and report.steps == 0 and report.rank == -1


def test_the_launchers_client_holds_the_operator_key_of_an_authenticated_run(tmp_path):
    """Under --keys only an operator key may stop the server (docs/protocol.md): the
    launcher's own client has it, so it can end the run; a worker's key is refused."""
    from types import SimpleNamespace

    from test_server_support import running_server

    from minips.provision import keyfiles
    from minips.run.launch import LocalRun
    from minips.worker.client import ServerError

    keyfiles.make_keys(tmp_path)
    launcher = SimpleNamespace(config=SimpleNamespace(keys=str(tmp_path)))
    with running_server(keys=keyfiles.load_server_keys(tmp_path)) as server:
        worker_key = keyfiles.load_client_keys(tmp_path, keyfiles.WORKER)
        with PSClient(server.endpoint, timeout=5.0, keys=worker_key) as worker:
            with pytest.raises(ServerError) as refused:
                worker.stop()
            assert refused.value.code == "operator"
        with LocalRun._operator(launcher, server.endpoint) as operator:
            operator.timeout = 5.0  # the launcher's 1 s is for a server that may be gone
            operator.stop()
        assert server.stop.requested
