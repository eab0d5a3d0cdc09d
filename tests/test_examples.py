"""Every program in examples/ runs (fast mode) and shows what it claims; the lab guide's
commands name real commands and options."""

import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest

from minips.cli import cli

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, *args: str, timeout: float = 600) -> str:
    # The timeout only catches a hang: an example trains for real, and on 2 loaded cores
    # the longest took over 3 minutes.
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_tiny_ps_trains_and_applies_every_push():
    out = run_example("00_tiny_ps.py", "--fast")
    # 3 workers x 30 pushes, each applied once, scaled by dasgd's 1 / max(1, tau)
    assert "server: 90 updates applied, rule dasgd" in out
    updates = re.findall(r"^update \d+: rank \d tau (\d+) scale (\S+)$", out, flags=re.M)
    assert len(updates) == 90, out
    for tau, scale in updates:
        assert float(scale) == pytest.approx(1 / max(1, int(tau)), abs=1e-3)
    first, last = map(float, re.search(r"loss reported (\S+) -> (\S+)", out).groups())
    assert last < 0.6 * first
    # Each worker's pushes: fc1.w as top-k 10 %, fc2.w as float16, in 30 steps.
    workers = re.findall(r"in 30 steps, pushed (\S+) B per step \(dense: (\S+)\)", out)
    assert len(workers) == 3, out
    for pushed, dense in workers:
        assert int(pushed.replace(",", "")) < int(dense.replace(",", "")) / 4


def test_tiny_ps_imports_no_minips():
    source = (EXAMPLES / "00_tiny_ps.py").read_text()
    imports = re.findall(r"^(?:import|from) (\w+)", source, flags=re.M)
    standard = {"argparse", "gzip", "math", "threading", "zlib", "pathlib"}
    assert set(imports) <= standard | {"msgpack", "numpy", "zmq"}
    assert len(source.splitlines()) <= 300  # the whole protocol, still a first read


def test_train_by_hand_learns_and_gradient_checks():
    out = run_example("01_train_by_hand.py", "--fast")
    before = float(re.search(r"test accuracy before: (\S+)", out).group(1))
    after = float(re.search(r"test accuracy after: +(\S+)", out).group(1))
    assert after > before + 0.15, out
    error = float(re.search(r"relative error (\S+)", out).group(1))
    assert error < 1e-6


def test_custom_worker_trains_against_a_minips_server_subprocess():
    out = run_example("02_custom_worker.py", "--fast")
    assert "rank 0 of 1, model mlp" in out
    losses = [float(x) for x in re.findall(r"loss (\S+)", out)]
    assert losses[-1] < losses[0]
    # One push per step, 64 samples each, all applied (the only worker: staleness 0).
    assert "server: 20 updates, 1280 samples" in out
    assert set(re.findall(r"staleness (\d+)", out)) == {"0"}


