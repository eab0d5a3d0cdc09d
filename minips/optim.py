"""SGD with momentum and weight decay, shared by the single-process trainer and the server.

Update (PyTorch's convention, so results compare one to one):

    g_t = scale * (grad + weight_decay * w)
    v_t = momentum * v_{t-1} + g_t          (v_0 = 0; skipped when momentum == 0)
    w  <- w - lr * v_t

`scale` is how an update rule penalizes one gradient (DASGD's f(tau), VSGD's per-layer
factor): it multiplies the gradient *before* it enters the velocity, so a stale gradient
stays shrunk in every later step it echoes through, not only in the step it arrives in.
(Scaling the whole step instead would let the unscaled gradient back in through momentum.)
"""

from __future__ import annotations

import numpy as np


class SGD:
    """Stateful SGD over a dict of named parameters, updated in place.

    params: name -> array (float32, any shape); the same arrays the model computes with.
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

    def step_one(
        self, name: str, grad: np.ndarray, scale: float = 1.0, out: np.ndarray | None = None
    ) -> None:
        """Apply one gradient (same shape as params[name]) to one parameter.

        In place by default. With `out` (an array of the parameter's shape and dtype), the
        new values are written there and params[name] is left as it was: the server uses
        this to publish each version as a new, never-changed array (no copy per pull).
        """
        weight = self.params[name]
        if self.weight_decay:
            grad = grad + self.weight_decay * weight
        if not self.momentum:
            # The scalars multiplied first, so the array is touched once.
            step, factor = grad, np.asarray(self.lr * scale, dtype=weight.dtype)
        else:
            velocity = self.velocity.get(name)
            if velocity is None:
                velocity = self.velocity[name] = np.zeros_like(weight)
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

    def state_dict(self) -> dict[str, np.ndarray]:
        """Velocity buffers, keyed `velocity/<param>`, for checkpoints."""
        return {f"velocity/{name}": buf for name, buf in self.velocity.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned (unknown keys are ignored).

        Each buffer takes its parameter's dtype; a wrong shape is a ValueError.
        """
        for key, buf in state.items():
            name = key.removeprefix("velocity/")
            if name == key or name not in self.params:
                continue
            weight = self.params[name]
            if np.shape(buf) != weight.shape:
                raise ValueError(f"velocity/{name} has shape {np.shape(buf)}, not {weight.shape}")
            self.velocity[name] = np.array(buf, dtype=weight.dtype)
