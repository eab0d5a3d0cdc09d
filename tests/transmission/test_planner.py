"""The planner: its byte counts, its network model, its choices for fixed measurements,
and one meaning of a link rate in `minips plan` and `minips run`.

Every choice here is made with fixed, injected compute and codec times (FIXED below: this
machine's, measured once), so no verdict depends on the speed of the machine running it.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from minips.cli import cli
from minips.cli.plan_table import format_table
from minips.errors import ConfigError
from minips.nn import build_model, lenet5, softmax_cross_entropy
from minips.run.config import RunConfig
from minips.run.netlimit import Link
from minips.run.plan_measure import choose_plan, parse_network
from minips.transmission.codecs import Encoder, Factors
from minips.transmission.plan import Plan
from minips.transmission.planning.plan_costs import CodecTime, LayerTime, pull_bytes, push_bytes
from minips.transmission.planning.plan_samples import sample_cost
from minips.transmission.planning.planner import (
    MIN_GAIN,
    SF16,
    WAIT_FREE_GAIN,
    Cluster,
    Measured,
    ParamChoice,
    delta,
    predict_step,
    push_ladder,
)

DENSE_BYTES = 431_080 * 4  # LeNet-5, each way
LAYERS = [LayerTime("conv1", "conv", 4.4, 4.0), LayerTime("conv2", "conv", 5.5, 9.8),
          LayerTime("fc1", "fc", 0.8, 1.5), LayerTime("fc2", "fc", 0.04, 0.07)]  # fmt: skip
# (parameter, direction, encoding) -> CPU ms (worker, server[, per worker]); the rest 0.
CODECS = {
    ("fc1.w", "push", "fp16"): CodecTime(3.0, 1.8),
    ("fc1.w", "push", "sf fp16"): CodecTime(0.4, 0.8),
    ("fc1.w", "push", "topk 2% mc"): CodecTime(1.8, 0.2),
    ("fc1.w", "push", "topk 1% mc"): CodecTime(1.2, 0.1),
    ("fc1.w", "pull", "fp16"): CodecTime(0.9, 1.7, False),
    ("fc1.w", "pull", "delta 10% fp16 warm-up 20"): CodecTime(0.6, 4.2),
    ("fc1.w", "pull", "delta 5% fp16 warm-up 20"): CodecTime(0.3, 2.9),
    ("conv2.w", "push", "fp16"): CodecTime(0.3, 0.2),
    ("conv2.w", "pull", "fp16"): CodecTime(0.1, 0.2, False),
}
FIXED = Measured(LAYERS, CODECS)
ON_TWO_CORES = Cluster(workers=4, cores=2)


def plan_for(cluster=ON_TWO_CORES, **link):
    network = parse_network(**link)
    return choose_plan(build_model("lenet5"), 64, cluster, network, measured=FIXED, momentum=0.9)


# -------------------------------------------------------------------------- bytes


def test_codec_bytes_are_the_encoders_bytes():
    """The planner's byte counts equal what the Encoder really produces."""
    rng = np.random.default_rng(0)
    model = lenet5(seed=0)
    x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    _, dlogits = softmax_cross_entropy(model.forward(x), rng.integers(0, 10, 64))
    model.backward(dlogits)
    x1, dy1 = model.layers["fc1"].sufficient_factors()
    specs = ["dense", "fp16", {"codec": "topk", "ratio": 0.01},
             {"codec": "sf", "dtype": "float16"}, {"codec": "lowrank", "rank": 4}]  # fmt: skip
    for spec in specs:
        encoder = Encoder()
        is_sf = isinstance(spec, dict) and spec["codec"] == "sf"
        grad = Factors(x1, dy1) if is_sf else model.grads["fc1.w"]
        encoder.encode({"fc1.w": grad}, {"fc1.w": spec})
        assert encoder.bytes_sent["fc1.w"] == push_bytes(spec, (800, 500), 64), spec
    delta = {"codec": "delta", "ratio": 0.05, "dtype": "float16"}
    assert pull_bytes(delta, (800, 500)) == 20_000 * (4 + 2)


