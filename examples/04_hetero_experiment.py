"""The heterogeneous experiment in miniature: asgd vs dasgd with one very slow worker.

Four workers, slowed down 1x, 1x, 2x and 8x (`--hetero 1,1,2,8`: each step of worker r
takes factor_r times its compute). Under asgd the slow worker's gradients arrive many
updates late (clock staleness tau = t - base) and are applied at full strength; dasgd scales
each one by f(tau) = 1 / max(1, tau) (docs/algorithms.md, "dasgd"). The script runs both
with `minips.run.launch.run_local` (what `minips run` does), prints each worker's staleness and
applied scale, and draws both accuracy curves into one PNG. The same by hand:

    minips run --rule asgd  --workers 4 --hetero 1,1,2,8 --out runs/asgd
    minips run --rule dasgd --workers 4 --hetero 1,1,2,8 --out runs/dasgd
    minips report runs/asgd runs/dasgd && minips plot runs/asgd runs/dasgd

    python examples/04_hetero_experiment.py            lenet5 on the bundled sample, 1 epoch
    python examples/04_hetero_experiment.py --fast     an MLP on synthetic data (the tests)
"""

import argparse
import tempfile
from pathlib import Path

from minips.errors import MissingExtraError
from minips.results.loading import load_run
from minips.results.plot import plot_accuracy
from minips.results.report import summarize
from minips.run.config import RunConfig
from minips.run.launch import run_local

SLOWDOWNS = [1.0, 1.0, 2.0, 8.0]


def experiment(rule: str, fast: bool, out: Path) -> dict:
    """One run of `rule` with the slowdowns above; returns `minips report`'s summary of it."""
    if fast:
        data = {"model": "mlp", "dataset": "synthetic", "max_samples": 8000}
    else:
        data = {"model": "lenet5", "dataset": "sample", "epochs": 1}
    config = RunConfig(rule=rule, workers=len(SLOWDOWNS), hetero=SLOWDOWNS, **data)
    run_local(config, out, eval_interval=0.5 if fast else 2.0)
    return summarize(load_run(out))


def worker_line(worker: dict) -> str:
    """Steps, clock staleness of its applied pushes, and the mean scale the rule gave them."""
    tau = worker["staleness"]
    if not tau.get("count"):
        return f"{worker['steps']} steps, no push applied"
    return (f"{worker['steps']} steps, staleness mean {tau['mean']:.2f} max {tau['max']}, "
            f"mean scale {worker['scale_mean']:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="MLP, synthetic data (tests)")
    parser.add_argument("--png", default="hetero.png", help="where to write the plot")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for rule in ("asgd", "dasgd"):
            report = experiment(rule, args.fast, Path(tmp) / rule)
            runs.append(load_run(Path(tmp) / rule))
            print(f"{rule}: test accuracy {report['summary']['accuracy']:.3f}, "
                  f"{report['summary']['updates']} updates")  # fmt: skip
            for rank, worker in report["workers"].items():
                print(f"  worker {rank} ({worker['slowdown']:g}x slower): {worker_line(worker)}")
        try:
            # Accuracy against wall time and against samples: the slow worker costs asgd
            # accuracy per sample; dasgd damps its stale gradients instead.
            print(f"plot: {plot_accuracy(runs, args.png, title='asgd vs dasgd, 1,1,2,8')}")
        except MissingExtraError as exc:
            print(f"no plot ({exc})")


if __name__ == "__main__":
    main()
