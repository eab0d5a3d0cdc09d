"""The settings of the experiment grid (tools/experiment.py): each a set of `minips run`
options that shapes the cluster (tools/experiment.py's make_spec makes each run of it).

Every setting trains the same model on the same data with the same learning rate and the
same global sample budget; what differs is the cluster (docs/model.md 4.2 and 4.5):

    homogeneous    4 workers at full speed, iid shards
    heterogeneous  4 workers slowed 1,1,2,8 for the whole run (`--hetero 1,1,2,8`)
    fluctuating    4 workers whose slowdown is redrawn every 20 steps, between 1x and 4x
                   (`--hetero-schedule fluctuate:20:4`): a machine whose load comes and goes
    heavy-tailed   4 workers, 5 % of whose steps pause for a Pareto(1.5) multiple of the
                   step (`--hetero-schedule pareto:1.5:0.05`, capped at 100x)
    noniid-0.1     4 workers, label skew: each label split over the workers by a
                   Dirichlet(0.1) draw (`--partition dirichlet:0.1`: most workers see few labels)
    noniid-1.0     the same with Dirichlet(1.0): milder skew
    stale          8 workers on 2 cores: high staleness (mean clock staleness about 6)

QUICK holds the same shapes scaled down (mlp on synthetic data, 2 workers), so that a
whole grid takes seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Setting:
    """A cluster shape: workers, fixed slowdowns, how they change, the data split, lr scale."""

    workers: int
    hetero: tuple[float, ...] = ()
    schedule: str = "fixed"
    partition: str = "iid"
    lr_scale: float = 1.0

    def options(self) -> str:
        """The `minips run` options this setting adds, as a user would type them."""
        words = [f"--workers {self.workers}"]
        if self.hetero:
            words.append("--hetero " + ",".join(f"{f:g}" for f in self.hetero))
        if self.schedule != "fixed":
            words.append(f"--hetero-schedule {self.schedule}")
        if self.partition != "iid":
            words.append(f"--partition {self.partition}")
        return " ".join(words)

    def describe(self, lr: float) -> str:
        """One line for headings: the options and the learning rate actually used."""
        return f"{self.options()}, lr {lr * self.lr_scale:g}"


# `stale` doubles the workers at the base lr. On the bundled sample (lenet5, lr 0.01,
# momentum 0.9) 8 asgd workers already collapse to chance while dasgd trains; at 2x or 4x
# the lr every asynchronous rule collapsed, which shows nothing (--stale-lr-scale to try).
FULL = {
    "homogeneous": Setting(4),
    "heterogeneous": Setting(4, (1, 1, 2, 8)),
    "fluctuating": Setting(4, schedule="fluctuate:20:4"),
    "heavy-tailed": Setting(4, schedule="pareto:1.5:0.05"),
    "noniid-0.1": Setting(4, partition="dirichlet:0.1"),
    "noniid-1.0": Setting(4, partition="dirichlet:1.0"),
    "stale": Setting(8),
}
QUICK = {
    "homogeneous": Setting(2),
    "heterogeneous": Setting(2, (1, 3)),
    "fluctuating": Setting(2, schedule="fluctuate:5:4"),
    "heavy-tailed": Setting(2, schedule="pareto:1.5:0.1"),
    "noniid-0.1": Setting(2, partition="dirichlet:0.1"),
    "noniid-1.0": Setting(2, partition="dirichlet:1.0"),
    "stale": Setting(4, lr_scale=4.0),
}


def settings_table(quick: bool, stale_workers: int | None, stale_lr_scale: float | None) -> dict:
    """The named settings, with `stale` changed by --stale-workers / --stale-lr-scale."""
    table = dict(QUICK if quick else FULL)
    stale = table["stale"]
    table["stale"] = replace(stale, workers=stale_workers or stale.workers,
                             lr_scale=stale_lr_scale or stale.lr_scale)  # fmt: skip
    return table