# ------------------------------------------------------------------------ network


def test_contention_is_workers_and_servers_over_cores():
    assert Cluster(workers=4, cores=2).contention() == 2.5
    assert Cluster(workers=4, servers=2, cores=3).contention() == 2
    assert Cluster(workers=1, cores=8).contention() == 1


def test_plan_and_run_read_bandwidth_and_netem_the_same_way(tmp_path):
    """`minips plan --bandwidth R` and `minips run --plan auto --bandwidth R` (the planner
    run inside the launcher, and the workers' token buckets) assume the same link; so do
    both commands' `--netem R`."""
    from minips.results.rundir import RunDir
    from minips.run.build import resolve_plan
    from minips.run.prepare import _plan_in_subprocess

    for option, share in (("bandwidth", 12.5e6), ("netem", 12.5e6 / 4)):
        path = tmp_path / f"{option}.json"
        argv = ["plan", "--workers", "4", f"--{option}", "100mbit", "--repeats", "1"]
        result = CliRunner().invoke(cli, [*argv, "--json", str(path)])
        assert result.exit_code == 0, result.output
        by_plan = json.loads(path.read_text())["predicted"]
        config = RunConfig(workers=4, plan="auto", **{option: "100mbit"})
        by_run = resolve_plan(config).predicted  # `minips server --plan auto`
        run_dir = RunDir(tmp_path / option)
        run_dir.logs.mkdir(parents=True)
        _plan_in_subprocess(config, run_dir)  # what `minips run --plan auto` runs
        by_launch = json.loads(run_dir.plan.read_text())["predicted"]
        assert by_plan["rate_bytes_per_s"] == by_run["rate_bytes_per_s"] == share
        assert by_launch["rate_bytes_per_s"] == share
        assert by_plan["link"] == by_run["link"] == by_launch["link"]
        if option == "bandwidth":  # what each worker's token bucket paces
            assert Link.from_option(config.bandwidth).rate == share


# ------------------------------------------------------------------------ choices


def test_no_link_limit_and_a_fast_link_are_all_dense():
    for link in ({}, {"bandwidth": "10gbit"}):
        report = plan_for(**link)
        assert report.plan.is_dense() and report.plan.to_dict()["params"] == {}
        assert report.plan.predicted["up_bytes_per_step"] == DENSE_BYTES


@pytest.mark.parametrize("link", [{"bandwidth": "20mbit"}, {"netem": "100mbit"}])
def test_a_slow_link_is_compressed_within_the_byte_targets(link):
    report = plan_for(**link)
    plan, p = report.plan, report.plan.predicted
    assert plan.wait_free and not plan.is_dense()
    assert plan.param("fc1.w").push != "dense" and plan.param("fc1.w").pull != "dense"
    assert DENSE_BYTES / p["up_bytes_per_step"] >= 10
    assert 2 * DENSE_BYTES / (p["up_bytes_per_step"] + p["down_bytes_per_step"]) >= 5
    for conv in ("conv1.w", "conv2.w"):  # conv weights stop at fp16 both ways
        assert plan.param(conv).push in ("dense", "fp16")
        assert plan.param(conv).pull in ("dense", "fp16")
    for bias in ("conv1.b", "conv2.b", "fc1.b", "fc2.b"):
        assert plan.param(bias).push == "dense" and plan.param(bias).pull == "dense"
    assert p["time_to_accuracy_vs_dense"] <= MIN_GAIN
    assert p["step_ms"] < p["dense_step_ms"] / 3


