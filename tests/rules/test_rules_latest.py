"""ringmaster, delay-adaptive and fedbuff: each formula against a hand computation over real
sockets, fedbuff's buffer through a checkpoint and a resume, the CLI flags, and real runs
(4 workers, a server group of 2) that train.

Hand computations follow the server's float32 arithmetic: lr * scale is a Python float
cast once to float32 (momentum 0), fedbuff's buffer a float32 sum in arrival order of
float32(g * s(tau)), divided by float32(K).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from run_support import assert_clean_exits
from test_server_support import SHAPES, make_params, running_server, snapshot
from test_web_support import require_browser

from minips.cli import main
from minips.cli.ps_cmd import run_command
from minips.errors import DataError
from minips.ops.rule_state import StateReader, rule_state
from minips.rules import make_rule
from minips.run.config import RunConfig
from minips.run.launch import run_local
from minips.state.registry import WorkerRegistry
from minips.worker.client import PSClient


def _step(param, lr_times_scale, grad):
    """One plain SGD step exactly as the server does it, in float32."""
    return param - np.asarray(lr_times_scale, np.float32) * grad


def _copy(arrays):
    return {name: np.array(array) for name, array in arrays.items()}


def _dyadic(shape, seed):
    """Quarters in [-2, 2): sums and halves of these are exact in float32."""
    return (np.random.default_rng(seed).integers(-8, 8, shape) / 4).astype(np.float32)


def _same(a, b) -> bool:
    return all(a[name].tobytes() == b[name].tobytes() for name in a)


def _advance(ps, n, base=0):
    """n updates of fc.b by zero gradients (fc.w untouched); returns the version after."""
    version = base
    for _ in range(n):
        version = ps.push({"fc.b": np.zeros(4, np.float32)}, base=version).version
    return version


# ------------------------------------------------------------------------- ringmaster


def test_ringmaster_applies_below_r_and_drops_from_r_on():
    lr, records = 0.5, []
    params = make_params()
    options = {"delay_threshold": 3}
    with running_server("ringmaster", params=params, lr=lr, rule_options=options,
                        on_update=records.append) as server:  # fmt: skip
        with PSClient(server.endpoint) as ps:
            ps.hello()
            assert _advance(ps, 3) == 3
            before = _copy(params)
            g = _dyadic((3, 4), seed=1)
            fresh = ps.push({"fc.w": g}, base=1)  # tau 2 < R: the full step, t -> 4
            after = _copy(params)
            at_r = ps.push({"fc.w": g}, base=1)  # tau 3 = R: dropped
            past = ps.push({"fc.w": g}, base=0)  # tau 4: dropped
    assert (fresh.applied, fresh.staleness, fresh.version) == (True, 2, 4)
    np.testing.assert_array_equal(after["fc.w"], _step(before["fc.w"], lr, g))
    for reply, tau in ((at_r, 3), (past, 4)):
        assert (reply.applied, reply.staleness, reply.version) == (False, tau, 4)
    np.testing.assert_array_equal(params["fc.w"], after["fc.w"])  # the drops changed nothing
    assert [r["dropped"] for r in records[-3:]] == [False, True, True]
    assert records[-1]["version"] == 4 and records[-1]["params"] == []


def test_ringmaster_r_is_the_number_of_workers_unless_given():
    rule = make_rule("ringmaster")
    rule.attach(None, WorkerRegistry(world_size=6, grace=1.0))
    assert rule.threshold() == 6 and rule.describe() == {"name": "ringmaster",
                                                         "delay_threshold": 6}  # fmt: skip
    given = make_rule("ringmaster", delay_threshold=2)
    given.attach(None, WorkerRegistry(world_size=6, grace=1.0))
    assert given.threshold() == 2


# --------------------------------------------------------------------- delay-adaptive


@pytest.mark.parametrize(
    "options, expected",
    [  # one worker (n = 1); tau -> s = eta_t / lr, lr = 0.5
        ({"threshold": 2.0}, {0: 1.0, 2: 1.0, 4: 0.5, 8: 0.25}),  # s = 2n / tau past 2n
        ({"threshold": 1.0, "smoothness": 0.25}, {1: 1.0, 2: 1.0, 4: 0.5, 8: 0.25}),
        ({"threshold": 1.0, "smoothness": 1.0}, {1: 1.0, 2: 0.25, 4: 0.125}),
    ],
)
def test_delay_adaptive_step_is_full_up_to_c_n_then_min_of_lr_and_1_over_4_l_tau(options, expected):
    """Past c n, s = min(1, 1 / (4 L tau lr)): L 0.25, tau 2: 1 / (4 * 0.25 * 2 * 0.5) = 1;
    tau 4: 0.5; L 1, tau 2: 0.25. Without L, s = c n / tau: c 2, tau 8: 0.25."""
    lr, records = 0.5, []
    params = make_params()
    with running_server("delay-adaptive", params=params, lr=lr, rule_options=options,
                        on_update=records.append) as server:  # fmt: skip
        with PSClient(server.endpoint) as ps:
            ps.hello()
            version = 0
            for tau, scale in sorted(expected.items()):
                version = _advance(ps, tau, base=version) if tau else version
                before = _copy(params)
                g = _dyadic((3, 4), seed=tau)
                reply = ps.push({"fc.w": g}, base=version - tau)
                assert reply.applied and reply.staleness == tau
                np.testing.assert_array_equal(params["fc.w"], _step(before["fc.w"], lr * scale, g))
                assert records[-1]["scale"] == scale and records[-1]["staleness"] == [tau]
                version = reply.version


def test_delay_adaptive_counts_the_runs_workers():
    rule = make_rule("delay-adaptive")  # c = 2
    rule.attach(None, WorkerRegistry(world_size=4, grace=1.0))
    assert rule.workers() == 4
    assert [rule.factor(tau, 0.1, rule.workers()) for tau in (0, 8, 9, 16)] == [1, 1, 8 / 9, 0.5]


# ---------------------------------------------------------------------------- fedbuff


def test_fedbuff_applies_the_staleness_weighted_mean_of_every_k_pushes():
    """K = 2. Round 1: a and b at base 0 (tau 0): w -= lr (g_a + g_b) / 2, t = 1. Round 2:
    c at base 0 (tau 1, weight 1/sqrt 2), d at base 1 (tau 0) without fc.b: fc.w gets
    (s g_c + g_d) / 2, fc.b gets s g_c / 2 (a parameter missing from a push adds 0)."""
    lr, records = 0.5, []
    params = make_params()
    g = {key: {name: _dyadic(shape, seed=i * 10 + j) for j, (name, shape) in
               enumerate(SHAPES.items())} for i, key in enumerate("abcd")}  # fmt: skip
    with running_server("fedbuff", params=params, lr=lr, on_update=records.append,
                        rule_options={"buffer_size": 2}) as server:  # fmt: skip
        with PSClient(server.endpoint) as ps:
            ps.hello()
            start = _copy(params)
            first = ps.push(g["a"], base=0)
            kept = _copy(params)
            second = ps.push(g["b"], base=0)
            round1 = _copy(params)
            third = ps.push(g["c"], base=0)
            fourth = ps.push({"fc.w": g["d"]["fc.w"]}, base=1)
    assert [(r.applied, r.version, r.staleness) for r in (first, second, third, fourth)] == [
        (False, 0, 0), (True, 1, 0), (False, 1, 1), (True, 2, 0)]  # fmt: skip
    assert _same(kept, start)  # a kept push changes nothing
    two = np.float32(2)
    for name in SHAPES:
        mean = (g["a"][name] * np.float32(1) + g["b"][name] * np.float32(1)) / two
        np.testing.assert_array_equal(round1[name], _step(start[name], lr, mean))
    s = np.float32(1 / math.sqrt(2))
    mean_w = (g["c"]["fc.w"] * s + g["d"]["fc.w"] * np.float32(1)) / two
    mean_b = (g["c"]["fc.b"] * s) / two
    np.testing.assert_array_equal(params["fc.w"], _step(round1["fc.w"], lr, mean_w))
    np.testing.assert_array_equal(params["fc.b"], _step(round1["fc.b"], lr, mean_b))
    assert [(r["version"], r["workers"], r["staleness"], r["scale"]) for r in records] == [
        (1, [0, 0], [0, 0], 1.0), (2, [0, 0], [1, 0], 1.0)]  # fmt: skip


def test_fedbuff_buffer_survives_a_checkpoint_and_a_resume(tmp_path):
    """K = 3: two pushes buffered, checkpoint, stop; the resumed server's third push makes
    the update of all three, bit for bit the one an uninterrupted server makes."""
    path = tmp_path / "checkpoint.npz"
    settings = {"rule": "fedbuff", "rule_options": {"buffer_size": 3}}
    grads = [{name: _dyadic(shape, seed=7 * i + j) for j, (name, shape) in
              enumerate(SHAPES.items())} for i in range(3)]  # fmt: skip
    with running_server(params=make_params(), **settings) as straight:
        with PSClient(straight.endpoint, worker_id="w0") as ps:
            ps.hello()
            for g in grads:
                ps.push(g, base=0)
        expected = snapshot(straight)
    with running_server(params=make_params(), checkpoint_path=path, **settings) as first:
        with PSClient(first.endpoint, worker_id="w0") as ps:
            ps.hello()
            for g in grads[:2]:
                assert not ps.push(g, base=0).applied
            ps.checkpoint()
        saved = {key: np.array(array) for key, array in rule_state(first.rule).items()}
    assert sorted(saved) == ["buffer/fc.b", "buffer/fc.w", "buffered", "workers"]
    assert int(saved["buffered"]) == 2
    with running_server(params=make_params(seed=5), resume=path, **settings) as resumed:
        state = rule_state(resumed.rule)
        assert all(state[key].tobytes() == saved[key].tobytes() for key in saved)
        with PSClient(resumed.endpoint, worker_id="w0") as ps:
            ps.hello()
            reply = ps.push(grads[2], base=0)
        assert reply.applied and reply.version == 1
        assert snapshot(resumed) == expected
        assert rule_state(resumed.rule) == {}  # the buffer was emptied by the update


def test_fedbuff_state_with_a_buffer_and_no_count_is_a_data_error():
    params = make_params()
    rule = make_rule("fedbuff")
    reader = StateReader({"buffer/fc.b": np.zeros(4, np.float32)}, params)
    with pytest.raises(DataError, match="rule/buffer and rule/buffered do not agree"):
        rule.read_state(reader)
    with pytest.raises(DataError, match="rule/buffered is not a count"):
        StateReader({"buffered": np.asarray(-1)}, params).count("buffered")


# ------------------------------------------------------------------ the CLI and runs


def test_the_rules_flags_reach_the_rules():
    def spec(rule, *flags):
        args = ["--rule", rule, "--model", "mlp", "--dataset", "synthetic", *flags]
        values = run_command().make_context("run", args).params
        for own in ("out", "eval_interval", "force", "dashboard", "dashboard_listen", "quiet"):
            values.pop(own)
        return RunConfig.from_options(values).rule_options

    assert spec("ringmaster", "--ringmaster-r", "3") == {"delay_threshold": 3}
    assert spec("delay-adaptive", "--adaptive-threshold", "1", "--adaptive-smoothness",
                "0.5") == {"threshold": 1.0, "smoothness": 0.5}  # fmt: skip
    assert spec("fedbuff", "--fedbuff-k", "2", "--fedbuff-weighting", "none") == {
        "buffer_size": 2, "weighting": "none"}  # fmt: skip


def test_ringmaster_and_delay_adaptive_default_to_plain_sgd_which_momentum_overrides():
    assert [RunConfig(rule=rule).momentum for rule in ("ringmaster", "delay-adaptive",
            "fedbuff")] == [0.0, 0.0, 0.9]  # fmt: skip
    chosen = RunConfig(rule="ringmaster", momentum=0.5, model="mlp", dataset="synthetic")
    chosen.validate()  # another momentum is the user's choice, not an error (as under dana)
    assert chosen.momentum == 0.5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rule", "asgd", "--fedbuff-k", "2"], "--fedbuff-k only applies to --rule fedbuff"),
        (["--rule", "fedbuff", "--rule-option", "buffer_size=0"], "buffer_size must be"),
        (["--rule", "ringmaster", "--rule-option", "delay_threshold=-1"], "delay_threshold"),
    ],
)
def test_bad_options_of_the_rules_are_one_line_errors(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["run", "--out", str(tmp_path), "--quiet", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


@pytest.mark.parametrize("rule", ["ringmaster", "delay-adaptive", "fedbuff"])
def test_minips_run_with_four_workers_and_two_servers_trains(tmp_path, capsys, rule):
    args = ["--workers", "4", "--servers", "2", "--model", "mlp", "--dataset", "synthetic"]
    main(["run", "--rule", rule, *args, "--epochs", "1", "--out", str(tmp_path), "--quiet"])
    assert "test accuracy" in capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rule"] == rule and summary["samples"] == 2000
    assert summary["accuracy"] > 0.5  # chance is 0.1
    assert [row["shard"] for row in summary["shards"]] == [0, 1]
    assert all(row["updates"] > 0 for row in summary["shards"])


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["fedbuff", "ringmaster"])
def test_a_browser_slot_trains_under_the_rule(tmp_path, monkeypatch, rule):
    """The rules are the server's: a browser worker (one of the two workers) follows them
    with nothing new, through fedbuff's `applied: false` while a push is buffered and
    ringmaster's drops."""
    require_browser()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    config = RunConfig(rule=rule, workers=2, browser=1, browser_headless=True,
                       listen="127.0.0.1:0", model="mlp", dataset="synthetic", epochs=2,
                       lr=0.05, momentum=0.5, join_wait=120.0)  # fmt: skip
    summary = run_local(config, tmp_path / "run", eval_interval=0.5, announce=lambda _: None)
    assert summary["rule"] == rule and summary["accuracy"] > 0.5
    assert_clean_exits(summary, tmp_path / "run")
    reports = [json.loads(p.read_text()) for p in (tmp_path / "run").glob("worker-*.json")]
    browser = [r for r in reports if r.get("agent") == "browser"]
    assert len(browser) == 1 and browser[0]["steps"] == 32  # a shard of 1000: 16 steps an epoch
