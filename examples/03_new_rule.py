"""A new update rule in a few lines, run by `minips run` without touching minips.

A rule decides when a pushed gradient becomes an update and how it is scaled; the server
loop does the rest (minips/rules/base.py). `Damped` below shrinks a stale gradient
geometrically with its staleness tau = t - base:

    w <- w - lr * gamma^tau * g(w_base)

`minips run --rule FILE.py:CLASS` (or `--rule MODULE:CLASS`) names a rule class outside
minips: the run hands that spec to the server process, which imports the class there
(minips/run/rule_plugins.py). Its options come as `--rule-option KEY=VALUE`. By hand:

    minips run --model mlp --dataset synthetic --rule examples/03_new_rule.py:Damped \\
        --rule-option gamma=0.7

This script runs exactly that (a smaller run with --fast, for the tests), then reads the
run's update log to show that every update was scaled by gamma^tau.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from minips.rules import Outcome, Push, Rule


class Damped(Rule):
    """w <- w - lr * gamma^tau * g: a stale gradient counts less (gamma = 1: plain ASGD)."""

    name = "damped"  # what the server logs as the rule of each update

    def __init__(self, gamma: float = 0.5) -> None:
        self.gamma = float(gamma)

    def describe(self) -> dict:
        return {"name": self.name, "gamma": self.gamma}  # workers get this in hello

    def on_push(self, push: Push) -> Outcome:
        return Outcome.update_now(push, scale=self.gamma**push.staleness)  # apply now, scaled


def run(out: Path, gamma: float, max_samples: int) -> dict:
    """`minips run` with this file's Damped as the rule; returns the run's summary.json."""
    argv = [sys.executable, "-m", "minips", "run", "--model", "mlp", "--dataset", "synthetic",
            "--workers", "3", "--hetero", "1,1,4",  # the 4x slower worker's pushes are stale
            "--max-samples", str(max_samples), "--eval-interval", "0.5",
            "--rule", f"{Path(__file__).resolve()}:Damped", "--rule-option", f"gamma={gamma}",
            "--out", str(out), "--quiet"]  # fmt: skip
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--fast", action="store_true", help="a 10,000-sample run, for the tests")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        summary = run(Path(tmp) / "run", args.gamma, 10000 if args.fast else 30000)
        events = [json.loads(line) for line in (Path(tmp) / "run/updates.jsonl").open()]
    updates = [event for event in events if event["event"] == "update"]
    print(f"{summary['updates']} updates, test accuracy {summary['accuracy']:.3f}")
    # One update per push here: its staleness and the scale the server applied.
    seen = {(u["rule"], u["staleness"][0], u["scale"]) for u in updates}
    for rule, tau, scale in sorted(seen, key=lambda row: row[1]):
        print(f"rule {rule}  tau {tau}  scale {scale:.4f}  (gamma^tau = {args.gamma**tau:.4f})")
