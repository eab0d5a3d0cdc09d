"""The rule interface: a push as a rule sees it, what the server offers, the base class."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from minips.errors import ConfigError

if TYPE_CHECKING:
    from minips.store import ParameterStore, UpdateRecord
    from minips.workers import WorkerState


@dataclass(eq=False)
class Push:
    """One accepted push: float32 gradients by parameter name, plus rule-specific extras.

    `staleness` is tau = t - base: set on arrival, and refreshed when the push goes into
    an applied update (t = the global version just before it), so `scale` can use it.
    """

    worker: WorkerState
    seq: int
    base: int
    last: bool  # ends the worker's step (clock)
    grads: dict[str, np.ndarray]  # name -> float32, parameter's shape
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # "extra/<key>" -> array
    staleness: int = 0
    reply_to: Any = None  # the server's routing envelope; replaced when a retry arrives


@dataclass(frozen=True)
class RuleOption:
    """One option of a rule, declared once beside the rule.

    The CLI flag, its type, range, help and shown default, and the rule's own default are
    all derived from this declaration (minips.config builds the click options from it).
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


class RuleHost(Protocol):
    """What a rule may use of the server (see the module docstring)."""

    store: ParameterStore

    def live_workers(self) -> list[WorkerState]: ...

    def apply_update(
        self,
        pushes: list[Push],
        steps: list[tuple[str, np.ndarray, float]],
        *,
        value_staleness: dict[str, float] | None = None,
    ) -> UpdateRecord: ...

    def drop_push(self, push: Push) -> None: ...

    def answer_push(self, push: Push, applied: bool) -> None: ...

    def assembling(self) -> bool: ...


class Rule:
    """Base class: the default hooks do nothing and allow everything."""

    name: ClassVar[str] = ""
    options: ClassVar[tuple[RuleOption, ...]] = ()  # its settings, declared once
    host: RuleHost

    @classmethod
    def worker_side(cls, described: dict[str, Any]) -> WorkerSide:
        """The worker's half of the rule, from `describe()` as a worker receives it."""
        return WorkerSide()

    def attach(self, host: RuleHost) -> None:
        self.host = host

    def describe(self) -> dict[str, Any]:
        """The rule and its settings, as sent to workers in `hello` (config["rule"])."""
        return {"name": self.name}

    def on_hello(self, worker: WorkerState) -> None:
        pass

    def validate_push(self, push: Push) -> None:
        pass

    def on_push(self, push: Push) -> None:
        raise NotImplementedError

    def scale(self, push: Push, name: str, grad: np.ndarray) -> tuple[np.ndarray, float]:
        return grad, 1.0

    def may_answer_pull(self, worker: WorkerState) -> bool:
        return True

    def on_pulled(self, worker: WorkerState) -> None:
        pass

    def on_worker_left(self, worker: WorkerState) -> None:
        pass

    def on_stop(self) -> None:
        pass

    def on_tick(self, now: float) -> None:
        pass

    def apply_now(self, push: Push) -> UpdateRecord:
        """Apply one push as one update through `scale`, then answer it."""
        steps = [(name, *self.scale(push, name, grad)) for name, grad in push.grads.items()]
        record = self.host.apply_update([push], steps)
        self.host.answer_push(push, applied=True)
        return record


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
