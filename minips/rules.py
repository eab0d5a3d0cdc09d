"""Update rules: when a pushed gradient becomes an update, and with what scale.

A rule is one small class. The server (its `host`) owns sockets, workers and the parameter
store; it calls the rule's hooks on events and offers the rule three actions:

    host.apply_update(pushes, steps) -> UpdateRecord   # steps: [(name, grad, scale)], t += 1
        (keyword value_staleness={layer: d_l}: recorded in the update's telemetry)
    host.drop_push(push)                               # not applied (scale 0): t unchanged,
                                                       # telemetry records it, reply sent
    host.answer_push(push, applied)                    # send the push's reply (once)
    host.live_workers() -> list[WorkerState]           # .worker_id, .rank, .clock, ...
    host.assembling() -> bool                          # still waiting for world_size hellos
    host.store                                         # .params, .version, .param_versions

Hooks (all optional except `on_push`):

    on_hello(worker)           a worker (re)registered
    validate_push(push)        raise ProtocolError(..., "rule") to refuse a push untouched
    on_push(push)              decide: apply now, or hold the reply and apply later
    scale(push, name, grad)    -> (grad', factor): the per-gradient hook of `apply_now`
    may_answer_pull(worker)    False holds the pull; re-asked after every push / departure
    on_pulled(worker)          a pull reply was sent (DC-ASGD keeps w_bak here)
    on_worker_left(worker)     bye or declared dead: leave any barrier
    on_stop()                  the server stops: answer everything held
    on_tick(now)               called on every turn of the server loop (timers)

Adding a rule is usually one `scale` method: DASGD returns (grad, f(tau)), DC-ASGD
(g + lam*g*g*(w - w_bak), 1.0). VSGD needs the whole push at once (a layer's scale spans
its parameters), so it overrides `on_push`. Register the class in RULES.
docs/algorithms.md has the math of every rule and the papers they come from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from minips.errors import ConfigError
from minips.sampling import Sampler
from minips.wire import ProtocolError

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
    host: RuleHost

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


class ASGD(Rule):
    """Asynchronous SGD (Hogwild-style PS): every push is applied at once.

    w <- w - lr * g(w_base)        with tau = t - base unbounded
    """

    name = "asgd"

    def on_push(self, push: Push) -> None:
        self.apply_now(push)


class SSP(ASGD):
    """Stale Synchronous Parallel (Ho et al., NIPS 2013): ASGD with bounded clock drift.

    A worker's clock c_w counts its completed steps (pushes with `last`). A pull by w is
    held while  c_w - min_{live v} c_v > s,  so no worker computes on parameters more than
    s clocks ahead of the slowest live worker. s = 0 is bulk-synchronous on the pull side.
    """

    name = "ssp"

    def __init__(self, staleness: int = 3) -> None:
        if staleness < 0:
            raise ConfigError(f"ssp staleness bound must be >= 0, got {staleness}")
        self.staleness = staleness

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "staleness": self.staleness}

    def may_answer_pull(self, worker: WorkerState) -> bool:
        slowest = min((w.clock for w in self.host.live_workers()), default=worker.clock)
        return worker.clock - slowest <= self.staleness


class SSGD(Rule):
    """Synchronous SGD with a barrier per step over the live workers.

    Round k ends when every live worker has sent its `last` push of the round; then

        w <- w - lr * (1/|K_p|) * sum_{w in K_p} g_w[p]      for every parameter p

    is applied as ONE update (K_p: the workers that sent a gradient for p this round) and
    all held pushes are answered. A worker that leaves or dies drops out of the round: its
    unfinished step is discarded and the barrier completes without it. While the cluster
    is still assembling (fewer than world_size workers have said hello, for at most a
    heartbeat timeout) no round completes, so early workers do not train alone.
    """

    name = "ssgd"

    def __init__(self) -> None:
        self._sums: dict[str, dict[str, np.ndarray]] = {}  # worker_id -> name -> sum of grads
        self._held: dict[str, Push] = {}  # worker_id -> its `last` push of this round

    def on_push(self, push: Push) -> None:
        sums = self._sums.setdefault(push.worker.worker_id, {})
        for name, grad in push.grads.items():
            if name in sums:
                sums[name] += grad
            else:
                sums[name] = np.array(grad, dtype=np.float32)  # own copy: grad is a frame view
        if not push.last:
            self.host.answer_push(push, applied=False)  # queued for the round
            return
        self._held[push.worker.worker_id] = push
        self._try_complete()

    def on_worker_left(self, worker: WorkerState) -> None:
        if worker.worker_id not in self._held:
            self._sums.pop(worker.worker_id, None)
        self._try_complete()

    def on_tick(self, now: float) -> None:
        self._try_complete()  # the assembly period may have ended

    def on_stop(self) -> None:
        for push in self._held.values():
            self.host.answer_push(push, applied=False)
        self._held.clear()
        self._sums.clear()

    def _try_complete(self) -> None:
        if not self._held:
            return
        if any(w.worker_id not in self._held for w in self.host.live_workers()):
            return
        if self.host.assembling():
            return
        totals: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        for worker_id in self._held:
            for name, grad_sum in self._sums.pop(worker_id, {}).items():
                totals[name] = totals[name] + grad_sum if name in totals else grad_sum
                counts[name] = counts.get(name, 0) + 1
        order = [name for name in self.host.store.params if name in totals]  # model order
        steps = [(name, totals[name] / np.float32(counts[name]), 1.0) for name in order]
        pushes = list(self._held.values())
        self._held.clear()
        self.host.apply_update(pushes, steps)
        for push in pushes:
            self.host.answer_push(push, applied=True)


def _option(rule: str, key: str, value: Any, ok: bool, want: str) -> None:
    """One-line ConfigError for a bad rule option (booleans are not numbers here)."""
    if isinstance(value, bool) or not ok:
        raise ConfigError(f"{rule} option {key} must be {want}, got {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: its name up to the last dot ("fc1.w" -> "fc1")."""
    return name.rpartition(".")[0] or name


