"""A plan checked where a run reads it (minips/run/plan_checks.py): a plan file or map and
its codec specs, each refusal one line, and its fit to the model."""

import json

import pytest

from minips.errors import ConfigError
from minips.nn import lenet5
from minips.run.plan_checks import (
    check_document,
    check_model,
    check_spec,
    checked_plan,
    load_plan,
)
from minips.transmission.plan import ParamPlan, Plan

LENET_SHAPES = {name: a.shape for name, a in lenet5().params.items()}


def test_a_plan_file_is_read_checked_and_built(tmp_path):
    plan = Plan(params={"fc1.w": ParamPlan(push={"codec": "topk", "ratio": 0.01}, every=2)})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    assert load_plan(str(path)) == plan
    assert load_plan("dense") == load_plan(None) == Plan()
    path.write_text("not json")
    with pytest.raises(ConfigError, match="is not readable JSON"):
        load_plan(str(path))


@pytest.mark.parametrize(
    "document, words",
    [
        ({"params": {"fc1.w": {"push": "zip"}}}, "unknown codec"),
        ({"params": {"fc1.w": {"pull": {"codec": "delta"}}}}, "ratio"),
        ({"params": {"fc1.w": {"pull": {"codec": "delta", "ratio": 0}}}}, "ratio"),
        ({"params": {"fc1.w": {"pull": {"codec": "delta", "ratio": 1.5}}}}, "ratio"),
        ({"params": {"fc1.w": {"pull": {"codec": "delta", "ratio": 0.1, "warmup": -1}}}}, "warmup"),
        ({"params": {"fc1.w": {"every": 0}}}, "every"),
        ({"params": {"fc1.w": {"speed": 1}}}, "unknown key"),
        ({"wait_free": "yes"}, "wait_free"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_plans_are_one_line_config_errors(document, words):
    with pytest.raises(ConfigError, match=words):
        check_document(document)


def test_the_bounds_themselves_are_plans_a_run_takes():
    """The edges of each range are inside it: a delta pull of ratio 1 (every entry), push
    every step, warm-up 0."""
    edges = {"pull": {"codec": "delta", "ratio": 1, "warmup": 0}, "every": 1}
    check_document({"params": {"fc1.w": edges}})
    assert load_plan({"params": {"fc1.w": edges}}).param("fc1.w").every == 1


def test_plan_is_checked_against_the_model(tmp_path):
    kinds = {"conv1": "conv", "conv2": "conv", "fc1": "fc", "fc2": "fc"}
    with pytest.raises(ConfigError, match="sf needs an fc"):
        check_model(load_plan({"params": {"conv2.w": {"push": "sf"}}}), LENET_SHAPES, kinds)
    # sf needs an fc layer, not only a 2-D weight: a conv whose weight is held as a matrix.
    sf = load_plan({"params": {"conv1.w": {"push": "sf"}}})
    with pytest.raises(ConfigError, match="sf needs an fc"):
        check_model(sf, {"conv1.w": (6, 25), "conv1.b": (6,)}, {"conv1": "conv"})
    check_model(load_plan({"params": {"fc1.w": {"push": "sf"}}}), LENET_SHAPES, kinds)
    with pytest.raises(ConfigError, match="does not have"):
        check_model(load_plan({"params": {"fc9.w": {}}}), LENET_SHAPES, kinds)
    # one parameter every second step is fine while another goes every step
    check_model(load_plan({"params": {"fc1.w": {"every": 2}}}), LENET_SHAPES, kinds)
    every = {name: {"every": 2} for name in ("conv1.w", "conv1.b")}
    with pytest.raises(ConfigError, match="first layer"):
        check_model(load_plan({"wait_free": True, "params": every}), LENET_SHAPES, kinds)
    with pytest.raises(ConfigError, match="neither dense, auto nor an existing file"):
        load_plan(str(tmp_path / "missing.json"))


@pytest.mark.parametrize(
    ("spec", "words"),
    [("gzip", "unknown codec 'gzip'"), ({"codec": "topk"}, r"option\(s\) \['ratio'\] required"),
     ({"codec": "fp16", "ratio": 0.1}, r"unknown option\(s\) \['ratio'\] \(allowed: none\)"),
     ({"ratio": 0.1}, "a codec spec is a name or a map"), (3, "a codec spec is a name"),
     # the values too, before any process starts (a worker would fail on them)
     ({"codec": "topk", "ratio": 0}, r"ratio must be in \(0, 1\], got 0"),
     ({"codec": "topk", "ratio": 0.1, "seed": "x"}, r"seed must be an integer"),
     ({"codec": "topk", "ratio": 0.1, "seed": 2**64}, r"seed must be an integer"),
     ({"codec": "topk", "ratio": 0.1, "warmup": True}, r"warmup must be an integer"),
     ({"codec": "lowrank", "rank": True}, r"rank must be an integer >= 1"),
     ({"codec": "lowrank", "seed": -1}, r"seed must be an integer"),
     ({"codec": "sf", "dtype": "int8"}, r"dtype must be float32 or float16")],
)  # fmt: skip
def test_bad_specs_are_one_line_config_errors(spec, words):
    with pytest.raises(ConfigError, match=words):
        check_spec(spec)


def test_a_servers_plan_that_is_not_a_map_is_refused_not_read_as_a_path(tmp_path):
    # A path on the worker's machine (or "dense") is the worker's own choice, never a
    # server's: hello's plan is a map or nothing.
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"params": {"fc1.w": {"every": 2}}}))
    for document in (str(path), "dense"):
        with pytest.raises(ConfigError, match="the server's plan is not a map: str"):
            checked_plan(document, lenet5())
    assert checked_plan(None, lenet5()) == Plan()
