"""SGD against a hand-computed reference; the JSONL run log round-trips."""

import json

import numpy as np
import pytest

from minips.results.metrics import MetricsLog, merge_logs, read_metrics
from minips.state.store import SGD


def test_plain_sgd_step_is_w_minus_lr_grad():
    w = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    opt = SGD({"w": w}, lr=0.5)
    opt.step({"w": np.array([2.0, 2.0, -4.0], dtype=np.float32)})
    np.testing.assert_array_equal(w, [0.0, -3.0, 5.0])


def test_momentum_and_weight_decay_follow_the_pytorch_convention():
    w = np.array([1.0], dtype=np.float64)
    opt = SGD({"w": w}, lr=0.1, momentum=0.9, weight_decay=0.01)
    expected_w, velocity = 1.0, 0.0
    for grad in (1.0, -0.5, 2.0):
        opt.step({"w": np.array([grad])})
        g = grad + 0.01 * expected_w
        velocity = 0.9 * velocity + g
        expected_w -= 0.1 * velocity
        assert w[0] == pytest.approx(expected_w, rel=1e-12)


def test_scale_shrinks_only_the_named_parameter():
    a, b = np.ones(2, np.float32), np.ones(2, np.float32)
    opt = SGD({"a": a, "b": b}, lr=1.0)
    opt.step(
        {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}, scale={"a": 0.25, "b": 1.0}
    )
    np.testing.assert_array_equal(a, [0.75, 0.75])
    np.testing.assert_array_equal(b, [0.0, 0.0])


@pytest.mark.parametrize(
    "kwargs", [{"lr": 0}, {"lr": 0.1, "momentum": 1.0}, {"lr": 0.1, "weight_decay": -1}]
)
def test_bad_hyperparameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        SGD({"w": np.zeros(1)}, **kwargs)


def test_metrics_log_writes_one_json_object_per_line(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.write("eval", samples=np.int64(64), accuracy=np.float32(0.5), loss=float("nan"))
        log.write("summary", accuracy=0.5, wall_s=1.0, samples=64)
    records = read_metrics(path)
    assert [r["event"] for r in records] == ["eval", "summary"]
    assert records[0]["samples"] == 64 and records[0]["accuracy"] == 0.5
    assert records[0]["loss"] is None  # NaN is not JSON; written as null
    assert "time" in records[0] and "time" not in records[1]
    for line in path.read_text().splitlines():
        json.loads(line)


def test_metrics_log_without_path_writes_nothing(tmp_path):
    log = MetricsLog(None)
    assert log.write("eval", accuracy=1.0)["accuracy"] == 1.0
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_scale_shrinks_the_gradient_before_it_enters_the_velocity():
    # A stale gradient scaled by 1/4 must stay 1/4 in the momentum echo of later steps.
    w = np.zeros(1, np.float64)
    opt = SGD({"w": w}, lr=1.0, momentum=0.5)
    opt.step({"w": np.array([4.0])}, scale=0.25)  # v = 1, w = -1
    opt.step({"w": np.array([0.0])})  # v = 0.5, w = -1.5
    assert w[0] == pytest.approx(-1.5, rel=1e-12)


def test_logs_merge_in_time_order_and_records_are_copied_as_written(tmp_path):
    updates = [{"event": "update", "time": 0.5}, {"event": "update", "time": 2.0}]
    evals = [{"event": "eval", "time": 0.5, "accuracy": 0.1}, {"event": "eval", "time": 1.0}]
    for name, records in (("u.jsonl", updates), ("e.jsonl", evals)):
        with MetricsLog(tmp_path / name) as log:
            for record in records:
                log.write_record(record)  # kept as given: no new `time`
    merged = merge_logs([tmp_path / "u.jsonl", tmp_path / "missing.jsonl", tmp_path / "e.jsonl"])
    # by time; a tie keeps the order of the files given
    assert merged == [updates[0], evals[0], evals[1], updates[1]]


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.5, 0.01)])
def test_the_overflow_checks_norm_bounds_hold_for_every_new_version(
    tmp_path, momentum, weight_decay
):
    """The overflow check carries bounds on ||w|| and ||v|| from update to update (triangle
    inequality): never below the true norms, measured afresh for a new array (a load)."""
    from minips.ops.checkpoint_file import load_store, save_store
    from minips.ops.request_checks import OverflowCheck
    from minips.state.store import ParameterStore

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((20, 30)).astype(np.float32)}
    store = ParameterStore(
        params, SGD(params, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    )
    overflow = OverflowCheck(store)
    save_store(store, tmp_path / "start.npz")
    for step in range(30):
        grad = rng.standard_normal((20, 30)).astype(np.float32) * (step % 7)
        known = {"w": float((grad.astype(np.float64) ** 2).sum())} if step % 2 else {}
        overflow.check({"w": grad}, known)
        steps = [("w", grad if step % 3 else grad.copy(), 0.5 + step % 3)]  # a copy: measured
        store.write(steps)
        overflow.carry(steps)
        norm_w, norm_v = overflow.norm_bounds("w")
        velocity = store.optimizer.velocity.get("w", np.zeros(1))
        assert norm_w >= np.linalg.norm(store.params["w"]) * (1 - 1e-6)
        assert norm_v >= np.linalg.norm(velocity) * (1 - 1e-6)
    assert norm_w < 10 * np.linalg.norm(store.params["w"])  # bounds, but not useless ones
    load_store(store, tmp_path / "start.npz")  # a new array under the same name: measured afresh
    assert overflow.norm_bounds("w")[0] == pytest.approx(np.linalg.norm(store.params["w"]))