class DASGD(ASGD):
    """Delay-aware ASGD: every update is shrunk by a function of its clock staleness.

        w <- w - lr * f(tau) * g(w_base),        tau = t - base

    schedule  f(tau)                           option (default)
    inverse   1 / max(1, tau)                  -              Zhang et al., IJCAI 2016
    exp       exp(-beta * tau)                 beta (0.2)
    poly      (1 + tau) ** -power              power (0.5)
    cutoff    1 if tau <= tau_max, else drop  tau_max (8)

    A dropped push is not an update: t and the parameters stay as they are (t counts the
    changes `base` refers to), its reply says `applied: false`, and the server's telemetry
    records it (`dropped: true` in the update record, `dropped` in stats).
    """

    name = "dasgd"
    SCHEDULES: ClassVar[dict[str, tuple[str, float] | None]] = {
        "inverse": None,
        "exp": ("beta", 0.2),
        "poly": ("power", 0.5),
        "cutoff": ("tau_max", 8),
    }

    def __init__(
        self,
        schedule: str = "inverse",
        beta: float | None = None,
        power: float | None = None,
        tau_max: int | None = None,
    ) -> None:
        if schedule not in self.SCHEDULES:
            raise ConfigError(
                f"unknown dasgd schedule {schedule!r} (known: {', '.join(self.SCHEDULES)})"
            )
        self.schedule = schedule
        own = self.SCHEDULES[schedule]
        given = {"beta": beta, "power": power, "tau_max": tau_max}
        for key, value in given.items():
            if value is not None and (own is None or key != own[0]):
                home = next(s for s, o in self.SCHEDULES.items() if o and o[0] == key)
                raise ConfigError(
                    f"dasgd option {key} only applies to schedule {home!r} "
                    f"(the schedule is {schedule!r})"
                )
        self.beta = self.power = self.tau_max = None
        if own is not None:
            key, default = own
            value = given[key] if given[key] is not None else default
            if key == "tau_max":
                _option(
                    "dasgd", key, value, isinstance(value, int) and value >= 0, "an integer >= 0"
                )
            else:
                _option("dasgd", key, value, _is_number(value) and value > 0, "a number > 0")
            setattr(self, key, value)

    def describe(self) -> dict[str, Any]:
        own = self.SCHEDULES[self.schedule]
        extra = {own[0]: getattr(self, own[0])} if own else {}
        return {"name": self.name, "schedule": self.schedule, **extra}

    def factor(self, tau: int) -> float:
        """f(tau); for cutoff, 0.0 past tau_max (the push is dropped)."""
        if self.schedule == "inverse":
            return 1.0 / max(1, tau)
        if self.schedule == "exp":
            return math.exp(-self.beta * tau)
        if self.schedule == "poly":
            return (1.0 + tau) ** -self.power
        return 1.0 if tau <= self.tau_max else 0.0

    def on_push(self, push: Push) -> None:
        # Only cutoff drops (exp/poly may underflow to 0.0 for a huge tau: still an update).
        if self.schedule == "cutoff" and push.staleness > self.tau_max:
            self.host.drop_push(push)  # scale 0 changes nothing: do not count it as an update
        else:
            self.apply_now(push)

    def scale(self, push: Push, name: str, grad: np.ndarray) -> tuple[np.ndarray, float]:
        return grad, self.factor(push.staleness)


