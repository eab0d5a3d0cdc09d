"""Delay-penalized rules: DASGD (clock staleness), VSGD (value staleness), DC-ASGD."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from minips.errors import ConfigError
from minips.protocol.sampling import Sampler
from minips.protocol.wire import ProtocolError
from minips.rules.base import (
    Outcome,
    Push,
    RuleOption,
    Update,
    WorkerSide,
    _is_number,
    _option,
    layer_of,
    option_default,
)
from minips.rules.classic import ASGD

if TYPE_CHECKING:
    from minips.rules.base import StateReader, StateWriter
    from minips.state.registry import WorkerState


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
    # schedule -> the option it takes (None: no option)
    SCHEDULES: ClassVar[dict[str, str | None]] = {
        "inverse": None,
        "exp": "beta",
        "poly": "power",
        "cutoff": "tau_max",
    }
    options = (
        RuleOption("schedule", "--dasgd-schedule", str, "inverse",
                   "dasgd: f(tau) = 1/max(1,tau) | exp(-beta tau) | (1+tau)^-power "
                   "| drop past tau-max.", choices=tuple(SCHEDULES)),
        RuleOption("beta", "--beta", float, 0.2,
                   "dasgd exp: decay per clock of staleness.", minimum=0, min_open=True),
        RuleOption("power", "--power", float, 0.5,
                   "dasgd poly: exponent p.", minimum=0, min_open=True),
        RuleOption("tau_max", "--tau-max", int, 8,
                   "dasgd cutoff: drop pushes staler than this.", minimum=0),
    )  # fmt: skip

    def __init__(
        self,
        schedule: str | None = None,
        beta: float | None = None,
        power: float | None = None,
        tau_max: int | None = None,
    ) -> None:
        schedule = option_default(DASGD, "schedule") if schedule is None else schedule
        if schedule not in self.SCHEDULES:
            raise ConfigError(
                f"unknown dasgd schedule {schedule!r} (known: {', '.join(self.SCHEDULES)})"
            )
        self.schedule = schedule
        own = self.SCHEDULES[schedule]
        given = {"beta": beta, "power": power, "tau_max": tau_max}
        for key, value in given.items():
            if value is not None and key != own:
                home = next(s for s, o in self.SCHEDULES.items() if o == key)
                raise ConfigError(
                    f"dasgd option {key} only applies to schedule {home!r} "
                    f"(the schedule is {schedule!r})"
                )
        self.beta = self.power = self.tau_max = None
        if own is not None:
            key = own
            value = given[key] if given[key] is not None else option_default(DASGD, key)
            if key == "tau_max":
                _option(
                    "dasgd", key, value, isinstance(value, int) and value >= 0, "an integer >= 0"
                )
            else:
                _option("dasgd", key, value, _is_number(value) and value > 0, "a number > 0")
            setattr(self, key, value)

    def describe(self) -> dict[str, Any]:
        own = self.SCHEDULES[self.schedule]
        extra = {own: getattr(self, own)} if own else {}
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

    def on_push(self, push: Push) -> Outcome:
        # Only cutoff drops (exp/poly may underflow to 0.0 for a huge tau: still an update).
        if self.schedule == "cutoff" and push.staleness > self.tau_max:
            return Outcome(drops=[push])  # scale 0 changes nothing: not an update
        return Outcome.update_now(push, scale=self.factor(push.staleness))


class VSGD(ASGD):
    """Value-staleness SGD: each layer's step is shrunk by how far, in value, it is behind.

    Every parameter p has a fixed sample S_p of its coordinates (minips.protocol.sampling: a
    fraction rho, at least min_samples, the same on worker and server). With each gradient
    the worker sends w_worker_p[S_p] ("extra/sample/<p>"), the values the gradient was computed at.
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
    options = (
        RuleOption("rho", "--vsgd-rho", float, 0.01,
                   "vsgd: fraction of each parameter sampled.",
                   minimum=0, min_open=True, maximum=1),
        RuleOption("min_samples", "--vsgd-min-samples", int, 32,
                   "vsgd: at least this many samples per parameter.", minimum=1),
        RuleOption("step_decay", "--vsgd-step-decay", float, 0.9,
                   "vsgd: decay of the running mean of one update's move.",
                   minimum=0, maximum=1, max_open=True),
    )  # fmt: skip

    def __init__(
        self,
        rho: float | None = None,
        min_samples: int | None = None,
        step_decay: float | None = None,
    ) -> None:
        rho = option_default(VSGD, "rho") if rho is None else rho
        min_samples = option_default(VSGD, "min_samples") if min_samples is None else min_samples
        step_decay = option_default(VSGD, "step_decay") if step_decay is None else step_decay
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
        self._before: dict[str, np.ndarray] = {}  # sample values before the pending update

    @classmethod
    def worker_side(cls, described: dict[str, Any]) -> WorkerSide:
        return VSGDWorkerSide(Sampler(float(described["rho"]), int(described["min_samples"])))

    def describe(self) -> dict[str, Any]:
        # Workers read rho and min_samples from here to pick the same samples.
        return {
            "name": self.name,
            "rho": self.rho,
            "min_samples": self.min_samples,
            "step_decay": self.step_decay,
        }

    def attach(self, store: Any, registry: Any) -> None:
        super().attach(store, registry)
        if store.slices:  # a shard of a group: samples of the whole parameters (16.6)
            self.sampler = store.slices.sampler(self.rho, self.min_samples)

    def _server_values(self, name: str) -> np.ndarray:
        return self.sampler.values(name, self.store.params[name])  # (k_p,) float32 copy

    def check_push(self, push: Push) -> None:
        for name in push.grads:
            key = f"extra/sample/{name}"
            sample = push.extra.get(key)
            size = self.store.params[name].size
            k = len(self.sampler.indices(name, size))
            if sample is None:
                raise ProtocolError(f"vsgd needs {key!r} with the gradient of {name!r}", "rule")
            codec = push.codecs.get(key, "dense")  # widened from fp16, it would pass as float32
            if codec != "dense" or sample.dtype != np.float32 or sample.shape != (k,):
                raise ProtocolError(
                    f"{key!r} must be dense float32 of shape [{k}], "
                    f"got {codec} {sample.dtype} {list(sample.shape)}",
                    "rule",
                )

    def on_push(self, push: Push) -> Outcome:
        self._before = {name: self._server_values(name) for name in push.grads}
        gap2: dict[str, float] = {}
        step2: dict[str, float] = {}
        for name in push.grads:
            layer = layer_of(name)
            diff = self._before[name].astype(np.float64) - push.extra[f"extra/sample/{name}"]
            gap2[layer] = gap2.get(layer, 0.0) + float(diff @ diff)
            step2[layer] = step2.get(layer, 0.0) + self._step.get(name, 0.0) ** 2
        d = {
            layer: math.sqrt(gap2[layer] / step2[layer]) if step2[layer] > 0 else 0.0
            for layer in gap2
        }
        steps = [(name, g, 1.0 / max(1.0, d[layer_of(name)])) for name, g in push.grads.items()]
        return Outcome(updates=[Update([push], steps, value_staleness=d)], answers=[(push, True)])

    def after_update(self, update: Update) -> None:
        """How far the update moved each sample: the running step (an EMA)."""
        for name, before in self._before.items():
            move = float(np.linalg.norm(self._server_values(name) - before))
            old = self._step.get(name)
            self._step[name] = (
                move if old is None else (self.step_decay * old + (1 - self.step_decay) * move)
            )

    def write_state(self, writer: StateWriter) -> None:
        """step_p of every parameter (a checkpoint: minips/ops/rule_state.py)."""
        writer.shared("step", self._step)

    def read_state(self, reader: StateReader) -> None:
        self._step = {name: float(step) for name, step in reader.shared_numbers("step").items()}


