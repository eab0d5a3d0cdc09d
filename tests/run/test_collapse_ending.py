"""A collapse whose workers all fail as its consequence (every push refused as non-finite:
`--lr 3 --momentum 0.9 --rule asgd` overflows at once) still ends the run as a collapse:
exit status 3, the collapse said once, the summary's `ended` "collapsed", and no
`error: every worker failed` line (docs/running.md, `minips run --help`). Real processes."""

import json
import subprocess
import sys

import pytest

from minips.cli.ps_cmd import COLLAPSED

pytestmark = pytest.mark.slow


def test_workers_failing_after_a_collapse_leave_the_collapse_the_runs_ending(tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--model", "mlp", "--lr", "3"]
    argv += ["--momentum", "0.9", "--rule", "asgd", "--quiet", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    assert done.returncode == COLLAPSED, done.stdout + done.stderr
    assert "error" not in done.stderr and "every worker failed" not in done.stdout, done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("collapsed: ")]
    assert len(said) == 1 and "try a smaller --lr than 3" in said[0], done.stdout
    assert summary["ended"] == "collapsed" and summary["collapse"]["line"] == said[0]
    assert done.stdout.splitlines()[-1] == f"stopped early, exit status {COLLAPSED}: {said[0]}"
