"""Gap-Aware, DANA and DANA-GA (minips.rules.gap, minips.rules.dana): every branch over
real sockets against hand computations, and a convergence run of each.

The hand computations repeat the rules' float32 operations in the same order (lr * gamma
and 1 - decay**k are Python floats cast once), so parameters compare bit for bit.
"""

import json

import numpy as np
import pytest
from test_server_support import make_params, running_server, train_two_workers

import minips
from minips.cli import main
from minips.data import load_dataset
from minips.errors import ConfigError
from minips.nn import build_model
from minips.results.metrics import read_metrics
from minips.run.config import RunConfig
from minips.trainer import evaluate
from minips.transmission.plan import ParamPlan, Plan
from minips.worker.client import PSClient
from minips.worker.worker import apply_delta

F32 = np.float32


def _random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _grads(seed):
    """fc.w with a zero column (those coordinates never move: C = 0 there), and fc.b."""
    w = _random((3, 4), seed)
    w[:, 0] = 0
    return {"fc.w": w, "fc.b": _random(4, seed + 100)}


def _copy(arrays):
    return {name: np.array(array) for name, array in arrays.items()}


class HandGap:
    """GapPenalty by hand: A <- decay A + (1 - decay) move^2, C = sqrt(A / (1 - decay^k))."""

    def __init__(self, decay):
        self.decay, self.mean_sq, self.count = decay, {}, 0

    def record(self, before, after):
        for name in before:
            square = F32(1.0 - self.decay) * ((after[name] - before[name]) ** 2)
            old = self.mean_sq.get(name)
            self.mean_sq[name] = square if old is None else F32(self.decay) * old + square
        self.count += 1

    def penalize(self, grads, now, then):
        """(g / G, mean of |w - w_then| / C per layer): G = 1 + |w - w_then| / C."""
        if not self.count:
            return dict(grads), {"fc": 0.0}
        out, behind_sum = {}, 0.0
        for name, grad in grads.items():
            size = np.sqrt(self.mean_sq[name] / F32(1.0 - self.decay**self.count))
            behind = np.abs(now[name] - then[name]) / np.where(size > 0, size, F32(np.inf))
            out[name] = grad / (F32(1) + behind)
            behind_sum += float(behind.sum(dtype=np.float64))
        return out, {"fc": behind_sum / 16}


def _sgd(params, grads, lr):
    return {name: params[name] - F32(lr) * grads[name] for name in params}


# --------------------------------------------------------------------------------- gap


def test_gap_divides_each_coordinate_by_its_gap_in_typical_steps():
    """a's first push: nothing has moved (G = 1). b's push at base 0 after a's update: the
    gap is a's move, C its RMS. a's push at base 1 after b's: k = 2 moves averaged."""
    lr, decay = 0.5, 0.75
    params = make_params()
    hand, records = HandGap(decay), []
    g = [_grads(seed) for seed in (1, 2, 3)]
    with running_server(
        "gap", params=params, lr=lr, rule_options={"decay": decay}, on_update=records.append
    ) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello(), b.hello()
            w0 = _copy(a.pull().params)
            b.pull()
            assert a.push(g[0], base=0).applied  # nothing has moved yet: G = 1
            w1 = _sgd(w0, g[0], lr)
            np.testing.assert_array_equal(params["fc.w"], w1["fc.w"])
            hand.record(w0, w1)
            at_a = _copy(a.pull(since=0).params)  # a now computes at version 1
            step, behind_b = hand.penalize(g[1], w1, w0)  # b computed at w0
            assert b.push(g[1], base=0).staleness == 1
            w2 = _sgd(w1, step, lr)
            for n in w2:
                np.testing.assert_array_equal(params[n], w2[n])
            hand.record(w1, w2)
            step, behind_a = hand.penalize(g[2], w2, at_a)  # k = 2 moves in C
            assert a.push(g[2], base=1).staleness == 1
    for n in w2:
        np.testing.assert_array_equal(params[n], _sgd(w2, step, lr)[n])
    assert [r["staleness"] for r in records] == [[0], [1], [1]]
    assert records[0]["value_staleness"] == {"fc": 0.0}
    for record, behind in zip(records[1:], (behind_b, behind_a), strict=True):
        assert record["value_staleness"]["fc"] == pytest.approx(behind["fc"], rel=1e-6)
        assert record["value_staleness"]["fc"] > 0.5  # penalized: not a no-op
    assert all(r["scale"] == 1.0 for r in records)  # the penalty is in the gradient


