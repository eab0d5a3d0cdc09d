"""A worker killed mid-run while the others train on: `minips run` still ends (exit 0, its
accuracy the final model's), and says in one `warning:` line which worker stopped before
its shard was trained, so a run that trained fewer samples than it was to never reads as
whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every child of `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append((int(entry.name), argv))
    return found


def _version(run: Path) -> int:
    try:
        lines = (run / "updates.jsonl").read_text().splitlines()
    except OSError:
        return 0
    versions = [json.loads(line).get("version", 0) for line in lines[:-1] if line]
    return max(versions, default=0)


def test_a_worker_killed_mid_run_is_said_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # 15 epochs: 240 steps a worker, so the kill at version 20 lands mid-run on any machine.
    argv = [sys.executable, "-m", "minips", "run", "--model", "mlp", "--dataset", "synthetic",
            "--epochs", "15", "--out", str(run), "--quiet"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while _version(run) < 20:  # both workers are training
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.05)
        workers = [pid for pid, args in _children(proc.pid) if " worker " in args]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    summary = json.loads((run / "summary.json").read_text())
    killed = [name for name, code in summary["exit_codes"].items() if code == -9]
    assert killed in (["worker-0"], ["worker-1"]), summary["exit_codes"]
    # named by the rank the server gave it, as the summary names it (not its start order)
    assert len(warnings) == 1 and f"{killed[0]} (exit code -9)" in warnings[0], out
    assert summary["final_tested"] is True
