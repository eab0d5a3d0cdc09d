"""The rule interface: what a rule decides, the base class, and the simplest rule, ASGD,
that most others build on.

A rule never acts on the server: it reads the parameter store and the worker registry it
was attached to (and the pushes booked there: minips.state.registry.Push, re-exported by
minips.rules), and returns an `Outcome` (updates to apply, pushes to answer or drop) that
the server loop carries out. The dependency runs one way: the server uses the rules, the
rules read the server's state, and neither the registry nor the store imports a rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from minips.errors import ConfigError
from minips.state.registry import Push, WorkerRegistry, WorkerState
from minips.state.store import ParameterStore


@dataclass(eq=False)
class Update:
    """One update to apply (t += 1): w_p <- optimizer step of (grad_p, lr * scale_p).

    steps: [(parameter name, float32 gradient, scale)] in model order. pushes: the pushes
    whose gradients went into it. value_staleness: VSGD's d_l per layer, for telemetry.
    """

    pushes: list[Push]
    steps: list[tuple[str, np.ndarray, float]]
    value_staleness: dict[str, float] | None = None


@dataclass
class Outcome:
    """What a rule decided: updates to apply, then pushes to answer; pushes to drop.

    The server applies `updates` in order, then records each dropped push (not applied,
    t unchanged) and answers it `applied: false`, then sends each `(push, applied)` answer.
    """

    updates: list[Update] = field(default_factory=list)
    answers: list[tuple[Push, bool]] = field(default_factory=list)
    drops: list[Push] = field(default_factory=list)

    @classmethod
    def update_now(
        cls,
        push: Push,
        grads: dict[str, np.ndarray] | None = None,
        scale: float | dict[str, float] = 1.0,
    ) -> Outcome:
        """The decision to make one push one update at once (its own or corrected `grads`;
        `scale` one factor or one per parameter), and to answer it `applied: true`."""
        grads = push.grads if grads is None else grads
        steps = [
            (name, grad, scale[name] if isinstance(scale, dict) else scale)
            for name, grad in grads.items()
        ]
        return cls(updates=[Update([push], steps)], answers=[(push, True)])


class StateWriter(Protocol):
    """Where a rule puts its own state for a checkpoint (minips/ops/rule_state.py keeps the
    keys: per worker, per parameter, shared, a count)."""

    def worker_arrays(
        self, what: str, worker_id: str, arrays: Mapping[str, np.ndarray]
    ) -> None: ...
    def worker_number(self, what: str, worker_id: str, value: float) -> None: ...
    def shared(self, what: str, values: Mapping[str, np.ndarray | float]) -> None: ...
    def count(self, what: str, value: int) -> None: ...


class StateReader(Protocol):
    """What a rule takes back of its own state from a checkpoint, checked against the
    model (minips/ops/rule_state.py)."""

    workers: list[str]

    def worker_arrays(self, what: str) -> dict[str, dict[str, np.ndarray]]: ...
    def worker_numbers(self, what: str) -> dict[str, int]: ...
    def shared_arrays(self, what: str) -> dict[str, np.ndarray]: ...
    def shared_numbers(self, what: str) -> dict[str, float]: ...
    def count(self, what: str) -> int: ...


class Restored(Protocol):
    """The workers a rule's state was resumed for, until each says hello again."""

    def absent(self, now: float, registry: WorkerRegistry) -> list[str]: ...


# float32's largest finite value is 3.4e38; the overflow check (minips.ops.overflow) lets
# an update write nothing past FLOAT32_SAFE, which leaves room for rounding.
FLOAT32_SAFE = 1e38
# The largest move of one coordinate whose square stays below FLOAT32_SAFE (Gap-Aware).
SQUARE_SAFE_MOVE = math.sqrt(FLOAT32_SAFE)


class FiniteCheck(Protocol):
    """Whether what a rule keeps of a push stays finite in float32: the server's operations
    set one as `Rule.finite` (minips.ops.overflow answers), so a rule that keeps its own
    state refuses a push that would overflow it. Each method changes nothing."""

    def step_finite(self, name: str, grad: np.ndarray) -> bool:
        """The optimizer's step of `grad` on parameter `name` writes a finite w' and v' and
        moves no coordinate as far as the rule's max_move."""
        ...

    def velocity_finite(
        self, name: str, new: np.ndarray, old: np.ndarray | None, total: np.ndarray | None
    ) -> bool:
        """A worker's new velocity `new` is finite, so is the running sum total + (new -
        old) (old None: total + new; total None: no sum yet), and so is the optimizer's
        step of `new` (as `step_finite`)."""
        ...


@dataclass(frozen=True)
class RuleOption:
    """One option of a rule, declared once beside the rule.

    The CLI flag, its type, range, help and shown default, and the rule's own default are
    all derived from this declaration (minips.run.config builds the click options from it).
    `key` is the keyword of the rule's constructor; `flag` the command-line flag.
    """

    key: str
    flag: str
    kind: type  # int, float or str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    min_open: bool = False  # minimum itself excluded
    maximum: float | None = None
    max_open: bool = False


