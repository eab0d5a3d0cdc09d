"""What the server refuses from a client it cannot trust: checks that change nothing.

    check_info(info)                 hello's `info`: at most MAX_INFO_BYTES packed and
                                     MAX_INFO_DEPTH levels deep, so `stats` always encodes
    require_operator(origin, keys)   `stop` and `checkpoint` need an operator key (CURVE)
    clip_gradients(grads, max_norm)  the optional --clip-norm: g <- g * min(1, c / ||g||)
    OverflowCheck(store).check(grads, sq_norms)
                                     refuse a push whose step would overflow a parameter
    step_stays_finite(store, name, grad)
                                     one gradient's check, by norms, else exactly (a rule
                                     that changes a gradient uses it too)

Every check raises ProtocolError before anything is booked or applied (docs/protocol.md
section 9: an error changes nothing). That a live worker id answers only to the client
that registered it is the registry's check (WorkerState.check_owner).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from minips.protocol.wire import ProtocolError, all_finite, sum_of_squares

if TYPE_CHECKING:
    from minips.protocol.auth import ServerKeys
    from minips.server.registry import Origin
    from minips.server.store import ParameterStore

MAX_INFO_BYTES = 1024  # a hello's `info`, packed (docs/protocol.md 10)
MAX_INFO_DEPTH = 4  # maps and lists inside `info`, counting `info` itself


def depth(value: Any, limit: int) -> int:
    """Nesting depth of maps and lists (a scalar is 0), counted no further than limit + 1.

    Iterative, so a hostile 1,000-level value cannot exhaust Python's recursion limit.
    """
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        deepest = max(deepest, level)
        if level > limit:
            return level
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children)
    return deepest


def check_info(info: dict[str, Any]) -> None:
    """hello's `info` must be small and shallow (`too_large` otherwise)."""
    if depth(info, MAX_INFO_DEPTH) > MAX_INFO_DEPTH:
        raise ProtocolError(f"hello info nests deeper than {MAX_INFO_DEPTH} levels", "too_large")
    size = len(msgpack.packb(info))
    if size > MAX_INFO_BYTES:
        raise ProtocolError(
            f"hello info of {size} bytes exceeds the limit of {MAX_INFO_BYTES}", "too_large"
        )
    role = info.get("role")
    if role is not None and not isinstance(role, str):
        raise ProtocolError("hello info field 'role' must be a string", "bad_field")


def require_operator(origin: Origin, keys: ServerKeys | None) -> None:
    """Under CURVE only an operator key may stop or checkpoint (error `operator`)."""
    if keys is not None and origin.key not in keys.operators:
        raise ProtocolError("only an operator key may stop or checkpoint the server", "operator")


def clip_gradients(grads: dict[str, np.ndarray], max_norm: float) -> dict[str, np.ndarray]:
    """Scale a push's gradients together so their global L2 norm is at most `max_norm`.

    g <- g * min(1, max_norm / ||g||), ||g|| over every array of the push (Pascanu et al.,
    "On the difficulty of training recurrent neural networks", ICML 2013). 0: no clipping.
    """
    if not max_norm:
        return grads
    norm = float(np.sqrt(sum(float(np.dot(g.reshape(-1), g.reshape(-1))) for g in grads.values())))
    if norm <= max_norm:
        return grads
    factor = np.float32(max_norm / norm)
    return {name: g * factor for name, g in grads.items()}