def test_gap_without_a_matching_pull_is_plain_asgd_and_forgets_a_departed_worker():
    lr = 0.25
    params = make_params()
    with running_server("gap", params=params, lr=lr) as server:
        with PSClient(server.endpoint) as worker, PSClient(server.endpoint) as mover:
            worker.hello(), mover.hello()
            mover.push(_grads(1), base=0)  # the step size exists from here on
            worker.pull()  # version 1
            worker.bye()
            worker.hello()  # back without pulling: no reference point
            mover.push(_grads(2), base=1)
            before = _copy(params)
            g = _grads(3)
            assert worker.push(g, base=1).staleness == 1
            np.testing.assert_array_equal(params["fc.w"], _sgd(before, g, lr)["fc.w"])
            stranger = PSClient(server.endpoint)
            with stranger:
                stranger.hello()  # never pulled
                before = _copy(params)
                stranger.push(g, base=2)
            np.testing.assert_array_equal(params["fc.b"], _sgd(before, g, lr)["fc.b"])


def test_gap_measures_no_gap_for_a_push_older_than_the_workers_last_pull():
    """A push computed at version 1 that arrives after the worker pulled version 2 (a
    layer of a wait-free step, a late retry): its values are gone, so it is plain ASGD,
    not measured against version 2's."""
    lr = 0.25
    params = make_params()
    with running_server("gap", params=params, lr=lr) as server:
        with PSClient(server.endpoint) as worker, PSClient(server.endpoint) as mover:
            worker.hello(), mover.hello()
            mover.push(_grads(1), base=0)
            worker.pull()  # version 1
            mover.push(_grads(2), base=1)
            worker.pull(since=1)  # version 2: the worker now computes here
            mover.push(_grads(4), base=2)  # version 3: 2 -> 3 is a gap from version 2
            before, g = _copy(params), _grads(3)
            assert worker.push(g, base=1).staleness == 2
            for name in before:
                np.testing.assert_array_equal(params[name], _sgd(before, g, lr)[name])


def test_gap_leaves_a_coordinate_whose_typical_step_is_zero_unpenalized():
    """decay 0: C is the last move. Column 0 of fc.w moved in the first update, not in the
    second, so C = 0 there: G = 1 although b's values are one move behind there."""
    lr = 0.5
    params = make_params()
    hand = HandGap(0.0)
    g1, g3 = ({"fc.w": _random((3, 4), seed), "fc.b": _random(4, seed + 100)} for seed in (1, 3))
    g2 = _grads(2)  # column 0 of fc.w zero: it does not move
    with running_server("gap", params=params, lr=lr, rule_options={"decay": 0.0}) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello(), b.hello()
            w0 = _copy(a.pull().params)
            b.pull()
            a.push(g1, base=0)
            w1 = _copy(params)
            hand.record(w0, w1)
            a.pull(since=0)
            a.push(g2, base=1)  # a computed at w1: no gap, G = 1
            w2 = _copy(params)
            hand.record(w1, w2)
            step, _ = hand.penalize(g3, w2, w0)
            assert not np.array_equal(w2["fc.w"][:, 0], w0["fc.w"][:, 0])
            b.push(g3, base=0)
    np.testing.assert_array_equal(step["fc.w"][:, 0], g3["fc.w"][:, 0])  # G = 1 at C = 0
    np.testing.assert_array_equal(params["fc.w"], _sgd(w2, step, lr)["fc.w"])


