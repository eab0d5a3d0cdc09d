"""What a plan costs in samples: how many more than dense it needs to reach the same
accuracy, from a table measured per model (SAMPLE_COST).

The planner (minips/transmission/planning/planner.py) multiplies its predicted step by
`samples_factor`;
among plans of about the same time it prefers the least `sample_cost`, and it takes a
plan that costs samples only when it is clearly faster than one that costs none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from minips.transmission.codecs import Spec
from minips.transmission.planning.plan_costs import spec_text

# Extra samples a tensor's encodings cost to reach the same accuracy, as a fraction of
# dense's samples (0.10: 10 % more samples), per model, tensor and (push, pull) PAIR
# (`spec_text`): the larger of the pair's costs to 80 % and to 85 % test accuracy, so a
# plan is no slower to either. A pair, not each encoding alone: what a pull encoding
# costs depends on what the push sends (sf fp16 with an fp16 pull cost nothing; the same
# sf with a 5 % delta pull was never measured, and in real runs it took 1.35x dense's
# samples to 85 %). Measured with tools/sample_cost.py (ssgd, 4 workers, batch 64, lr
# 0.01, momentum 0.9, the rest of the plan fp16 both ways); the runs, the method and
# every figure are in docs/algorithms.md, "What a rung costs in samples". A model
# without a table of its own is charged LeNet-5's fc1 figure for the same pair; a pair
# measured nowhere costs infinity: the planner never picks it blind.
SAMPLE_COST: dict[str, dict[tuple[str, str, str], float]] = {
    "lenet5": {
        ("fc1.w", "sf fp16", "fp16"): 0.0,  # seed 0: 0.94x / 0.93x dense's samples
        ("fc1.w", "topk 2% mc", "fp16"): 0.06,  # seed 0: 1.06x / 1.02x
        ("fc1.w", "topk 1% mc", "fp16"): 0.07,  # seeds 0-2: 1.07x / 1.00x
        ("fc1.w", "topk 1% mc", "delta 5% fp16 warm-up 20"): 0.10,  # seeds 0-1: 1.10x / 1.04x
    },
}
# Measured: fp16 both ways on every weight costs no samples (0.97x / 0.98x), so in a
# pair dense and fp16 are the same encoding, and a pair of the two costs nothing.
FREE = ("dense", "fp16")


def sample_cost(model: str, name: str, push: Spec, pull: Spec) -> float:
    """The extra samples (a fraction of dense's) one tensor's (push, pull) encodings cost
    (SAMPLE_COST); infinity for a pair measured nowhere."""
    up, down = (_as_measured(spec_text(s)) for s in (push, pull))
    if up == down == "fp16":
        return 0.0
    table = SAMPLE_COST.get(model, {})
    if (name, up, down) in table:
        return table[name, up, down]
    return SAMPLE_COST["lenet5"].get(("fc1.w", up, down), math.inf)


def is_lossless(model: str, name: str, push: Spec, pull: Spec) -> bool:
    """Whether a tensor's pair is measured to cost no samples (dense, fp16, sf fp16)."""
    return sample_cost(model, name, push, pull) == 0.0


def _as_measured(text: str) -> str:
    return "fp16" if text in FREE else text


def samples_factor(model: str, chosen: Mapping[str, tuple[Spec, Spec]]) -> float:
    """1 + the sum of the tensors' pair costs: samples to an accuracy / dense's.

    chosen: parameter -> (push spec, pull spec). The tensors' costs are taken as adding
    up (each was measured with the rest of the plan fixed at fp16; on LeNet-5 only fc1
    goes below fp16, so no sum of two measured costs is ever taken there)."""
    return 1.0 + sum(sample_cost(model, name, push, pull) for name, (push, pull) in chosen.items())
