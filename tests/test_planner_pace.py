"""The planner sizes a mixed class's plan for the step that sets its pace (link_share):
browser slots' steps are slower (minips.run.build.step_factors), ssgd waits for the slowest.
"""

import pytest

from minips.nn import build_model
from minips.run.build import BROWSER_STEP_FACTOR, resolve_plan, step_factors
from minips.run.config import RunConfig
from minips.run.planner import link_share, make_plan


def test_equal_workers_share_a_link_equally():
    assert link_share(100.0, 4, True, None, barrier=False) == (25.0, 1.0)
    assert link_share(100.0, 4, False, None, barrier=False) == (100.0, 1.0)


def test_a_slower_worker_uses_less_of_a_shared_link_when_nobody_waits_for_it():
    # two NumPy workers and two browsers 4x slower: 2 + 2/4 shares, paced by NumPy's step
    assert link_share(100.0, 4, True, [1, 1, 4, 4], barrier=False) == (40.0, 1.0)


def test_under_a_barrier_every_worker_steps_at_the_slowest_pace():
    assert link_share(100.0, 4, True, [1, 1, 4, 4], barrier=True) == (25.0, 4.0)
    assert link_share(100.0, 4, False, [1, 4], barrier=True) == (100.0, 4.0)


def test_a_class_paced_by_its_browsers_needs_less_compression():
    model = build_model("mlp")
    rate = 40e6 / 8  # a 40 Mbit/s shared link, four workers
    numpy_only = make_plan(model, 64, 4, rate, True, repeats=2, barrier=True)
    paced = make_plan(model, 64, 4, rate, True, repeats=2, step_factors=[1, 1, 50, 50],
                      barrier=True)  # fmt: skip
    assert paced.predicted["pace_factor"] == 50
    # the budget grows with the pace: the plan sends at least as many bytes, here more
    assert paced.predicted["up_bytes_per_step"] > numpy_only.predicted["up_bytes_per_step"]


def test_browser_slots_count_as_slower_steps():
    config = RunConfig(model="mlp", workers=3, browser=2)
    assert step_factors(config) == [BROWSER_STEP_FACTOR["mlp"]] * 2 + [1.0]
    assert step_factors(RunConfig(model="lenet5", workers=2)) == [1.0, 1.0]


@pytest.mark.parametrize("rule", ["asgd", "ssgd"])
def test_auto_with_browsers_resolves_to_a_plan_the_model_accepts(rule):
    config = RunConfig(model="mlp", workers=2, browser=1, plan="auto", bandwidth="20mbit",
                       rule=rule)  # fmt: skip
    plan = resolve_plan(config)
    assert plan.params and plan.predicted["pace_factor"] == (
        BROWSER_STEP_FACTOR["mlp"] if rule == "ssgd" else 1.0
    )