class WorkerSide:
    """What a rule needs a worker to do besides computing gradients (default: nothing).

    `extras(params, grads)` returns the extra arrays to send with a push, by key (sent as
    "extra/<key>"); `params` are the values the gradients were computed at.
    """

    def extras(
        self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        return {}


class Rule:
    """Base class. A rule decides when pushed gradients become updates, and how scaled.

    Hooks, called by the server loop (only `on_push` is required):

        check_push(push)         raise ProtocolError(..., "rule") to refuse a push untouched
        on_push(push)            -> Outcome: apply now, or hold the push for later
        may_answer_pull(worker)  False holds the pull; asked again after every event
        pull_values(worker, names) -> the values a worker's pull reply carries (DANA: the
                                 look-ahead); None: the current parameters
        on_pulled(worker)        a pull reply was sent (DC-ASGD keeps w_bak here)
        after_update(update)     an update of this rule's was just applied (VSGD measures it)
        on_worker_left(worker)   -> Outcome: bye or declared dead; leave any barrier
        on_tick(now)             -> Outcome: every turn of the server loop (timers)
        on_stop()                -> Outcome: the server stops: answer everything held
        write_state(writer)      its own state into a checkpoint (minips/ops/rule_state.py)
        read_state(reader)       ... and back from one, on resume

    `self.store` (parameters, versions) and `self.registry` (live workers, clocks, whether
    the cluster is still assembling) are for reading only.
    """

    name: ClassVar[str] = ""
    options: ClassVar[tuple[RuleOption, ...]] = ()  # its settings, declared once
    # The momentum the server's SGD must have under this rule when --momentum is not
    # given; None: the run's default (minips.rules.DEFAULT_MOMENTUM). DANA keeps one
    # momentum per worker itself, so the server's shared one must be off: 0.
    server_momentum: ClassVar[float | None] = None
    # The server's momentum under this rule when --momentum is not given, which another
    # --momentum may override (unlike server_momentum); None: the run's default. The
    # rules whose paper analyses plain SGD (ringmaster, delay-adaptive) take 0.
    default_momentum: ClassVar[float | None] = None
    # The largest move |w' - w| of one coordinate in one update that the rule's own state
    # takes without overflowing (Gap-Aware squares it); the server refuses an update that
    # moves one further (`nonfinite`, minips.ops.overflow). inf: no such state.
    max_move: ClassVar[float] = math.inf
    # Checks the rule's own state before a push is kept (DANA's velocities, DC-ASGD's
    # compensation): set by the server's operations; None checks nothing.
    finite: FiniteCheck | None = None
    store: ParameterStore
    registry: WorkerRegistry
    restored: Restored | None = None  # resumed per-worker state (ops/rule_state.py)

    @classmethod
    def check_server_momentum(cls, momentum: float) -> None:
        """ConfigError when the server's momentum is not the one this rule needs."""
        if cls.server_momentum is not None and momentum != cls.server_momentum:
            raise ConfigError(
                f"rule {cls.name} keeps one momentum per worker, so the server's is"
                f" {cls.server_momentum:g}: leave --momentum unset (not {momentum:g}), or"
                f" choose a --rule that uses it, e.g. asgd"
            )

    @classmethod
    def worker_side(cls, described: dict[str, Any]) -> WorkerSide:
        """The worker's half of the rule, from `describe()` as a worker receives it."""
        return WorkerSide()

    def attach(self, store: ParameterStore, registry: WorkerRegistry) -> None:
        self.store = store
        self.registry = registry

    def describe(self) -> dict[str, Any]:
        """The rule and its settings, as sent to workers in `hello` (config["rule"])."""
        return {"name": self.name}

    def check_push(self, push: Push) -> None:
        pass

    def on_push(self, push: Push) -> Outcome:
        raise NotImplementedError

    def may_answer_pull(self, worker: WorkerState) -> bool:
        return True

    def pull_values(self, worker: WorkerState, names: list[str]) -> dict[str, np.ndarray] | None:
        """What a worker's pull reply carries for `names` (changed since its `since`) instead
        of the current parameters: fresh or read-only float32 arrays that are never changed
        afterwards (they are sent without copying). None: the parameters (the default).
        Not asked for an observer's pull, which always gets the parameters."""
        return None

    def on_pulled(self, worker: WorkerState) -> None:
        pass

    def after_update(self, update: Update) -> None:
        pass

    def on_worker_left(self, worker: WorkerState) -> Outcome:
        return Outcome()

    def on_tick(self, now: float) -> Outcome:
        return Outcome()

    def on_stop(self) -> Outcome:
        return Outcome()

    def write_state(self, writer: StateWriter) -> None:
        """Put the rule's own state (per worker, per parameter) into a checkpoint (its
        `rule/` arrays, written by minips/ops/rule_state.py)."""

    def read_state(self, reader: StateReader) -> None:
        """Take back what `write_state` put (checked first: DataError, nothing changed); the
        workers it names that do not say hello again within a heartbeat timeout are
        forgotten (`forget_absent`)."""

    def forget_absent(self, now: float) -> list[str]:
        """The ids of resumed workers that did not come back in time, once each (a rule
        with per-worker state forgets theirs from its on_tick)."""
        return self.restored.absent(now, self.registry) if self.restored is not None else []


class ASGD(Rule):
    """Asynchronous SGD (Hogwild-style PS): every push is applied at once.

    w <- w - lr * g(w_base)        with tau = t - base unbounded
    """

    name = "asgd"

    def on_push(self, push: Push) -> Outcome:
        return Outcome.update_now(push)


def option_default(cls: type[Rule], key: str) -> Any:
    """The declared default of option `key` of rule class `cls` (one definition)."""
    return next(option.default for option in cls.options if option.key == key)


def _option(rule: str, key: str, value: Any, ok: bool, want: str) -> None:
    """One-line ConfigError for a bad rule option (booleans are not numbers here)."""
    if isinstance(value, bool) or not ok:
        raise ConfigError(f"{rule} option {key} must be {want}, got {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: its name up to the last dot ("fc1.w" -> "fc1")."""
    return name.rpartition(".")[0] or name
