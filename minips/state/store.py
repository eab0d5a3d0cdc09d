"""The parameters, their versions, and the optimizer that writes each next version.

`ParameterStore`: named float32 arrays; a global version counter `t` (one per applied
update) and, per parameter, the version at which it last changed, so a pull can send only
what changed since the puller's version; snapshots, and a whole state restored (a
checkpoint's: minips/ops/checkpoint_file.py). `SGD`: momentum and weight decay, the one
optimizer, shared by the server's store and the single-process trainer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minips.errors import ConfigError, ShapeError


class ParameterStore:
    """Named float32 parameters updated in place by an SGD optimizer, with versions.

    params: name -> array (float32, C-contiguous), in model order; the very dict the
    optimizer was built on (`SGD(params, ...)`). On the server (`in_place` False) every
    version of a parameter is a new read-only array that replaces the old one in `params`:
    a pull reply can send it without a copy. `in_place` True keeps the caller's arrays and
    changes them in place: the single-process trainer, whose model computes with them,
    uses the store only for its checkpoint format.
    """

    def __init__(
        self,
        params: dict[str, np.ndarray],
        optimizer: SGD,
        in_place: bool = False,
        slices: Any = None,
    ) -> None:
        if not params:
            raise ConfigError("the parameter server needs at least one parameter")
        for name, array in params.items():
            if "/" in name or not name:
                raise ConfigError(f"parameter name {name!r} must be non-empty without '/'")
            if array.dtype != np.float32 or not array.flags.c_contiguous:
                raise ShapeError(f"parameter {name!r} must be a C-contiguous float32 array")
        if optimizer.params is not params:
            raise ConfigError("the optimizer must be built on the same params dict")
        self.params = params
        self.optimizer = optimizer
        self.in_place = in_place
        self.version = 0
        self.param_versions = dict.fromkeys(params, 0)
        # A shard of a server group: name -> its slice of the whole parameter, and VSGD's
        # samples of them, `slices.sampler(rho, min_samples)` (minips.group.partition)
        self.slices = slices if slices is not None else {}
        # Pull replies are sent with copy=False, so a sent array must never change: every
        # version of a parameter is a new array, published read-only (see `write`).
        if not in_place:
            for name, array in params.items():
                params[name] = _published(array.copy())

    def write(self, steps: list[tuple[str, np.ndarray, float]]) -> int:
        """Write the next version, t + 1: `optimizer.step_one(name, grad, scale)` for each
        step. Returns the new version t.

        Callers validate everything first: this is the only place parameters change. Each
        new version is written into a new array that replaces the old one in `params`, so
        an array once handed to a pull reply is never modified (no copy per pull).
        """
        _check_steps(self.params, steps)  # a rule's wrong step: nothing written (no half)
        self.version += 1
        for name, grad, scale in steps:
            fresh = None if self.in_place else np.empty_like(self.params[name])
            self.optimizer.step_one(name, grad, scale, out=fresh)
            if fresh is not None:  # published: the version it replaces may be in flight
                self.params[name] = _published(fresh)
            self.param_versions[name] = self.version
        return self.version

    def changed_since(self, since: int | None) -> list[str]:
        """Names changed after version `since` (all for None or a `since` from the future)."""
        if since is None or since > self.version:
            return list(self.params)
        return [name for name, v in self.param_versions.items() if v > since]

    def snapshot(self, name: str) -> np.ndarray:
        """The parameter at the current version: a read-only array that never changes."""
        return self.params[name]

    def restore(
        self,
        params: dict[str, np.ndarray],
        param_versions: dict[str, int],
        version: int,
        velocity: dict[str, np.ndarray],
    ) -> None:
        """Take a whole state whose names and shapes were checked against the model (a
        checkpoint's, minips/ops/checkpoint_file.py): every parameter, its version, the
        version t, and the optimizer's momentum buffers by parameter name."""
        for name, param in self.params.items():
            if self.in_place:
                param[...] = params[name]
            else:
                self.params[name] = _published(params[name].astype(param.dtype))
            self.param_versions[name] = int(param_versions[name])
        self.version = version
        for name, buf in velocity.items():  # each takes its parameter's dtype
            self.optimizer.velocity[name] = np.array(buf, dtype=self.params[name].dtype)


class SGD:
    """Stateful SGD with momentum and weight decay over a dict of named parameters.

    params: name -> array (float32, any shape); the same arrays the model computes with.
    The update, PyTorch's convention (so results compare one to one):

        g_t = scale * (grad + weight_decay * w)
        v_t = momentum * v_{t-1} + g_t          (v_0 = 0; skipped when momentum == 0)
        w  <- w - lr * v_t

    `scale` is how an update rule penalizes one gradient (DASGD's f(tau), VSGD's per-layer
    factor): it multiplies the gradient *before* it enters the velocity, so a stale
    gradient stays shrunk in every later step it echoes through, not only in the step it
    arrives in. (Scaling the whole step instead would let the unscaled gradient back in
    through momentum.)

    A parameter in `plain` is applied without momentum, v_t = g_t: its workers carry the
    momentum themselves (top-k's momentum correction, minips.transmission.codecs.topk; `plain_for`).
    """

    def __init__(
        self,
        params: dict[str, np.ndarray],
        lr: float = 0.01,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        self.params = params
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        # One velocity buffer per parameter, created lazily so a layer never updated costs nothing.
        self.velocity: dict[str, np.ndarray] = {}
        self.plain: frozenset[str] = frozenset()

    def plain_for(self, worker_momentum: dict[str, float]) -> None:
        """Apply the parameters of `worker_momentum` (name -> the momentum their workers
        apply) without momentum from now on. ConfigError unless each is this optimizer's
        momentum: the workers would otherwise run another optimizer than the server's."""
        for name, momentum in worker_momentum.items():
            if name not in self.params:
                raise ConfigError(f"momentum correction for unknown parameter {name!r}")
            if momentum != self.momentum:
                raise ConfigError(
                    f"{name}: the plan's top-k momentum {momentum:g} is not the server's "
                    f"{self.momentum:g} (--momentum)"
                )
        self.plain = frozenset(worker_momentum)

    def step_one(
        self, name: str, grad: np.ndarray, scale: float = 1.0, out: np.ndarray | None = None
    ) -> None:
        """Apply one gradient (same shape as params[name]) to one parameter.

        In place by default. With `out` (an array of the parameter's shape and dtype), the
        new values are written there and params[name] is left as it was: the server uses
        this to publish each version as a new, never-changed array (no copy per pull).
        """
        self._write(self.params[name], grad, scale, self._velocity(name), out)

    def _velocity(self, name: str) -> np.ndarray | None:
        """The momentum buffer v of `name`, made (zeros) at its first step; None without
        momentum or for a `plain` parameter."""
        if not self.momentum or name in self.plain:
            return None
        velocity = self.velocity.get(name)
        if velocity is None:
            velocity = self.velocity[name] = np.zeros_like(self.params[name])
        return velocity

    def preview(
        self, name: str, grad: np.ndarray, scale: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """(w', v'): what `step_one(name, grad, scale)` would write, bit for bit, as new
        arrays (v' None without momentum); nothing is changed. Overflows are not warned
        about: the overflow check (minips.ops.overflow) looks at the result."""
        weight, velocity = self.params[name], None
        if self.momentum and name not in self.plain:
            old = self.velocity.get(name)
            velocity = np.zeros_like(weight) if old is None else old.copy()
        out = np.empty_like(weight)
        with np.errstate(over="ignore", invalid="ignore"):
            self._write(weight, grad, scale, velocity, out)
        return out, velocity

    def _write(
        self,
        weight: np.ndarray,
        grad: np.ndarray,
        scale: float,
        velocity: np.ndarray | None,
        out: np.ndarray | None,
    ) -> None:
        """The step (class docstring): `velocity` (None: none) updated in place, the new
        weight into `out` (None: into `weight`, in place)."""
        if self.weight_decay:
            grad = grad + self.weight_decay * weight
        if velocity is None:
            # The scalars multiplied first, so the array is touched once.
            step, factor = grad, np.asarray(self.lr * scale, dtype=weight.dtype)
        else:
            velocity *= self.momentum
            if scale == 1.0:
                velocity += grad
            else:
                velocity += np.asarray(scale, dtype=weight.dtype) * grad
            step, factor = velocity, np.asarray(self.lr, dtype=weight.dtype)
        if out is None:
            weight -= factor * step
        else:  # out = weight - factor * step, with no temporary array
            np.multiply(step, -factor, out=out)
            out += weight

    def step(self, grads: dict[str, np.ndarray], scale: float | dict[str, float] = 1.0) -> None:
        """Apply a dict of gradients; `scale` is one factor or one per parameter name."""
        for name, grad in grads.items():
            factor = scale[name] if isinstance(scale, dict) else scale
            self.step_one(name, grad, factor)


def _check_steps(params: dict[str, np.ndarray], steps: list[tuple[str, np.ndarray, float]]) -> None:
    """ValueError (an `internal` error: a bug in the rule that made them) unless every step
    names a parameter and has its shape, so an update fails before it writes anything."""
    for name, grad, _ in steps:
        if name not in params or np.shape(grad) != params[name].shape:
            raise ValueError(f"an update's step for {name!r} fits no parameter of the model")


def _published(array: np.ndarray) -> np.ndarray:
    """Mark a parameter version read-only: it may be in flight in a pull reply."""
    array.flags.writeable = False
    return array
