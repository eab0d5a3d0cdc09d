"""What the planner is given: a link's rates as `--bandwidth` and `--netem` mean them, and
this machine's CPU cost of every layer and of every rung of every parameter's ladders."""

import pytest

from minips.errors import ConfigError
from minips.nn import build_model
from minips.run.plan_measure import choose_plan, describe_network, measure, parse_network
from minips.transmission.planning.plan_costs import Cluster, Network, spec_text
from minips.transmission.planning.planner import pull_ladder, push_ladder


def test_a_rate_is_each_workers_own_link_and_netem_one_shared_by_all():
    four = Cluster(workers=4)
    own, shared = parse_network(bandwidth="100mbit"), parse_network(netem="100mbit")
    assert own.share(four) == 12.5e6 and shared.share(four) == 12.5e6 / 4
    assert parse_network(bandwidth="20mbit", netem="100mbit").share(four) == 2.5e6  # tighter
    assert Network().share(four) is None and parse_network() == Network()
    assert "each worker's own 100 Mbit/s" in describe_network(own, four)
    words = describe_network(shared, four)
    assert "shared by 4 workers" in words and "25 Mbit/s each" in words
    assert describe_network(Network(), four) == "unlimited"
    with pytest.raises(ConfigError, match="bad rate"):
        parse_network(bandwidth="fast")


def test_every_rung_of_every_ladder_is_measured_and_the_plan_records_its_prediction():
    model = build_model("lenet5")
    measured = measure(model, batch_size=8, repeats=1, momentum=0.9)
    assert [t.layer for t in measured.layers] == ["conv1", "conv2", "fc1", "fc2"]
    assert all(t.forward_ms >= 0 and t.backward_ms >= 0 for t in measured.layers)
    kinds = {t.layer: t.kind for t in measured.layers}
    expected = set()
    for name, array in model.params.items():
        shape, kind = tuple(array.shape), kinds[name.rsplit(".", 1)[0]]
        expected |= {(name, "push", spec_text(s)) for s in push_ladder(shape, kind, 8, 0.9)}
        expected |= {(name, "pull", spec_text(s)) for s in pull_ladder(shape, kind)}
    assert set(measured.codecs) == expected
    report = choose_plan(model, 8, Cluster(workers=2), Network(), measured, momentum=0.9)
    assert report.plan.predicted["link"] == "unlimited"
    assert report.plan.predicted["chosen"] == "dense" and report.plan.is_dense()
