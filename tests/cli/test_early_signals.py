"""A stop signal while `minips` is still loading, before its command has handlers of its
own (minips.cli.early_signals): one line, exit status 130 for Ctrl-C, `terminated` and
the status of SIGTERM for SIGTERM, never a traceback. Real `python -m minips run`
processes; a module on their path pauses an import (`click`: the command line loading;
`minips.cli.ps_cmd`: the command's module loading) so the signal lands there every time,
and others are sent at fixed moments after the start."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PAUSE = textwrap.dedent("""
    import os, sys, time

    class Pause:  # stops at the import of $PAUSE_AT, once, saying so on stdout
        def find_spec(self, name, path=None, target=None):
            if name == os.environ.get("PAUSE_AT"):
                sys.meta_path.remove(self)
                os.write(1, b"paused\\n")
                time.sleep(30)
            return None

    sys.meta_path.insert(0, Pause())
""")


def _default_sigint() -> None:
    # Ctrl-C as a terminal's: a suite run in the background (`&`) passes SIGINT on ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, pause_at: str = "") -> subprocess.Popen:
    hooks = tmp_path / "hooks"
    hooks.mkdir(parents=True, exist_ok=True)
    (hooks / "sitecustomize.py").write_text(PAUSE)
    env = {**os.environ, "PAUSE_AT": pause_at, "PYTHONPATH": f"{hooks}{os.pathsep}{ROOT}"}
    argv = [sys.executable, "-m", "minips", "run", "--workers", "1", "--epochs", "1",
            "--out", str(tmp_path / "run")]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=tmp_path, preexec_fn=_default_sigint)  # fmt: skip


def _ended(proc: subprocess.Popen) -> tuple[int, list[str]]:
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err.decode().strip().splitlines()


@pytest.mark.parametrize("pause_at", ["click", "minips.cli.ps_cmd"])
@pytest.mark.parametrize(
    "signum, code, line",
    [(signal.SIGINT, {130, -signal.SIGINT}, ("interrupted", "aborted")),
     (signal.SIGTERM, {-signal.SIGTERM}, ("terminated",))],
)  # fmt: skip
def test_a_signal_while_minips_loads_ends_it_in_one_line(tmp_path, pause_at, signum, code, line):
    proc = _start(tmp_path, pause_at)
    try:
        assert proc.stdout.readline() == b"paused\n"
        proc.send_signal(signum)
        returncode, err = _ended(proc)
    finally:
        proc.kill()
        proc.wait()
    assert returncode in code and len(err) == 1, (returncode, err)
    assert err[0] in line
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (the kernel's SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signum - 1) & 1)


def _loading(proc: subprocess.Popen) -> None:
    """Wait until minips's command line loads (its SIGTERM handler is in place)."""
    deadline = time.monotonic() + 30
    while not _catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None and time.monotonic() < deadline, "minips never caught SIGTERM"
        time.sleep(0.001)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_first_moments_of_minips_run_gives_no_traceback(tmp_path, signum):
    """Right after the start, and 0, 0.05 and 0.2 s after the command line began loading
    (before Python runs minips's code it has no say: the process ends by the signal, which
    a shell shows as 130 or 143 all the same, or says so with Python's own traceback)."""
    lines = {signal.SIGINT: {"interrupted", "aborted"}, signal.SIGTERM: {"terminated"}}[signum]
    # Ctrl-C: 130, or the end by SIGINT itself where a KeyboardInterrupt crossed a C
    # extension's own Python code (CPython keeps a flag): a shell shows 130 for both
    codes = {signal.SIGINT: {130, -signal.SIGINT}, signal.SIGTERM: {-signal.SIGTERM}}[signum]
    # Once `minips run` has its own handlers (0.2 s on a quiet machine), both signals are
    # its Ctrl-C: one line `interrupted: ...`, status 130.
    run_line, run_code = "interrupted: ", 130
    for moment in (None, 0.0, 0.05, 0.2):
        proc = _start(tmp_path / str(moment))
        try:
            if moment is not None:
                _loading(proc)
                time.sleep(moment)
            proc.send_signal(signum)
            returncode, err = _ended(proc)
        finally:
            proc.kill()
            proc.wait()
        if moment is None and err and err[0].startswith("Fatal Python error: init_import_site"):
            continue  # it landed in Python's own start (its site module): no minips code ran
        assert not any("Traceback" in line for line in err), (moment, err)
        if moment is None and returncode == -signum:
            assert err in ([], [next(iter(lines))]), err  # before Python's start, or ours
        elif len(err) == 1 and err[0].startswith(run_line):
            assert returncode == run_code, (moment, returncode, err)
        else:
            assert returncode in codes and len(err) == 1 and err[0] in lines, (moment, err)
