"""What the server refuses from a client it cannot trust, and the optional clipping.

    check_push_fits(store, base, grads, closes_step)
                                     a push's base is no newer than t, its gradients
                                     name parameters of the model, with their shapes,
                                     as float32: part of the named point `check_push`
    clip_gradients(grads, max_norm)  the optional --clip-norm: g <- g * min(1, c / ||g||)
    check_hello_connection(header, origin), check_info(info)
                                     a hello's connection is the client's own (not one
                                     it abandoned), its `info` small and shallow (so
                                     `stats` always encodes): the named point
                                     `check_hello`
    require_operator(origin, keys)   `stop` and `checkpoint` need an operator key (under
                                     CURVE): `ServerOps.check_operator` (kept
                                     beside Origin, minips.state.requests, where a
                                     group's root asks it of a `join` too)
    OverflowCheck, step_stays_finite  no update writes a non-finite value: its own module,
                                     minips.ops.overflow (all re-exported here)

Every check raises ProtocolError before anything is booked or applied (docs/protocol.md
section 9: an error changes nothing). That a live worker id answers only to the client
that registered it is the registry's check (WorkerState.check_owner).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from minips.guard.curve import require_operator
from minips.ops.overflow import OverflowCheck, step_stays_finite
from minips.protocol.wire import ProtocolError

if TYPE_CHECKING:
    from minips.state.requests import Origin
    from minips.state.store import ParameterStore

__all__ = ["MAX_INFO_BYTES", "MAX_INFO_DEPTH", "OverflowCheck", "check_hello_connection",
           "check_info", "check_push_fits", "clip_gradients", "depth", "require_operator",
           "step_stays_finite"]  # fmt: skip


def check_push_fits(
    store: ParameterStore, base: int, grads: dict[str, np.ndarray], closes_step: bool = False
) -> None:
    """Check a push's `base` and decoded gradients against the store's parameters.

    closes_step: the worker has pushes of its step kept (`last: false`), or the server
    is stopping (it keeps none), so this one may carry no gradient: a shard of a group
    closes a step so (docs/protocol.md 16.5).
    Raises ProtocolError (`bad_base`, `unknown_param`, `shape`, `dtype`) and changes
    nothing: every check runs before any parameter is touched.
    """
    if base > store.version:
        raise ProtocolError(
            f"base {base} is newer than the server's version {store.version}", "bad_base"
        )
    if not grads and not closes_step:
        raise ProtocolError("a push must carry at least one gradient", "unknown_param")
    for name, grad in grads.items():
        param = store.params.get(name)
        if param is None:
            raise ProtocolError(f"gradient for unknown parameter {name!r}", "unknown_param")
        if grad.shape != param.shape:
            raise ProtocolError(
                f"gradient {name!r} has shape {list(grad.shape)}, "
                f"the parameter has {list(param.shape)}",
                "shape",
            )
        if grad.dtype != np.float32:
            raise ProtocolError(
                f"gradient {name!r} must be float32 (dense) or float16 (fp16), got {grad.dtype}",
                "dtype",
            )


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


def check_hello_connection(header: dict[str, Any], origin: Origin) -> None:
    """`not_owner` for a hello that says its client sets its own routing id on every socket
    (`own_routing_id`) but came on one ZeroMQ generated (a first byte of zero, which ZeroMQ
    keeps for itself): a connection the client abandoned (Lazy Pirate), renamed by the
    ROUTER's handover when the client's retry took its id over. Refused, it registers
    nothing, so it never owns the id its retry is asking for (docs/protocol.md 15)."""
    claim = header.get("own_routing_id")
    if claim is None:
        return
    if not isinstance(claim, bool):
        raise ProtocolError("hello field 'own_routing_id' must be a bool", "bad_field")
    if claim and origin.routing_id[:1] in (b"", b"\x00"):
        raise ProtocolError(
            "a hello from a connection this client abandoned (its retry owns the id)",
            "not_owner",
        )


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
