"""`minips launch` under the real launchers (mpirun, torchrun) and under the variables Slurm
and the DMLC scripts set: 4 processes, 2 of them serving (a group of two shards), each job
training to a summary; a job that cannot assemble says who is missing, in bounded time."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minips import PSClient
from minips.group.root import GROUPS

# One epoch, half a second of training: on a loaded machine the workers may finish before
# the root's evaluator, started beside it, says hello; the root awaits it (--await-observers)
# so the run still ends with the final model evaluated.
EPOCHS = 1
JOB = ["--model", "mlp", "--dataset", "synthetic", "--epochs", str(EPOCHS), "--eval-interval", "30"]
MINIPS = [sys.executable, "-m", "minips"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _check_summary(out: Path, servers: int = 2, workers: int = 2) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["servers"] == servers and summary["workers"] == workers
    assert [row["updates"] for row in summary["shards"]] == [summary["updates"]] * servers
    assert summary["samples"] == 2000 * EPOCHS and summary["accuracy"] > 0.5  # both shards of data
    assert sorted(p.name for p in out.glob("worker-*.json")) == ["worker-0.json", "worker-1.json"]
    return summary


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 240):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (openmpi-bin) is not installed")
def test_mpirun_starts_a_group_and_its_workers(tmp_path):
    out = tmp_path / "mpi"
    # 4 processes on this machine's 2 cores: Open MPI refuses more ranks than cores unless told
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "4", *MINIPS, "launch",
            "--servers", "2", "--port", str(_free_port()), "--out", str(out), *JOB]  # fmt: skip
    done = _run(argv)
    assert "test accuracy" in done.stdout
    _check_summary(out)


def test_torchrun_starts_a_group_and_its_workers(tmp_path):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if not Path(torchrun).exists():
        pytest.skip("torchrun (the optional PyTorch) is not installed")
    out = tmp_path / "torch"
    argv = [torchrun, "--nproc-per-node", "4", "--no-python", *MINIPS, "launch",
            "--servers", "2", "--out", str(out), *JOB]  # fmt: skip
    _run(argv, env={"OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)})  # torchelastic's files
    _check_summary(out)


def _start_all(envs: list[dict[str, str]], out: Path, *extra: str) -> list[subprocess.Popen]:
    argv = [*MINIPS, "launch", "--out", str(out), *JOB, *extra]
    return [
        subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for env in envs
    ]


def _finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str, str]]:
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        results.append((proc.returncode, stdout, stderr))
    return results


def _all_exited_0(results: list[tuple[int, str, str]]) -> bool:
    """Every process exited 0; else AssertionError with each failing one's whole output."""
    failed = [f"exit {code}:\n{out}\n{err}" for code, out, err in results if code != 0]
    assert not failed, "\n---\n".join(failed)
    return True


def test_the_variables_srun_sets_start_a_group(tmp_path):
    """srun -n 4 sets these for each task; the root is the first host of the compressed
    node list (here a name this machine resolves, then three it need not)."""
    out, port = tmp_path / "slurm", _free_port()
    common = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4", "SLURM_NNODES": "4",
              "SLURM_STEP_NODELIST": "localhost,node[2-4]", "SLURM_NODELIST": "localhost,node[2-4]",
              "SLURM_STEP_ID": "0"}  # fmt: skip
    envs = [{**common, "SLURM_PROCID": str(r), "SLURM_LOCALID": "0", "SLURM_NODEID": str(r)}
            for r in range(4)]  # fmt: skip
    results = _finish(_start_all(envs, out, "--servers", "2", "--port", str(port)))
    assert _all_exited_0(results)
    assert "test accuracy" in results[0][1]
    _check_summary(out)