def test_gap_penalty_enters_before_the_servers_momentum():
    """v <- m v + g / G;  w <- w - lr v (the move recorded is lr v)."""
    lr, momentum, decay = 0.5, 0.9, 0.5
    params = make_params()
    hand = HandGap(decay)
    g1, g2 = _grads(1), _grads(2)
    with running_server(
        "gap", params=params, lr=lr, momentum=momentum, rule_options={"decay": decay}
    ) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello(), b.hello()
            w0 = _copy(a.pull().params)
            b.pull()
            a.push(g1, base=0)  # G = 1: v = g1
            w1 = _copy(params)
            hand.record(w0, w1)
            step, _ = hand.penalize(g2, w1, w0)
            b.push(g2, base=0)
    velocity = {n: F32(momentum) * g1[n] + step[n] for n in g1}
    np.testing.assert_array_equal(params["fc.w"], _sgd(w1, velocity, lr)["fc.w"])


# -------------------------------------------------------------------------------- dana


@pytest.mark.parametrize("momentum", [0.9, 0.5, 0.1])
def test_dana_needs_the_servers_momentum_off(momentum):
    wanted = f"leave --momentum unset \\(not {momentum:g}\\), or choose a --rule"
    with pytest.raises(ConfigError, match=wanted):
        with running_server("dana", momentum=momentum):
            pass


def test_a_rule_with_its_own_momentum_sets_the_servers_and_the_others_get_the_default():
    assert RunConfig().rule == "dana-gap" and RunConfig().momentum == 0.0
    assert RunConfig(rule="dana").momentum == 0.0
    assert RunConfig(rule="asgd").momentum == RunConfig(rule="ssgd").momentum == 0.9
    assert RunConfig(rule="asgd", momentum=0.5).momentum == 0.5


@pytest.mark.parametrize(
    "options, message",
    [({"momentum": 1.0}, "in \\[0, 1\\)"), ({"decay": -0.1}, "in \\[0, 1\\)"), ({"x": 1}, "x")],
)
def test_dana_gap_bad_options_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        minips.make_rule("dana-gap", **options)


def _look_ahead(params, total, lr, gamma):
    return {n: params[n] - F32(lr * gamma) * total[n] for n in params}


def test_dana_keeps_one_momentum_per_worker_and_sends_the_look_ahead():
    lr, gamma = 0.5, 0.75
    params = make_params()
    g1, g2, g3 = _grads(1), _grads(2), _grads(3)
    with running_server("dana", params=params, lr=lr, rule_options={"momentum": gamma}) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            with PSClient(server.endpoint) as observer:
                a.hello(), b.hello(), observer.hello({"role": "observer"})
                w0 = _copy(params)
                first = a.pull().params  # nothing pushed yet: the look-ahead is w
                assert all(np.array_equal(first[n], w0[n]) for n in w0)
                b.pull()
                a.push(g1, base=0)  # v_a = g1
                w1 = _sgd(w0, g1, lr)
                np.testing.assert_array_equal(params["fc.w"], w1["fc.w"])
                sent = a.pull(since=0).params
                for n in w1:
                    np.testing.assert_array_equal(sent[n], _look_ahead(w1, g1, lr, gamma)[n])
                b.push(g2, base=0)  # v_b = g2
                w2 = _sgd(w1, g2, lr)
                total = {n: g1[n] + g2[n] for n in g1}
                a.push(g3, base=1)  # v_a = gamma g1 + g3
                v_a = {n: F32(gamma) * g1[n] + g3[n] for n in g1}
                w3 = _sgd(w2, v_a, lr)
                total = {n: total[n] + (v_a[n] - g1[n]) for n in g1}
                np.testing.assert_array_equal(params["fc.b"], w3["fc.b"])
                sent = b.pull(since=0).params
                for n in w3:
                    np.testing.assert_array_equal(sent[n], _look_ahead(w3, total, lr, gamma)[n])
                seen = observer.pull().params  # the evaluator sees w itself
                assert all(np.array_equal(seen[n], w3[n]) for n in w3)
                b.bye()  # its momentum leaves the sum
                sent = a.pull(since=0).params
                total = {n: total[n] - g2[n] for n in g1}
                for n in w3:
                    np.testing.assert_array_equal(sent[n], _look_ahead(w3, total, lr, gamma)[n])