class VSGD(ASGD):
    """Value-staleness SGD: each layer's step is shrunk by how far, in value, it is behind.

    Every parameter p has a fixed sample S_p of its coordinates (minips.sampling: a fraction
    rho, at least min_samples, the same on worker and server). With each gradient the worker
    sends w_worker_p[S_p] ("extra/sample/<p>"), the values the gradient was computed at.
    For each layer l (parameters "<l>.*") in the push, at the moment it is applied:

        gap_l  = sqrt( sum_{p in l} || w_server_p[S_p] - w_worker_p[S_p] ||^2 )
        step_l = sqrt( sum_{p in l} step_p^2 ),  step_p = EMA of || Delta w_p[S_p] || over the
                 applied updates that changed p (step_p <- decay*step_p + (1-decay)*move;
                 the first move initialises it)
        d_l    = gap_l / step_l        (0 while step_l is 0: nothing has moved yet)
        w_p   <- w_p - lr * g_p / max(1, d_l)      for every p of layer l

    d_l counts "how many typical updates behind" the worker's copy of layer l is: a layer
    that stopped moving is not penalised however old its clock, one that moved a lot is.
    The EMA (not a cumulative mean) follows the step size as training settles. Close in
    spirit to Gap-Aware (Barkai, Hakimi, Schuster, ICLR 2020); the sample keeps the extra
    upload near rho of the model.
    """

    name = "vsgd"

    def __init__(self, rho: float = 0.01, min_samples: int = 32, step_decay: float = 0.9) -> None:
        _option("vsgd", "rho", rho, _is_number(rho) and 0 < rho <= 1, "in (0, 1]")
        _option(
            "vsgd",
            "min_samples",
            min_samples,
            isinstance(min_samples, int) and min_samples >= 1,
            "an integer >= 1",
        )
        _option(
            "vsgd",
            "step_decay",
            step_decay,
            _is_number(step_decay) and 0 <= step_decay < 1,
            "in [0, 1)",
        )
        self.rho = float(rho)
        self.min_samples = min_samples
        self.step_decay = float(step_decay)
        self.sampler = Sampler(self.rho, self.min_samples)
        self._step: dict[str, float] = {}  # param -> EMA of the norm one update moves w[S_p]

    def describe(self) -> dict[str, Any]:
        # Workers read rho and min_samples from here to pick the same samples.
        return {
            "name": self.name,
            "rho": self.rho,
            "min_samples": self.min_samples,
            "step_decay": self.step_decay,
        }

    def _server_values(self, name: str) -> np.ndarray:
        return self.sampler.values(name, self.host.store.params[name])  # (k_p,) float32 copy

    def validate_push(self, push: Push) -> None:
        for name in push.grads:
            key = f"extra/sample/{name}"
            sample = push.extra.get(key)
            size = self.host.store.params[name].size
            k = len(self.sampler.indices(name, size))
            if sample is None:
                raise ProtocolError(f"vsgd needs {key!r} with the gradient of {name!r}", "rule")
            if sample.dtype != np.float32 or sample.shape != (k,):
                raise ProtocolError(
                    f"{key!r} must be float32 of shape [{k}], "
                    f"got {sample.dtype} {list(sample.shape)}",
                    "rule",
                )

    def on_push(self, push: Push) -> None:
        before = {name: self._server_values(name) for name in push.grads}
        gap2: dict[str, float] = {}
        step2: dict[str, float] = {}
        for name in push.grads:
            layer = layer_of(name)
            diff = before[name].astype(np.float64) - push.extra[f"extra/sample/{name}"]
            gap2[layer] = gap2.get(layer, 0.0) + float(diff @ diff)
            step2[layer] = step2.get(layer, 0.0) + self._step.get(name, 0.0) ** 2
        d = {
            layer: math.sqrt(gap2[layer] / step2[layer]) if step2[layer] > 0 else 0.0
            for layer in gap2
        }
        steps = [(name, g, 1.0 / max(1.0, d[layer_of(name)])) for name, g in push.grads.items()]
        self.host.apply_update([push], steps, value_staleness=d)
        for name in push.grads:  # how far this update moved the sample: the running step
            move = float(np.linalg.norm(self._server_values(name) - before[name]))
            old = self._step.get(name)
            self._step[name] = (
                move if old is None else (self.step_decay * old + (1 - self.step_decay) * move)
            )
        self.host.answer_push(push, applied=True)


