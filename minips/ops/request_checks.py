"""What the server refuses from a client it cannot trust: checks that change nothing.

    check_info(info)                 hello's `info`: at most MAX_INFO_BYTES packed and
                                     MAX_INFO_DEPTH levels deep, so `stats` always encodes
    require_operator(origin, keys)   `stop` and `checkpoint` need an operator key (CURVE)
    clip_gradients(grads, max_norm)  the optional --clip-norm: g <- g * min(1, c / ||g||)
    OverflowCheck, step_stays_finite  no update writes a non-finite value: its own module,
                                     minips.ops.overflow (re-exported here)

Every check raises ProtocolError before anything is booked or applied (docs/protocol.md
section 9: an error changes nothing). That a live worker id answers only to the client
that registered it is the registry's check (WorkerState.check_owner).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from minips.ops.overflow import OverflowCheck, step_stays_finite
from minips.protocol.wire import ProtocolError

__all__ = ["OverflowCheck", "check_info", "clip_gradients", "require_operator",
           "step_stays_finite"]  # fmt: skip

if TYPE_CHECKING:
    from minips.protocol.auth import ServerKeys
    from minips.state.requests import Origin

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
