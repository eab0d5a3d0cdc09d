"""Layer-aware plans: each tensor gets its own codec, chosen for the link by a cost model.

The planner (docs/algorithms.md, "The cost model") measures each layer's forward and
backward and each encoding's CPU here (minips/run/plan_measure.py), counts the exact bytes
of each encoding, and chooses (minips/transmission/planning/planner.py), tensor by tensor,
the encodings (fp16, sufficient factors, top-k with momentum correction, delta pulls) with
the least predicted time to accuracy: the step time on the link times the extra samples
each encoding was measured to cost. This script prints its table for LeNet-5 on a slow
link, then trains twice on that link (a token bucket per worker, `--bandwidth`): all dense,
and `--plan auto`; it prints the bytes per step each way that the server counted. The same
by hand:

    minips plan --model lenet5 --workers 2 --bandwidth 20mbit
    minips run --plan auto --bandwidth 20mbit --out runs/auto
    minips run --bandwidth 20mbit --out runs/dense && minips report runs/dense runs/auto

    python examples/06_layer_plans.py          (--fast: fewer samples, for the tests)
"""

import argparse
import json
import tempfile
from pathlib import Path

from minips.cli.plan_table import format_table
from minips.nn import build_model
from minips.run.config import RunConfig
from minips.run.launch import run_local
from minips.run.plan_measure import choose_plan, parse_network
from minips.transmission.planning.plan_costs import Cluster

LINK = "20mbit"  # each worker's own link (--bandwidth): 2.5 MB/s
WORKERS = 2


def train(plan: str, max_samples: int, out: Path) -> dict:
    """LeNet-5 on the bundled sample over the slow link; returns the run's summary.json."""
    config = RunConfig(model="lenet5", dataset="sample", workers=WORKERS, plan=plan,
                       bandwidth=LINK, max_samples=max_samples)  # fmt: skip
    # The evaluator's pulls count in the server's bytes too: one at the end, not every 2 s.
    return run_local(config, out, eval_interval=600.0)


def per_step(summary: dict) -> tuple[float, float]:
    """Array bytes up and down per worker step, as the server counted them. Down includes
    a few whole-model pulls the plan does not cover: each worker's first (nothing to take
    a delta from yet) and the evaluator's, and the delta's warm-up (its first 20 replies
    to each worker carry fc1 whole, as fp16); a short run shows them, a long one hides
    them."""
    steps = summary["worker_steps"]
    return summary["bytes_up"] / steps, summary["bytes_down"] / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="384 samples a run (tests)")
    args = parser.parse_args()
    # 1. The plan, as `minips plan --bandwidth` prints it: per parameter, its options'
    #    bytes (dense, fp16, topk) and the chosen push and pull encodings.
    network, cluster = parse_network(bandwidth=LINK), Cluster(workers=WORKERS)
    report = choose_plan(build_model("lenet5"), 64, cluster, network, momentum=0.9)
    print(format_table(report))
    # 2. The same choice made by `--plan auto` inside a run, against all dense.
    max_samples = 384 if args.fast else 12800
    with tempfile.TemporaryDirectory() as tmp:
        for plan in ("dense", "auto"):
            summary = train(plan, max_samples, Path(tmp) / plan)
            up, down = per_step(summary)
            print(f"{plan:>5}: {summary['worker_steps']} steps in {summary['wall_s']:.1f} s, "
                  f"per step up {up:,.0f} B, down {down:,.0f} B, "
                  f"test accuracy {summary['accuracy']:.3f}")  # fmt: skip
            chosen = Path(tmp) / plan / "plan.json"  # the run directory keeps auto's choice
            if chosen.exists():
                predicted = json.loads(chosen.read_text())["predicted"]
                print(f"       planner predicted up {predicted['up_bytes_per_step']:,} B, "
                      f"down {predicted['down_bytes_per_step']:,} B per step")  # fmt: skip


if __name__ == "__main__":
    main()