class DCASGD(ASGD):
    """Delay-compensated ASGD (Zheng et al., ICML 2017, DC-ASGD-c with a constant lambda).

    The gradient g = grad f(w_bak) a worker computed at the parameters it pulled, w_bak, is
    corrected towards grad f(w) at the current parameters w with a cheap diagonal
    approximation of the Hessian (lambda * g * g):

        g' = g + lambda * g * g * (w - w_bak[worker])          (elementwise)
        w <- w - lr * g'

    The server keeps, per worker, a copy of the parameters of its last pull (one model copy
    per worker; only parameters changed since that worker's previous pull are copied). A
    push whose `base` is not the version of that copy (the worker pulled again, or never
    pulled) has no reference point and is applied uncompensated, like ASGD.
    """

    name = "dcasgd"

    def __init__(self, lam: float = 0.04) -> None:
        _option("dcasgd", "lam", lam, _is_number(lam) and lam >= 0, "a number >= 0")
        self.lam = float(lam)
        # worker_id -> (version of the pull, name -> copy, name -> param version of copy)
        self._bak: dict[str, tuple[int, dict[str, np.ndarray], dict[str, int]]] = {}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "lam": self.lam}

    def on_pulled(self, worker: WorkerState) -> None:
        store = self.host.store
        _, copies, versions = self._bak.get(worker.worker_id, (0, {}, {}))
        for name, param in store.params.items():
            if versions.get(name) != store.param_versions[name]:
                if name in copies:
                    np.copyto(copies[name], param)  # reuse the buffer: no allocation per pull
                else:
                    copies[name] = param.copy()
                versions[name] = store.param_versions[name]
        self._bak[worker.worker_id] = (store.version, copies, versions)

    def on_worker_left(self, worker: WorkerState) -> None:
        self._bak.pop(worker.worker_id, None)  # a returning worker pulls afresh

    def scale(self, push: Push, name: str, grad: np.ndarray) -> tuple[np.ndarray, float]:
        bak = self._bak.get(push.worker.worker_id)
        if bak is None or bak[0] != push.base or not self.lam:
            return grad, 1.0
        delta = self.host.store.params[name] - bak[1][name]  # w - w_bak, float32
        return grad + np.float32(self.lam) * grad * grad * delta, 1.0


RULES: dict[str, type[Rule]] = {cls.name: cls for cls in (ASGD, SSGD, SSP, DASGD, VSGD, DCASGD)}


def make_rule(name: str, **options: Any) -> Rule:
    """Build a rule by name: make_rule("ssp", staleness=2). ConfigError on unknown names."""
    if name not in RULES:
        raise ConfigError(f"unknown update rule {name!r} (known: {', '.join(RULES)})")
    try:
        return RULES[name](**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for rule {name!r}: {exc}") from None
