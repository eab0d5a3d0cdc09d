"""A rule's own state in a checkpoint, and the workers it was resumed for.

Some rules keep state of their own beside the parameters: DANA a momentum vector per
worker, DC-ASGD and Gap-Aware a copy of what each worker last pulled, Gap-Aware and VSGD
their running step sizes, FedBuff the gradients it holds until its buffer is full.
`rule_state(rule)` gives it as arrays by key (the rule writes it into a `StateWriter`) and
`load_rule_state(rule, state)` takes it back (through a `StateReader`, checked against the
model), so a server restarted from a checkpoint goes on with it (the checkpoint's "rule/"
section, minips/ops/checkpoint_file.py). The rules see the writer and the reader as the
small interfaces of minips/rules/base.py and import nothing of this. The keys:

    workers               1-d str: the worker ids; a worker's number i is its place here
    WHAT/i/PARAM          an array of worker i for parameter PARAM (DANA's velocity)
    WHAT/i                a number of worker i (the version of its last pull)
    WHAT/PARAM            an array or number shared by all workers (a running step size)
    WHAT                  a count of the rule's own (how many pushes FedBuff holds)

A resumed server knows no worker yet: each says hello again with its id and finds its
state. `RestoredWorkers` forgets the state of those that do not come back within a
heartbeat timeout, as a worker declared dead is forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from minips.errors import DataError

if TYPE_CHECKING:
    from minips.rules import Rule
    from minips.state.registry import WorkerRegistry


class StateWriter:
    """Builds a rule's state arrays (module docstring)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self._ids: dict[str, int] = {}

    def _index(self, worker_id: str) -> int:
        return self._ids.setdefault(worker_id, len(self._ids))

    def worker_arrays(self, what: str, worker_id: str, arrays: Mapping[str, np.ndarray]) -> None:
        i = self._index(worker_id)
        for name, array in arrays.items():
            self.arrays[f"{what}/{i}/{name}"] = np.asarray(array)

    def worker_number(self, what: str, worker_id: str, value: float) -> None:
        self.arrays[f"{what}/{self._index(worker_id)}"] = np.asarray(value)

    def shared(self, what: str, values: Mapping[str, np.ndarray | float]) -> None:
        for name, value in values.items():
            self.arrays[f"{what}/{name}"] = np.asarray(value)

    def count(self, what: str, value: int) -> None:
        self.arrays[what] = np.asarray(value, np.int64)

    def done(self) -> dict[str, np.ndarray]:
        """The arrays, with `workers` (nothing at all when the state is empty)."""
        if not self.arrays:
            return {}
        return {"workers": np.array(list(self._ids), dtype=str), **self.arrays}