class OverflowCheck:
    """`nonfinite` when applying a push's gradients as one full step would make a parameter
    non-finite, checked before the push is accepted (`check`); `carry` after each update.

    The step is the optimizer's (minips.server.store.SGD): v' = m v + (g + wd w), w' = w - lr v'
    (v' = g + wd w without momentum). Finite gradients can still overflow: 3e38 twice makes
    a weight -inf. Cheap first: every |w'_i| <= ||w|| + lr (m ||v|| + ||g|| + wd ||w||), so
    when that is below float32's maximum no entry can overflow; only past it is the step
    computed into temporaries and checked exactly. Nothing is changed either way.

    The norms cost no pass over the arrays on the way of a push: ||g|| is what the wire's
    finiteness check measured (wire.decode_request, Message.sq_norms), and ||w||, ||v|| are
    upper bounds carried from version to version by the triangle inequality
    (SGD.norm_bounds_after), measured exactly only for a version the check has not seen
    carried (the first push, a version past RETIGHTEN). A bound holds for one array object,
    the parameter's version it was computed for: the store publishes each version as a new
    array (minips.server.store), so a bound is never mistaken for another version's.
    """

    def __init__(self, store: ParameterStore) -> None:
        self.store = store
        self._bounds: dict[str, tuple[np.ndarray, float, float]] = {}  # name -> (w, |w|, |v|)
        self._checked: dict[str, tuple[np.ndarray, float]] = {}  # name -> (g, ||g||^2 bound)

    def check(self, grads: dict[str, np.ndarray], sq_norms: dict[str, float]) -> None:
        """Refuse `grads` (name -> float32, the parameter's shape) if a step could overflow.

        sq_norms: name -> ||g||^2 where known (the wire measured it); an upper bound is
        enough, so a gradient clipped since may keep its norm from before.
        """
        opt = self.store.optimizer
        with np.errstate(over="ignore", invalid="ignore"):
            for name, grad in grads.items():
                sq_g = sq_norms[name] if name in sq_norms else sum_of_squares(grad)
                self._checked[name] = (grad, sq_g)
                norm_w, norm_v = self.norm_bounds(name)
                step = opt.momentum * norm_v + math.sqrt(sq_g) + opt.weight_decay * norm_w
                if norm_w + opt.lr * step < FLOAT32_SAFE:  # False for NaN (0 * inf) too
                    continue
                if not step_stays_finite(self.store, name, grad):
                    raise ProtocolError(
                        f"gradient {name!r} would make the parameter non-finite", "nonfinite"
                    )

    def carry(self, steps: list[tuple[str, np.ndarray, float]]) -> None:
        """After the store wrote an update's `steps` [(name, grad, scale)]: the bounds of
        each new version, from those of the version it replaced and ||grad|| (measured by
        `check` when the step's gradient is a checked push's own array, else now)."""
        params = self.store.params
        for name, grad, scale in steps:
            replaced = self._bounds.get(name)
            if replaced is None:
                continue  # measured when a push for it is next checked
            checked = self._checked.get(name)
            sq_g = checked[1] if checked and checked[0] is grad else sum_of_squares(grad)
            bounds = self.store.optimizer.norm_bounds_after(
                replaced[1], replaced[2], math.sqrt(sq_g), scale
            )
            self._bounds[name] = (params[name], *bounds)

    def norm_bounds(self, name: str) -> tuple[float, float]:
        """Upper bounds on ||w|| and ||v|| (its momentum buffer; 0 without) of parameter
        `name` at its current version: carried, or measured exactly (inf: overflowed)."""
        array, cached = self.store.params[name], self._bounds.get(name)
        if cached is not None and cached[0] is array and cached[1] <= RETIGHTEN:
            return cached[1], cached[2]
        velocity = self.store.optimizer.velocity.get(name)
        sq_v = 0.0 if velocity is None else sum_of_squares(velocity)
        bounds = math.sqrt(sum_of_squares(array)), math.sqrt(sq_v)
        self._bounds[name] = (array, *bounds)
        return bounds


def step_stays_finite(store: ParameterStore, name: str, grad: np.ndarray) -> bool:
    """True when the optimizer's step of `grad` leaves parameter `name` finite (nothing
    changed). The norms first, BLAS passes without temporaries:
    ||w|| + lr (momentum ||v|| + ||g|| + weight_decay ||w||) < FLOAT32_SAFE bounds every
    entry of the new w; only when they cannot tell, the step computed into temporaries."""
    opt, weight = store.optimizer, store.params[name]
    velocity = opt.velocity.get(name) if opt.momentum else None
    norm_w = math.sqrt(sum_of_squares(weight))
    norm_v = 0.0 if velocity is None else math.sqrt(sum_of_squares(velocity))
    step = opt.momentum * norm_v + math.sqrt(sum_of_squares(grad)) + opt.weight_decay * norm_w
    if norm_w + opt.lr * step < FLOAT32_SAFE:  # False for NaN (0 * inf) too
        return True
    step = grad + opt.weight_decay * weight if opt.weight_decay else grad
    if velocity is not None:
        step = opt.momentum * velocity + step
    with np.errstate(over="ignore", invalid="ignore"):
        return all_finite(weight - np.float32(opt.lr) * step)


FLOAT32_SAFE = 1e38  # below float32's largest finite value, 3.4e38, with room for rounding
# Carried bounds only grow (the triangle inequality); past this they are measured again,
# far below float32's 3.4e38, where the check needs them tight.
RETIGHTEN = 1e30