def _child_running(argv_part: str, inside: str, timeout: float = 60) -> int:
    """The pid of the process whose command line has `argv_part` and `inside`, once it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:  # not a process, or gone
                continue
            text = [a.decode(errors="replace") for a in argv]
            if argv_part in text and any(inside in a for a in text):
                return int(proc.name)
        time.sleep(0.01)
    raise AssertionError(f"no {argv_part} process of {inside} within {timeout} s")


def test_a_job_that_ends_before_its_evaluator_wrote_a_record_still_ends_with_its_summary(tmp_path):
    """The root awaits one observer before it stops; here the test is that observer and the
    root's own evaluator is frozen before its first record, as a starved one is on a loaded
    machine. The job ends by itself, which is no failure to assemble: rank 0 writes the
    summary, the final model tested by the launcher from the checkpoint."""
    out, port = tmp_path / "early", _free_port()
    common = {"SLURM_JOB_ID": "78", "SLURM_NTASKS": "4", "SLURM_NNODES": "4",
              "SLURM_STEP_NODELIST": "localhost,node[2-4]", "SLURM_STEP_ID": "0"}  # fmt: skip
    envs = [{**common, "SLURM_PROCID": str(r), "SLURM_LOCALID": "0", "SLURM_NODEID": str(r)}
            for r in range(4)]  # fmt: skip
    procs = _start_all(envs, out, "--servers", "2", "--port", str(port))
    evaluator = _child_running("evaluate", str(out))
    os.kill(evaluator, signal.SIGSTOP)
    try:
        observer = PSClient(f"tcp://127.0.0.1:{port}", timeout=2.0, groups=GROUPS)
        with observer:
            observer.hello({"role": "observer"})
            observer.bye()
        results = _finish(procs)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(evaluator, signal.SIGCONT)
    assert _all_exited_0(results)
    assert "test accuracy" in results[0][1]
    summary = _check_summary(out)
    final = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()][-1]
    assert final["by"] == "launcher" and final["final"] is True
    assert summary["accuracy"] == final["accuracy"]


def _dmlc(role: str, port: int, **more: str) -> dict[str, str]:
    return {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", **more}  # fmt: skip


def test_the_dmlc_variables_start_a_scheduler_a_server_and_workers(tmp_path):
    """As ps-lite's tracker sets them (BytePS adds DMLC_WORKER_ID, below): the scheduler
    serves shard 0 and the one server process shard 1; the workers' ranks go by arrival."""
    out, port = tmp_path / "dmlc", _free_port()
    envs = [_dmlc("server", port), _dmlc("worker", port), _dmlc("worker", port),
            _dmlc("scheduler", port)]  # fmt: skip
    results = _finish(_start_all(envs, out))
    assert all(code == 0 for code, _, _ in results), results
    _check_summary(out)


def _assemble_without_a_server(out: Path, timeout: int) -> tuple[int, str]:
    """A DMLC job whose server never comes, with `--startup-timeout timeout`: the
    scheduler's (exit code, stderr). Its exit is awaited for `timeout` plus a bound that
    only catches a hang."""
    port = _free_port()
    envs = [_dmlc("scheduler", port), _dmlc("worker", port, DMLC_WORKER_ID="1")]  # no server
    scheduler, worker = _start_all(envs, out, "--startup-timeout", str(timeout))
    try:
        ((code, _, stderr),) = _finish([scheduler], timeout=timeout + 120)
    finally:
        worker.kill()  # it gives up on its own too, after its hello's retries
        worker.communicate()
    return code, stderr


def test_a_job_that_cannot_assemble_says_who_is_missing(tmp_path):
    # The startup timeout counts from the launch, the root's own start included; on a
    # loaded machine a short one may pass before the root is up, and the job rightly says
    # "server did not start within 4 s". That answers another question: the timeout is
    # doubled until the root starts within it, so the verdict is the same on any machine.
    for timeout in (4, 8, 16, 32, 64):
        code, stderr = _assemble_without_a_server(tmp_path / f"missing-{timeout}", timeout)
        if not stderr.startswith(f"error: server did not start within {timeout} s"):
            break
    assert code == 2 and stderr.startswith(f"error: the job did not assemble within {timeout} s")
    assert "shard 1 (a DMLC server) never arrived" in stderr  # the workers wait for it


def test_a_cancelled_job_s_coordinator_stops_its_children_and_says_aborted(tmp_path):
    """srun, mpirun and torchrun cancel a job with SIGTERM to every rank: rank 0 stops as
    on Ctrl-C (exit 130, one word, no traceback) after stopping its root and evaluator."""
    out, port = tmp_path / "cancelled", _free_port()
    common = {"SLURM_JOB_ID": "78", "SLURM_NTASKS": "2", "SLURM_NNODES": "1",
              "SLURM_STEP_NODELIST": "localhost", "SLURM_NODELIST": "localhost",
              "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # fmt: skip
    (coordinator,) = _start_all([{**common, "SLURM_PROCID": "0"}], out, "--port", str(port))
    try:
        root = _child_running("server", str(out))  # the worker (rank 1) never comes
        # once rank 0 started its last child (a signal while it forks one is a narrower case)
        _child_running("evaluate", str(out))
        time.sleep(1.0)
        coordinator.send_signal(signal.SIGTERM)
        code, _, stderr = _finish([coordinator], timeout=60)[0]
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.communicate()
    assert code == 130 and "Traceback" not in stderr, stderr
    assert not Path(f"/proc/{root}").exists()  # stopped and reaped by rank 0