def test_dana_sends_the_look_ahead_in_a_fused_push_and_pull_too():
    lr, gamma = 0.5, 0.75
    params = make_params()
    g1 = _grads(1)
    with running_server("dana", params=params, lr=lr, rule_options={"momentum": gamma}) as server:
        with PSClient(server.endpoint) as a:
            a.hello()
            w0 = _copy(a.pull().params)
            reply = a.push(g1, base=0, pull_since=0)
    assert reply.applied and reply.pull.version == 1
    w1 = _sgd(w0, g1, lr)
    for n in w1:
        np.testing.assert_array_equal(reply.pull.params[n], _look_ahead(w1, g1, lr, gamma)[n])


def test_dana_gap_forgets_the_look_ahead_of_a_worker_that_left():
    """Back after a bye without pulling, a push at its old pull's version has no reference
    point: plain DANA (v = g for its first push since), not a gap from the old look-ahead."""
    lr = 0.25
    params = make_params()
    options = {"momentum": 0.5, "decay": 0.5}
    with running_server("dana-gap", params=params, lr=lr, rule_options=options) as server:
        with PSClient(server.endpoint) as worker, PSClient(server.endpoint) as mover:
            worker.hello(), mover.hello()
            mover.push(_grads(1), base=0)  # the step size exists from here on
            worker.pull()  # version 1: the look-ahead w1 - lr gamma v_mover
            worker.bye()
            worker.hello()
            mover.push(_grads(2), base=1)
            before = _copy(params)
            g = _grads(3)
            assert worker.push(g, base=1).staleness == 1
    np.testing.assert_array_equal(params["fc.w"], _sgd(before, g, lr)["fc.w"])
    np.testing.assert_array_equal(params["fc.b"], _sgd(before, g, lr)["fc.b"])


def test_dana_gap_measures_the_gap_from_the_look_ahead_it_sent():
    lr, gamma, decay = 0.5, 0.5, 0.75
    params = make_params()
    hand = HandGap(decay)
    g1, g2, g3 = _grads(1), _grads(2), _grads(3)
    options = {"momentum": gamma, "decay": decay}
    records = []
    with running_server(
        "dana-gap", params=params, lr=lr, rule_options=options, on_update=records.append
    ) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello(), b.hello()
            w0 = _copy(a.pull().params)
            b.pull()
            a.push(g1, base=0)  # nothing has moved yet: G = 1, v_a = g1
            w1 = _sgd(w0, g1, lr)
            np.testing.assert_array_equal(params["fc.w"], w1["fc.w"])
            hand.record(w0, w1)
            ahead_a = _copy(a.pull(since=0).params)  # w1 - lr gamma v_a
            step_b, _ = hand.penalize(g2, w1, w0)  # b computed at w0
            b.push(g2, base=0)
            w2 = _sgd(w1, step_b, lr)
            np.testing.assert_array_equal(params["fc.w"], w2["fc.w"])
            hand.record(w1, w2)
            step_a, behind = hand.penalize(g3, w2, ahead_a)  # a computed at its look-ahead
            a.push(g3, base=1)
    v_a = {n: F32(gamma) * g1[n] + step_a[n] for n in g1}
    np.testing.assert_array_equal(params["fc.w"], _sgd(w2, v_a, lr)["fc.w"])
    np.testing.assert_array_equal(params["fc.b"], _sgd(w2, v_a, lr)["fc.b"])
    assert records[-1]["value_staleness"]["fc"] == pytest.approx(behind["fc"], rel=1e-6)


# ------------------------------------------------------------------------- convergence

FAST = {"model": "mlp", "dataset": "synthetic", "lr": 0.05}


