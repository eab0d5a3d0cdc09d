"""What a plan costs in samples: how many more than dense it needs to reach the same
accuracy, from a table measured per model (SAMPLE_COST).

The planner (minips/run/planner.py) multiplies its predicted step by `samples_factor`;
its tie-break between rungs of about the same time prefers the least `sample_cost`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from minips.codecs import Spec
from minips.run.plan_costs import spec_text

# Extra samples a rung costs to reach the same accuracy, as a fraction of dense's samples
# (0.10: 10 % more samples), per model, tensor, direction and encoding (`spec_text`): the
# larger of its costs to 80 % and to 85 % test accuracy, so a plan is no slower to either.
# Measured with tools/sample_cost.py (ssgd, 4 workers, batch 64, lr 0.01, momentum 0.9,
# seeds 0-2); the runs, the method and every figure are in docs/algorithms.md, "What a
# rung costs in samples". A model without a table of its own is charged LeNet-5's fc1
# figure for the same encoding; an encoding measured nowhere costs infinity (never picked).
SAMPLE_COST: dict[str, dict[tuple[str, str, str], float]] = {
    "lenet5": {
        ("fc1.w", "push", "sf fp16"): 0.0,
        ("fc1.w", "push", "topk 2% mc"): 0.06,
        ("fc1.w", "push", "topk 1% mc"): 0.07,
        ("fc1.w", "pull", "delta 10% fp16 warm-up 20"): 0.01,
        ("fc1.w", "pull", "delta 5% fp16 warm-up 20"): 0.02,
    },
}
FREE = ("dense", "fp16")  # measured: fp16 both ways on every weight costs no samples


def sample_cost(model: str, name: str, direction: str, spec: Spec) -> float:
    """The extra samples (a fraction of dense's) one tensor's encoding costs (SAMPLE_COST);
    infinity for an encoding measured nowhere, so the planner never picks it blind."""
    text = spec_text(spec)
    if text in FREE:
        return 0.0
    table = SAMPLE_COST.get(model, {})
    if (name, direction, text) in table:
        return table[name, direction, text]
    fc1 = SAMPLE_COST["lenet5"]
    return fc1.get(("fc1.w", direction, text), math.inf)


def samples_factor(model: str, chosen: Mapping[str, tuple[Spec, Spec]]) -> float:
    """1 + the sum of the chosen encodings' sample costs: samples to an accuracy / dense's.

    chosen: parameter -> (push spec, pull spec). The costs are taken as adding up (each
    was measured with the rest of the plan fixed; docs/algorithms.md says how well the
    sum predicted whole plans)."""
    return 1.0 + sum(
        sample_cost(model, name, "push", push) + sample_cost(model, name, "pull", pull)
        for name, (push, pull) in chosen.items()
    )
