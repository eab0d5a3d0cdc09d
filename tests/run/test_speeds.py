"""Speeds that change (minips.run.speeds, docs/model.md 4.5): each schedule's steps by
hand, the same draws in Python and in the browser's JavaScript, the option's one-line
errors, and a real run whose worker goes away and comes back, its sleeps in its report."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minips.errors import ConfigError
from minips.run.config import RunConfig
from minips.run.speeds import (
    PARETO_CAP,
    ScheduleError,
    SpeedSchedule,
    speed_stream,
    uniform,
)

STATIC = Path(__file__).resolve().parents[2] / "minips" / "classroom" / "web" / "static"
NODE = shutil.which("node")


def test_the_first_draws_are_splitmix64s_top_53_bits():
    # key_0(0) = 0xe220a8397b1dcdaf (SplitMix64's first output of seed 0): its top 53 bits
    assert uniform(0, 0) == (0xE220A8397B1DCDAF >> 11) / 2**53
    assert speed_stream(0, 0) == 0x5350454544 and speed_stream(1, 2) == 1002 ^ 0x5350454544
    draws = [uniform(speed_stream(7, 1), i) for i in range(1000)]
    assert all(0 <= u < 1 for u in draws) and 0.45 < sum(draws) / 1000 < 0.55


def test_fixed_sleeps_f_minus_one_compute_times():
    schedule = SpeedSchedule.for_worker("fixed", 3.0, seed=0, rank=0)
    assert [schedule.extra(step, 0.5) for step in range(3)] == [1.0, 1.0, 1.0]
    assert SpeedSchedule.for_worker("fixed", 1.0, 0, 0).extra(0, 0.5) == 0.0


def test_fluctuate_draws_one_slowdown_per_block_of_n_steps():
    schedule = SpeedSchedule.for_worker("fluctuate:4:9", 2.0, seed=5, rank=1)
    stream = speed_stream(5, 1)
    for step in range(12):
        expected = 2.0 * (1 + 8 * uniform(stream, step // 4))
        assert schedule.extra(step, 1.0) == pytest.approx(expected - 1, rel=1e-15)
    blocks = [schedule.extra(step, 1.0) for step in range(0, 40, 4)]
    assert len(set(blocks)) == 10 and all(1.0 <= b + 1 < 18.0 for b in blocks)
    assert schedule.extra(1, 1.0) == schedule.extra(3, 1.0) != schedule.extra(4, 1.0)


def test_pareto_pauses_at_the_rate_p_heavy_tailed_and_capped():
    schedule = SpeedSchedule.for_worker("pareto:0.5:0.25", 1.0, seed=0, rank=3)
    extras = [schedule.extra(step, 1.0) for step in range(4000)]
    paused = [e for e in extras if e > 0]
    assert 0.2 < len(paused) / 4000 < 0.3
    assert max(paused) == PARETO_CAP - 1  # alpha 0.5: some draws pass the cap
    assert sorted(paused)[len(paused) // 2] > 1.0  # median pause of Pareto(0.5) is 3 - 1
    stream = speed_stream(0, 3)
    step = next(s for s in range(4000) if extras[s] > 0 and extras[s] < PARETO_CAP - 1)
    size = 1.0 - uniform(stream, 2 * step + 1)
    assert uniform(stream, 2 * step) < 0.25
    assert extras[step] == pytest.approx(size**-2 - 1, rel=1e-12)


def test_away_pauses_one_rank_once_after_its_step():
    mine = SpeedSchedule.for_worker("away:1:3:2.5", 2.0, seed=0, rank=1)
    other = SpeedSchedule.for_worker("away:1:3:2.5", 1.0, seed=0, rank=0)
    assert [mine.extra(step, 0.1) for step in range(5)] == pytest.approx([0.1, 0.1, 0.1, 2.6, 0.1])
    assert [other.extra(step, 0.1) for step in range(5)] == [0.0] * 5


@pytest.mark.parametrize(
    "text",
    ["sometimes", "fluctuate:4", "fluctuate:0:2", "fluctuate:2.5:2", "fluctuate:4:0.5",
     "pareto:0:0.1", "pareto:1:1.5", "away:-1:2:3", "away:0:1.5:3", "away:0:2:-1",
     "pareto:nan:0.1", "fixed:1"],
)  # fmt: skip
def test_a_malformed_schedule_is_one_line(text):
    with pytest.raises(ScheduleError) as refused:
        SpeedSchedule.parse(text)
    assert "\n" not in str(refused.value) and text in str(refused.value)
    with pytest.raises(ConfigError):
        RunConfig(hetero_schedule=text).validate()


def test_away_names_a_rank_of_the_run():
    with pytest.raises(ConfigError, match="rank 4 is not one of 4 workers"):
        RunConfig(workers=4, hetero_schedule="away:4:1:1").validate()


def test_the_cli_refuses_a_bad_schedule_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "minips", "run", "--out", str(tmp_path / "r"),
         "--hetero-schedule", "pareto:1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --hetero-schedule: 'pareto:1': expected fixed, fluctuate:N:MAX, pareto:ALPHA:P "
        "or away:RANK:AFTER:SECONDS (see 'minips run --help')"
    ]
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(NODE is None, reason="node not found")
def test_javascript_sleeps_exactly_as_python():
    cases = [("fixed", 2.0, 0, 0), ("fluctuate:3:5", 1.5, 11, 2), ("pareto:1.5:0.3", 1.0, 4, 1),
             ("pareto:0.5:1", 2.0, 9, 0), ("away:2:5:1.25", 1.0, 0, 2)]  # fmt: skip
    script = (
        "import { extraSeconds, speedSchedule, uniform } from "
        f'"{(STATIC / "speeds.js").as_uri()}";\n'
        f"const cases = {json.dumps(cases)};\n"
        "const out = cases.map(([text, factor, seed, rank]) => {\n"
        "  const s = speedSchedule(text, factor, seed, rank);\n"
        "  const compute = (step) => 0.037 * (step + 1);\n"
        "  return Array.from({ length: 40 }, (_, step) => extraSeconds(s, step, compute(step)));\n"
        "});\n"
        "out.push([uniform(0n, 0), uniform(0x5350454544n, 123456)]);\n"
        "console.log(JSON.stringify(out));\n"
    )
    done = subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    js = json.loads(done.stdout)
    for (text, factor, seed, rank), js_row in zip(cases, js, strict=False):
        schedule = SpeedSchedule.for_worker(text, factor, seed, rank)
        py_row = [schedule.extra(step, 0.037 * (step + 1)) for step in range(40)]
        if text.startswith("pareto"):  # x ** y may differ in its last bit between libms
            assert js_row == pytest.approx(py_row, rel=1e-14), text
        else:
            assert js_row == py_row, text
    assert js[-1] == [uniform(0, 0), uniform(0x5350454544, 123456)]


def test_a_worker_away_for_a_while_comes_back_and_its_sleeps_are_recorded(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "minips", "run", "--out", str(out), "--model", "mlp",
         "--dataset", "synthetic", "--workers", "2", "--epochs", "1", "--quiet",
         "--eval-interval", "0.5", "--hetero-schedule", "away:1:3:2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    away = json.loads((out / "worker-1.json").read_text())
    stayed = json.loads((out / "worker-0.json").read_text())
    assert away["finished"] and stayed["finished"]
    assert len(away["step_delays"]) >= away["steps"] and away["step_delays"][3] == 2.0
    assert [d for i, d in enumerate(away["step_delays"]) if i != 3] == [0.0] * (
        len(away["step_delays"]) - 1
    )
    assert stayed["step_delays"] == [0.0] * len(stayed["step_delays"])
    assert away["slowdown_s"] == pytest.approx(2.0, abs=1e-3)


def test_a_worker_emulates_only_what_it_is_given():
    """`minips worker` hands its Worker the run's conditions (Emulated): the schedule and the
    link. A Worker given none keeps a fixed slowdown and refuses the rest, never quietly
    running faster than the run asked."""
    from minips.errors import ConfigError
    from minips.run.conditions import Emulated
    from minips.run.netlimit import Link
    from minips.worker.hooks import AsItIs, FixedSlowdown

    emulated = Emulated()
    assert emulated.speeds("pareto:1.5:0.1", 2.0, 7, 1) == SpeedSchedule.for_worker(
        "pareto:1.5:0.1", 2.0, 7, 1
    )
    assert isinstance(emulated.link("100mbit"), Link) and emulated.link(None) is None
    fixed = AsItIs().speeds("fixed", 3.0, 7, 1)
    assert fixed == FixedSlowdown(3.0)
    for step, compute in ((0, 0.25), (5, 0.125)):
        assert fixed.extra(step, compute) == SpeedSchedule.for_worker("fixed", 3.0, 7, 1).extra(
            step, compute
        )
    assert AsItIs().link(None) is None and AsItIs().link("unlimited") is None
    with pytest.raises(ConfigError, match="hetero_schedule 'away:1:3:2' needs"):
        AsItIs().speeds("away:1:3:2", 1.0, 0, 1)
    with pytest.raises(ConfigError, match="bandwidth '100mbit' needs"):
        AsItIs().link("100mbit")
