"""What the server holds of a request besides the push itself: who sent it (`Origin`), a
pull answered later (`HeldPull`), and the checks of who sent it: a hello's connection is
the client's own, its `info` small and shallow (so `stats` always encodes), `stop` and
`checkpoint` an operator's (under CURVE). Booked per worker in minips.state.registry
(beside `Push`, which names its worker). Each check raises ProtocolError and changes
nothing (docs/protocol.md 9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from minips.protocol.wire import ProtocolError

if TYPE_CHECKING:
    from minips.protocol.auth import ServerKeys


@dataclass(frozen=True)
class Origin:
    """Who sent a request: the connection's routing id and, under CURVE, its public key."""

    routing_id: bytes
    key: bytes | None = None


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


def require_operator(origin: Origin, keys: ServerKeys | None) -> None:
    """Under CURVE only an operator key may stop or checkpoint (error `operator`)."""
    if keys is not None and origin.key not in keys.operators:
        raise ProtocolError("only an operator key may stop or checkpoint the server", "operator")


@dataclass(eq=False)
class HeldPull:
    """A pull the server answers later: where the reply goes, and the puller's `since`.

    push_reply: for the pull half of a fused push + pull, the push's answer, sent together
    with the parameters in one reply.
    """

    reply_to: Any  # the server loop's Envelope
    since: int | None
    push_reply: dict[str, Any] | None = None
