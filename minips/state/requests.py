"""What the server holds of a request besides the push itself: who sent it (`Origin`), a
pull answered later (`HeldPull`), and the check that a hello's connection is the client's
own. Booked per worker in minips.state.registry (beside `Push`, which names its worker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minips.protocol.wire import ProtocolError


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


@dataclass(eq=False)
class HeldPull:
    """A pull the server answers later: where the reply goes, and the puller's `since`.

    push_reply: for the pull half of a fused push + pull, the push's answer, sent together
    with the parameters in one reply.
    """

    reply_to: Any  # the server loop's Envelope
    since: int | None
    push_reply: dict[str, Any] | None = None