class VSGDWorkerSide(WorkerSide):
    """A VSGD worker sends, with each gradient, the sampled values it was computed at."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def extras(
        self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        return {f"sample/{name}": self.sampler.values(name, params[name]) for name in grads}


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
    options = (
        RuleOption("lam", "--dc-lambda", float, 0.04,
                   "dcasgd: lambda of the delay compensation.", minimum=0),
    )  # fmt: skip

    def __init__(self, lam: float | None = None) -> None:
        lam = option_default(DCASGD, "lam") if lam is None else lam
        _option("dcasgd", "lam", lam, _is_number(lam) and lam >= 0, "a number >= 0")
        self.lam = float(lam)
        # worker_id -> (version of the pull, name -> copy, name -> param version of copy)
        self._bak: dict[str, tuple[int, dict[str, np.ndarray], dict[str, int]]] = {}
        # the push check_push just passed and its compensated gradients (None: plain asgd)
        self._checked: tuple[Push, dict[str, np.ndarray] | None] | None = None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "lam": self.lam}

    def on_pulled(self, worker: WorkerState) -> None:
        store = self.store
        _, copies, versions = self._bak.get(worker.worker_id, (0, {}, {}))
        for name, param in store.params.items():
            if versions.get(name) != store.param_versions[name]:
                if name in copies:
                    np.copyto(copies[name], param)  # reuse the buffer: no allocation per pull
                else:
                    copies[name] = param.copy()
                versions[name] = store.param_versions[name]
        self._bak[worker.worker_id] = (store.version, copies, versions)

    def on_worker_left(self, worker: WorkerState) -> Outcome:
        self._bak.pop(worker.worker_id, None)  # a returning worker pulls afresh
        return Outcome()

    def on_tick(self, now: float) -> Outcome:
        for worker_id in self.forget_absent(now):  # resumed, and did not come back
            self._bak.pop(worker_id, None)
        return Outcome()

    def write_state(self, writer: StateWriter) -> None:
        """Each worker's w_bak and its version (a checkpoint: minips/ops/rule_state.py)."""
        for worker_id, (version, copies, _) in self._bak.items():
            writer.worker_number("pulled_version", worker_id, version)
            writer.worker_arrays("pulled", worker_id, copies)

    def read_state(self, reader: StateReader) -> None:
        # Without the copies' parameter versions the next pull refreshes every copy.
        versions, copies = reader.worker_numbers("pulled_version"), reader.worker_arrays("pulled")
        self._bak = {w: (version, copies.get(w, {}), {}) for w, version in versions.items()}

    def compensated(self, push: Push) -> dict[str, np.ndarray] | None:
        """g + lam g * g * (w - w_bak) for each gradient; None without a reference point."""
        bak = self._bak.get(push.worker.worker_id)
        if bak is None or bak[0] != push.base or not self.lam:
            return None
        _, w_bak, _ = bak
        lam = np.float32(self.lam)
        with np.errstate(over="ignore", invalid="ignore"):  # refused by check_push
            return {
                name: g + lam * g * g * (self.store.params[name] - w_bak[name])  # w - w_bak
                for name, g in push.grads.items()
            }

    def check_push(self, push: Push) -> None:
        """`nonfinite` when the compensated step would make a parameter non-finite: the
        server checked the pushed g, but g * g overflows for a finite |g| above 1.8e19.
        The compensation is kept for `on_push` of the same push (computed once)."""
        self._checked = (push, self.compensated(push))
        for name, grad in (self._checked[1] or {}).items():
            if self.finite is not None and not self.finite.step_finite(name, grad):
                raise ProtocolError(
                    f"gradient {name!r}, compensated, would make the parameter non-finite",
                    "nonfinite",
                )

    def on_push(self, push: Push) -> Outcome:
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] is push:
            compensated = checked[1]
        else:  # a step assembled from several pushes
            compensated = self.compensated(push)
        if compensated is None:
            return Outcome.update_now(push)  # no reference point: plain ASGD
        return Outcome.update_now(push, grads=compensated)