class StateReader:
    """Reads what a StateWriter built, checked against the parameters (DataError, one line,
    naming the key, for anything that does not fit)."""

    def __init__(self, state: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]) -> None:
        self.state, self.params = state, params
        ids = state.get("workers", np.array([], dtype=str))
        if ids.ndim != 1 or (ids.size and ids.dtype.kind != "U"):
            raise DataError("checkpoint rule/workers is not a list of worker ids")
        self.workers = [str(worker_id) for worker_id in ids]

    def worker_arrays(self, what: str) -> dict[str, dict[str, np.ndarray]]:
        """worker id -> parameter -> float32 array of the parameter's shape (own copies)."""
        found: dict[str, dict[str, np.ndarray]] = {}
        for key, array in self._under(what, parts=2):
            index, name = key.split("/")
            self._fits(f"{what}/{key}", name, array)
            found.setdefault(self._worker(what, index), {})[name] = np.array(array, np.float32)
        return found

    def worker_numbers(self, what: str) -> dict[str, int]:
        """worker id -> a count (a version)."""
        found = {}
        for index, value in self._under(what, parts=1):
            if value.shape != () or value.dtype.kind not in "iu" or int(value) < 0:
                raise DataError(f"checkpoint rule/{what}/{index} is not a count")
            found[self._worker(what, index)] = int(value)
        return found

    def shared_arrays(self, what: str) -> dict[str, np.ndarray]:
        """parameter -> float32 array of its shape (own copies)."""
        found = {}
        for name, array in self._under(what, parts=1):
            self._fits(f"{what}/{name}", name, array)
            found[name] = np.array(array, np.float32)
        return found

    def shared_numbers(self, what: str) -> dict[str, float]:
        """parameter -> a number."""
        found = {}
        for name, value in self._under(what, parts=1):
            if name not in self.params or value.shape != () or value.dtype.kind not in "iuf":
                raise DataError(f"checkpoint rule/{what}/{name} is not a number of a parameter")
            found[name] = value.item()
        return found

    def count(self, what: str) -> int:
        """A count of the rule's own (0 when the state has none)."""
        value = self.state.get(what)
        if value is None:
            return 0
        if value.shape != () or value.dtype.kind not in "iu" or int(value) < 0:
            raise DataError(f"checkpoint rule/{what} is not a count")
        return int(value)

    def _under(self, what: str, parts: int) -> list[tuple[str, np.ndarray]]:
        prefix = f"{what}/"
        found = [(k[len(prefix) :], v) for k, v in self.state.items() if k.startswith(prefix)]
        for key, _ in found:
            if key.count("/") != parts - 1:
                raise DataError(f"checkpoint rule/{what}/{key} is not a key of its kind")
        return found

    def _worker(self, what: str, index: str) -> str:
        if not index.isdigit() or int(index) >= len(self.workers):
            raise DataError(f"checkpoint rule/{what}/{index} names no worker of rule/workers")
        return self.workers[int(index)]

    def _fits(self, key: str, name: str, array: np.ndarray) -> None:
        param = self.params.get(name)
        if param is None or array.shape != param.shape or array.dtype.kind != "f":
            raise DataError(f"checkpoint rule/{key} does not fit parameter {name!r}")


class RestoredWorkers:
    """The workers a rule's state was resumed for, until each says hello again.

    `absent(now, registry)` -> the ids not registered within `grace` seconds of the first
    look (a resumed server's first loop turn), once each: the rule forgets their state.
    """

    def __init__(self, worker_ids: list[str], grace: float) -> None:
        self.waiting = set(worker_ids)
        self.grace = grace
        self._deadline: float | None = None

    def absent(self, now: float, registry: WorkerRegistry) -> list[str]:
        if not self.waiting:
            return []
        self.waiting -= {worker_id for worker_id in self.waiting if worker_id in registry.by_id}
        if self._deadline is None:
            self._deadline = now + self.grace
        if now < self._deadline:
            return []
        gone, self.waiting = sorted(self.waiting), set()
        return gone


def rule_state(rule: Rule) -> dict[str, np.ndarray]:
    """The rule's own state as a checkpoint's `rule/` arrays ({} when it has none).

    The arrays are the live state, not copies (a checkpoint writes them at once): the
    rules update some in place, so the next push changes them."""
    writer = StateWriter()
    rule.write_state(writer)
    return writer.done()


def load_rule_state(rule: Rule, state: Mapping[str, np.ndarray]) -> None:
    """Resume `rule` from `rule_state` of a checkpoint; the workers it names that do not
    say hello again within a heartbeat timeout are forgotten (`Rule.forget_absent`)."""
    reader = StateReader(state, rule.store.params)
    rule.read_state(reader)
    rule.restored = RestoredWorkers(reader.workers, rule.registry.grace)


class KeptRuleState:
    """A rule's own state as the checkpoints see it: its name, `state()`, `load_state()`."""

    def __init__(self, rule: Rule) -> None:
        self.rule, self.name = rule, rule.name

    def state(self) -> dict[str, np.ndarray]:
        return rule_state(self.rule)

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        load_rule_state(self.rule, state)