def test_the_more_compute_a_step_has_the_less_it_compresses():
    """With the same link, a step with more compute hides more traffic: it never sends
    fewer bytes, and with enough compute it is all dense."""
    sent = []
    for compute_ms in (20.0, 60.0, 200.0, 600.0, 5000.0):
        cluster = Cluster(workers=4, cores=2, compute_ms=compute_ms)
        p = plan_for(cluster, bandwidth="100mbit").plan.predicted
        sent.append(p["up_bytes_per_step"] + p["down_bytes_per_step"])
    assert sent == sorted(sent) and sent[0] < sent[-1] == 2 * DENSE_BYTES


def test_the_slower_the_link_the_fewer_the_bytes():
    rates = ["10gbit", "1gbit", "300mbit", "100mbit", "50mbit", "20mbit", "5mbit"]
    sent = []
    for rate in rates:
        p = plan_for(bandwidth=rate).plan.predicted
        sent.append(p["up_bytes_per_step"] + p["down_bytes_per_step"])
    assert sent == sorted(sent, reverse=True) and sent[0] > sent[-1]


def test_the_compute_is_shared_by_the_workers_and_the_server():
    """The same link and layers: 4 workers and a server on 2 cores compute 2.5x slower
    than one worker has them alone, so its step hides more traffic."""
    alone = plan_for(Cluster(workers=4, cores=64), bandwidth="100mbit").plan.predicted
    shared = plan_for(Cluster(workers=4, cores=2), bandwidth="100mbit").plan.predicted
    assert shared["compute_ms"] == pytest.approx(2.5 * alone["compute_ms"])
    assert shared["up_bytes_per_step"] + shared["down_bytes_per_step"] >= (
        alone["up_bytes_per_step"] + alone["down_bytes_per_step"]
    )


def test_the_server_encodes_a_delta_pull_per_worker_and_an_fp16_pull_once_per_version():
    """4 workers on 8 cores (no contention): the delta (from each worker's replica) costs
    the server 4 x its 3 ms a round, the shared fp16 copy its 2 ms once."""
    pulls = {("fc1.w", "pull", "fp16"): CodecTime(0.0, 2.0, False),
             ("fc1.w", "pull", "delta 10% fp16 warm-up 20"): CodecTime(0.0, 3.0, True)}  # fmt: skip
    measured = Measured([LayerTime("fc1", "fc", 1.0, 1.0)], pulls)
    cluster = Cluster(workers=4, cores=8)
    server_ms = []
    for rung in (0, 1):
        choice = ParamChoice("fc1.w", "fc1", (784, 256), ["dense"], ["fp16", delta(0.1)],
                             pull_rung=rung)  # fmt: skip
        server_ms.append(predict_step(measured, [choice], 64, cluster, None, False)["server"])
    assert server_ms == [pytest.approx(2.0), pytest.approx(12.0)]


def test_sufficient_factors_are_offered_only_where_they_are_smaller_than_the_weight():
    """Poseidon's rule: B (in + out) < in x out, strictly (equal bytes: nothing saved)."""
    assert SF16 in push_ladder((784, 256), "fc", 64)  # 66,560 < 200,704
    assert SF16 not in push_ladder((784, 256), "fc", 256)  # 266,240 > 200,704
    assert SF16 in push_ladder((128, 128), "fc", 63)  # 16,128 < 16,384
    assert SF16 not in push_ladder((128, 128), "fc", 64)  # 16,384 = 16,384
    assert SF16 not in push_ladder((784, 256), "other", 1)  # fc matrices only


RATES = ["10gbit", "1gbit", "300mbit", "100mbit", "50mbit", "20mbit", "5mbit"]
COMPUTE_MS = (None, 20.0, 60.0, 200.0)


def _sweep():
    for compute_ms in COMPUTE_MS:
        cluster = Cluster(workers=4, cores=2, compute_ms=compute_ms)
        for rate in RATES:
            for option in ("bandwidth", "netem"):
                yield plan_for(cluster, **{option: rate})