def _commands_in(markdown: str) -> list[list[str]]:
    """`minips ...` command lines inside ```sh blocks (with backslash continuations joined)."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", markdown, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("minips "):
                commands.append(line.split()[1:])
    return commands


@pytest.mark.parametrize("guide", ["05_two_machines.md"])
def test_lab_guide_commands_and_options_exist(guide):
    commands = _commands_in((EXAMPLES / guide).read_text())
    assert len(commands) >= 4
    for words in commands:
        command = cli.get_command(click.Context(cli), words[0])
        assert command is not None, f"{guide}: no command minips {words[0]}"
        known = {opt for param in command.params for opt in param.opts}
        for word in words[1:]:
            if word.startswith("--"):
                assert word in known, f"{guide}: minips {words[0]} has no option {word}"


def test_the_two_machine_guides_port_check_needs_only_python():
    # The guide's reachability check, run for real: against a listening port, then a closed one.
    guide = (EXAMPLES / "05_two_machines.md").read_text()
    assert "nc -" not in guide and "telnet" not in guide
    (check,) = [line.strip() for line in guide.splitlines() if "create_connection" in line]
    argv = shlex.split(check)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        script = argv[2].replace("'SERVER', 5555", f"'127.0.0.1', {port}")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout == "reachable\n"
    refused = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert refused.returncode == 1 and "ConnectionRefusedError" in refused.stderr


def test_new_rule_runs_in_minips_run_and_scales_by_gamma_to_the_tau():
    out = run_example("03_new_rule.py", "--fast", "--gamma", "0.7")
    assert re.search(r"test accuracy (\S+)", out)
    rows = re.findall(r"rule (\S+)  tau (\d+)  scale (\S+)", out)
    assert {rule for rule, _, _ in rows} == {"damped"}  # the server ran the example's rule
    assert any(int(tau) > 0 for _, tau, _ in rows), out  # 3 workers: some pushes are stale
    for _, tau, scale in rows:
        assert float(scale) == pytest.approx(0.7 ** int(tau), abs=1e-4)


def test_hetero_experiment_shows_the_slow_worker_stale_and_damped_by_dasgd(tmp_path):
    png = tmp_path / "hetero.png"
    out = run_example("04_hetero_experiment.py", "--fast", "--png", str(png))
    runs = dict(re.findall(r"^(asgd|dasgd): (.*?)(?=^\w+:|\Z)", out, flags=re.M | re.S))
    assert set(runs) == {"asgd", "dasgd"}, out

    def workers(text: str) -> dict[float, list[tuple[float, int, float]]]:
        """(staleness mean, max, scale mean) of each worker, by slowdown (two are 1x)."""
        rows = re.findall(
            r"\((\S+)x slower\): .*staleness mean (\S+) max (\d+), mean scale (\S+)", text
        )
        by_slowdown: dict[float, list[tuple[float, int, float]]] = {}
        for slow, tau, most, scale in rows:
            by_slowdown.setdefault(float(slow), []).append((float(tau), int(most), float(scale)))
        return by_slowdown

    # With 4 workers on 2 cores the scheduler may starve one 1x worker for a while, and its
    # pushes then arrive as stale as a slow worker's: compare the 8x worker with the 1x worker
    # the scheduler served best, whose staleness is the slowdowns' alone.
    asgd, dasgd = workers(runs["asgd"]), workers(runs["dasgd"])
    assert len(asgd[1.0]) == 2 and len(asgd[8.0]) == 1, out
    assert asgd[8.0][0][0] > min(tau for tau, _, _ in asgd[1.0]), out  # the 8x worker is stalest
    assert {scale for rows in asgd.values() for *_, scale in rows} == {1.0}  # asgd applies all at 1
    # dasgd scales each push by 1 / max(1, tau): a worker never more than 1 stale keeps 1, any
    # other is damped, never below 1 / its largest tau; the 8x worker's pushes are stale.
    for _, most, scale in (row for rows in dasgd.values() for row in rows):
        assert (scale == 1.0) == (most <= 1) and scale >= 1 / max(1, most) - 1e-3, out
    assert dasgd[8.0][0][1] > 1, out
    assert f"plot: {png}" in out and png.stat().st_size > 10_000


def test_layer_plans_print_the_table_and_auto_sends_fewer_bytes_than_dense():
    out = run_example("06_layer_plans.py", "--fast")
    # Which codec fc1 gets depends on the compute measured here (tests/transmission/test_planner.py
    # checks the choice with fixed times); on this slow link it is compressed both ways.
    assert re.search(r"^fc1\.w +800x500 .* (topk|sf) .* delta ", out, flags=re.M), out
    assert "choice: per-layer codecs above, wait-free sending" in out
    runs = {
        plan: (int(steps), float(up.replace(",", "")), float(down.replace(",", "")))
        for plan, steps, up, down in re.findall(
            r"(dense|auto): (\d+) steps .* per step up (\S+) B, down (\S+) B", out
        )
    }
    assert set(runs) == {"dense", "auto"}, out
    predicted_up = int(re.search(r"predicted up (\S+) B", out).group(1).replace(",", ""))
    assert runs["dense"][1] == pytest.approx(1_724_320, rel=0.01)  # LeNet-5, float32
    assert runs["auto"][1] == pytest.approx(predicted_up, rel=0.05)  # the plan, as counted
    # Up: >= 5x fewer (sf fp16 on fc1: 7.5x, top-k 1 %: 18x). Down: a 3-step run (a worker's)
    # is all the delta's warm-up (its first 20 replies carry fc1 whole, fp16).
    assert runs["auto"][1] < runs["dense"][1] / 5 and runs["auto"][2] < runs["dense"][2]