@pytest.mark.parametrize(
    "rule, momentum, options",
    [("gap", 0.5, {}), ("dana", 0.0, {"momentum": 0.5}), ("dana-gap", 0.0, {"momentum": 0.5})],
    ids=["gap", "dana", "dana-gap"],
)
def test_two_workers_converge_over_sockets(rule, momentum, options):
    spec = RunConfig(epochs=1, workers=2, rule=rule, rule_options=options, momentum=momentum,
                     bind="tcp://127.0.0.1:*", **FAST)  # fmt: skip
    params, records, reports, stats = train_two_workers(spec)
    model = build_model("mlp", seed=0)
    model.set_params(params)
    data = load_dataset("synthetic")
    accuracy, _ = evaluate(model, data.x_test, data.y_test)
    assert accuracy >= 0.9
    assert sum(report.samples for report in reports) == 2000
    assert stats["updates"] == len(records) and stats["extra_bytes_in"] == 0
    assert all(r["rule"] == rule for r in records)
    if rule != "dana":  # the gap was measured on (nearly) every push
        measured = [r for r in records if r["value_staleness"]]
        assert len(measured) >= len(records) - 2


def test_minips_run_dana_gap_from_the_cli(tmp_path, capsys):
    main(
        ["run", "--rule", "dana-gap", "--rule-option", "momentum=0.5",
         "--model", "mlp", "--dataset", "synthetic", "--lr", "0.05", "--epochs", "2",
         "--out", str(tmp_path), "--quiet", "--eval-interval", "0.5"]
    )  # fmt: skip
    assert "test accuracy" in capsys.readouterr().out
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rule"] == "dana-gap" and config["rule_options"] == {"momentum": 0.5}
    assert config["momentum"] == 0.0  # the rule's own choice: no --momentum 0 needed
    records = read_metrics(tmp_path / "metrics.jsonl")
    updates = [r for r in records if r["event"] == "update"]
    assert updates and all(r["rule"] == "dana-gap" for r in updates)
    assert records[-1]["accuracy"] >= 0.9


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rule", "dana", "--gap-decay", "0.9"], "--gap-decay only applies to --rule gap"),
        (
            ["--rule", "gap", "--dana-momentum", "0.5"],
            "--dana-momentum only applies to --rule dana",
        ),
    ],
)
def test_gap_and_dana_flags_belong_to_their_rule(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["run", "--out", str(tmp_path), "--quiet", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_dana_under_a_plan_sends_the_look_ahead_in_the_plans_pull_encodings():
    """fp16 pulls carry the look-ahead rounded; delta pulls bring the worker's copy to it."""
    lr, gamma = 0.5, 0.75
    params = make_params()
    g1 = _grads(1)
    plan = Plan(
        {"fc.w": ParamPlan(pull={"codec": "delta", "ratio": 1.0}), "fc.b": ParamPlan(pull="fp16")}
    )
    with running_server("dana", params=params, lr=lr, rule_options={"momentum": gamma}) as server:
        server.use_plan(plan)
        with PSClient(server.endpoint) as a:
            a.hello()
            first = a.pull()
            copy = {name: np.array(v, np.float32) for name, v in first.params.items()}
            w0 = _copy(params)  # the server's own (its fc.b went out rounded to fp16)
            reply = a.push(g1, base=0, pull_since=0).pull
    ahead = _look_ahead(_sgd(w0, g1, lr), g1, lr, gamma)
    assert reply.params["fc.b"].dtype == np.float16
    np.testing.assert_array_equal(reply.params["fc.b"], ahead["fc.b"].astype(np.float16))
    apply_delta(copy["fc.w"], reply.deltas["fc.w"]["indices"], reply.deltas["fc.w"]["values"])
    np.testing.assert_allclose(copy["fc.w"], ahead["fc.w"], rtol=0, atol=1e-6)
    assert not np.allclose(copy["fc.w"], _sgd(w0, g1, lr)["fc.w"])  # not w itself