def test_a_pair_of_encodings_measured_nowhere_is_never_chosen():
    """A tensor's push and pull are charged as the measured PAIR: sf up with a delta
    down (measured nowhere; in real runs 1.35x dense's samples to 85 %) is never picked,
    on any link or compute."""
    for report in _sweep():
        for c in report.choices:
            assert sample_cost("lenet5", c.name, c.push, c.pull) < float("inf"), (c.push, c.pull)
            assert not (isinstance(c.push, dict) and c.push["codec"] == "sf"
                        and isinstance(c.pull, dict)), report.plan.predicted["link"]  # fmt: skip


def test_each_step_down_must_cut_the_time_to_accuracy_by_the_margin():
    """Dense goes wait-free only at <= WAIT_FREE_GAIN x its predicted time to accuracy;
    lossless codecs only at <= MIN_GAIN x the less of dense's two, lossy ones only at <=
    MIN_GAIN x the less lossy plans'; and the margin is what decides somewhere: a lossy
    plan predicted faster, but not by the margin, loses to a less lossy one."""
    decided_by_margin = lossy_taken = wait_free_taken = False
    for report in _sweep():
        p = report.plan.predicted
        keys = ("time_to_accuracy_vs_dense", "dense_wait_free_time_vs_dense",
                "lossless_time_vs_dense", "lossy_time_vs_dense")  # fmt: skip
        t, wait_free, lossless, lossy = (p[k] for k in keys)
        least_dense = min(1.0, wait_free)
        tier = p["chosen"]
        if tier == "lossy":
            assert t == lossy <= MIN_GAIN * min(least_dense, lossless)
            lossy_taken = True
        elif tier == "lossless":
            assert t == lossless <= MIN_GAIN * least_dense
        elif tier == "dense wait-free":
            assert t == wait_free <= WAIT_FREE_GAIN and lossless > MIN_GAIN * wait_free
            wait_free_taken = True
        else:
            assert t == 1 and wait_free > WAIT_FREE_GAIN and lossless > MIN_GAIN
        decided_by_margin |= lossy < min(least_dense, lossless) and p["samples_factor"] == 1
    assert decided_by_margin and lossy_taken and wait_free_taken


def test_a_fast_link_sends_dense_wait_free():
    """1 Gbit/s each: fc1's dense gradient crosses the link while conv2 and conv1 are still
    in backward, so dense sent wait-free beats dense after backward by more than
    WAIT_FREE_GAIN, and no codec gains the margin over it: the plan is every parameter
    dense, sent wait-free (measured faster than dense, docs/results.md)."""
    report = plan_for(bandwidth="1gbit")
    p = report.plan.predicted
    assert p["chosen"] == "dense wait-free" and p["samples_factor"] == 1
    assert report.plan.wait_free and report.plan.to_dict()["params"] == {}
    assert p["up_bytes_per_step"] == p["down_bytes_per_step"] == DENSE_BYTES
    assert p["dense_wait_free_time_vs_dense"] <= WAIT_FREE_GAIN
    assert p["lossless_time_vs_dense"] > MIN_GAIN * p["dense_wait_free_time_vs_dense"]
    assert p["step_parts_ms"]["push"] < 1.0  # hidden behind backward
    table = format_table(report)
    assert "choice: all dense, wait-free sending" in table and "dense wait-free" in table


def test_minips_plan_prints_the_table_and_writes_a_plan_run_accepts(tmp_path):
    from minips.run.build import resolve_plan

    path = tmp_path / "plan.json"
    result = CliRunner().invoke(
        cli, ["plan", "--bandwidth", "20mbit", "--repeats", "1", "--json", str(path)]
    )
    assert result.exit_code == 0, result.output
    for words in ("fc1.w", "link: each worker's own 20 Mbit/s", "predicted step", "choice:"):
        assert words in result.output
    plan = resolve_plan(RunConfig(plan=str(path)))
    assert plan == Plan.from_dict(json.loads(path.read_text()))
    bad = CliRunner().invoke(cli, ["plan", "--netem", "fast"])
    assert isinstance(bad.exception, ConfigError) and "bad rate" in str(bad.exception)
