"""The planner sizes a mixed class's plan for the step that sets its pace (Cluster.pace,
Cluster.link_users): browser slots' steps are slower (minips.run.build.step_factors), and
ssgd waits for the slowest.
"""

import pytest
from test_planner import plan_for

from minips.run.build import BROWSER_STEP_FACTOR, resolve_plan, step_factors
from minips.run.config import RunConfig
from minips.transmission.planning.plan_costs import Cluster, Network


def test_equal_workers_share_a_link_equally():
    cluster = Cluster(workers=4)
    assert cluster.pace() == 1.0 and cluster.link_users() == 4
    assert Network(shared=100.0).share(cluster) == 25.0
    assert Network(bandwidth=100.0).share(cluster) == 100.0


def test_a_slower_worker_uses_less_of_a_shared_link_when_nobody_waits_for_it():
    # two NumPy workers and two browsers 4x slower: 2 + 2/4 shares, paced by NumPy's step
    cluster = Cluster(workers=4, step_factors=(1, 1, 4, 4))
    assert cluster.pace() == 1.0 and Network(shared=100.0).share(cluster) == 40.0


def test_under_a_barrier_every_worker_steps_at_the_slowest_pace():
    cluster = Cluster(workers=4, step_factors=(1, 1, 4, 4), barrier=True)
    assert cluster.pace() == 4.0 and Network(shared=100.0).share(cluster) == 25.0
    two = Cluster(workers=2, step_factors=(1, 4), barrier=True)
    assert two.pace() == 4.0 and Network(bandwidth=100.0).share(two) == 100.0


def test_a_class_paced_by_its_browsers_needs_less_compression():
    numpy_only = plan_for(Cluster(workers=4, cores=2, barrier=True), netem="100mbit")
    paced = plan_for(Cluster(workers=4, cores=2, step_factors=(1, 1, 50, 50), barrier=True),
                     netem="100mbit")  # fmt: skip
    assert paced.plan.predicted["pace_factor"] == 50
    assert paced.plan.predicted["compute_ms"] == pytest.approx(
        50 * numpy_only.plan.predicted["compute_ms"]
    )
    # a step 50 times longer hides the traffic: the plan sends more bytes, here all dense
    sent = [p.plan.predicted["up_bytes_per_step"] for p in (numpy_only, paced)]
    assert sent[0] < sent[1]


def test_browser_slots_count_as_slower_steps():
    assert step_factors("mlp", 3, 2) == (BROWSER_STEP_FACTOR["mlp"],) * 2 + (1.0,)
    assert step_factors("lenet5", 2, 0) == (1.0, 1.0)


@pytest.mark.parametrize("rule", ["asgd", "ssgd"])
def test_auto_with_browsers_resolves_to_a_plan_the_model_accepts(rule):
    config = RunConfig(model="lenet5", workers=2, browser=1, plan="auto", bandwidth="20mbit",
                       rule=rule, momentum=0.9)  # fmt: skip
    plan = resolve_plan(config)
    assert plan.params and plan.predicted["pace_factor"] == (
        BROWSER_STEP_FACTOR["lenet5"] if rule == "ssgd" else 1.0
    )
