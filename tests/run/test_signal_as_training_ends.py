"""A stop signal to `minips run` just as training ends, before the launcher's next look at
its server (it looks every 0.2 s): the run is found as it is when the signal lands. Once
the server said it stopped, or the evaluator wrote its final record, training is over:
the wrap-up path is taken (summary.json written, `"interrupted": "during the wrap-up..."`),
never "training was cut short". Real processes: the launcher is paused (SIGSTOP) while its
workers train, the signal sent once the server's log or eval.jsonl shows the end, then the
launcher continued: the signal is the first thing it meets, its watch never saw the end."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.run_support import workers_of

pytestmark = pytest.mark.slow
FAST = ["--model", "mlp", "--dataset", "synthetic", "--quiet", "--workers", "2"]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _says(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


ENDS = {  # what shows that training ended: the file, what it says
    "server stop line": ("logs/server.log", "stopped at version"),
    "final eval record": ("eval.jsonl", '"final": true'),
}


@pytest.mark.parametrize(
    ("end", "signum", "servers"),
    [
        ("server stop line", signal.SIGINT, 1),
        ("server stop line", signal.SIGTERM, 1),
        ("final eval record", signal.SIGINT, 1),
        ("final eval record", signal.SIGTERM, 1),
        ("server stop line", signal.SIGTERM, 2),
    ],
)
def test_a_signal_right_after_training_ended_takes_the_wrap_up_path(tmp_path, end, signum, servers):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), *FAST, "--epochs", "4"]
    argv += ["--servers", str(servers)]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        _wait(lambda: len(workers_of(run)) == 2, 60, "the workers")
        os.kill(run.pid, signal.SIGSTOP)  # its watch does not look again before the signal
        name, text = ENDS[end]
        _wait(lambda: _says(out / name, text), 120, end)
        os.kill(run.pid, signum)
        os.kill(run.pid, signal.SIGCONT)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
    assert run.returncode == 130, stderr[-1500:]
    assert "cut short" not in stderr and "Traceback" not in stderr, stderr[-1500:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "during the wrap-up, once training was over", summary
    assert summary["samples"] == 4 * 2000  # every sample was trained (synthetic: 2000)
    assert (out / "metrics.jsonl").exists()
    assert "warning: the run was interrupted during the wrap-up" in stderr, stderr[-1500:]
    assert f"{summary['samples']} samples" in stdout
