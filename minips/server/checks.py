"""What the server refuses from a client it cannot trust: checks that change nothing.

    check_info(info)                 hello's `info`: at most MAX_INFO_BYTES packed and
                                     MAX_INFO_DEPTH levels deep, so `stats` always encodes
    require_operator(origin, keys)   `stop` and `checkpoint` need an operator key (CURVE)
    clip_gradients(grads, max_norm)  the optional --clip-norm: g <- g * min(1, c / ||g||)
    check_stays_finite(store, grads, sq_norms)
                                     refuse a push whose step would overflow a parameter

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


def check_stays_finite(
    store: ParameterStore,
    grads: dict[str, np.ndarray],
    sq_norms: dict[str, float] | None = None,
) -> None:
    """`nonfinite` when applying `grads` as one full step would make a parameter non-finite.

    The step is the optimizer's (minips.server.store.SGD): v' = m v + (g + wd w), w' = w - lr v'
    (v' = g + wd w without momentum). Finite gradients can still overflow: 3e38 twice makes
    a weight -inf. Cheap first: every |w'_i| <= ||w|| + lr (m ||v|| + ||g|| + wd ||w||)
    (L2 norms, or upper bounds of them: the store carries bounds on ||w|| and ||v|| from
    update to update), so when that is below float32's maximum no entry can overflow;
    only past it is the step computed into temporaries and checked exactly.
    sq_norms: name -> ||g||^2 already known (wire.decode_request computes it while checking
    that the gradient is finite); an upper bound is enough, so a gradient clipped since
    may keep its norm from before. Nothing is changed either way.
    """
    opt, known = store.optimizer, sq_norms or {}
    with np.errstate(over="ignore", invalid="ignore"):
        for name, grad in grads.items():
            norm_g = math.sqrt(known[name]) if name in known else _norm(grad)
            norm_w, norm_v = store.norm_bounds(name)  # carried by the store, no pass
            bound = norm_w + opt.lr * (opt.momentum * norm_v + norm_g + opt.weight_decay * norm_w)
            if bound < FLOAT32_SAFE:
                continue
            weight = store.params[name]
            velocity = opt.velocity.get(name) if opt.momentum else None
            step = grad + opt.weight_decay * weight if opt.weight_decay else grad
            if velocity is not None:
                step = opt.momentum * velocity + step
            if not all_finite(weight - np.float32(opt.lr) * step):
                raise ProtocolError(
                    f"gradient {name!r} would make the parameter non-finite", "nonfinite"
                )


FLOAT32_SAFE = 1e38  # below float32's largest finite value, 3.4e38, with room for rounding


def _norm(array: np.ndarray) -> float:
    """The L2 norm (inf when it overflows), one BLAS pass."""
    return math.sqrt(sum_of_squares(array))
