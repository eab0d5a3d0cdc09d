"""What the server holds of a request besides the push itself: who sent it (`Origin`), and
a pull answered later (`HeldPull`). Booked per worker in minips.state.registry (beside
`Push`, which names its worker). The checks of who sent a request (a hello's connection
and `info`, an operator's key) are operations: the server's named point `check_hello`
(minips/server/seams.py) and the operations' own `stop` and `checkpoint` handlers
(minips/ops/request_checks.py, minips/ops/operator_requests.py);
`require_operator` stays beside `Origin`, which it reads, as a group's root asks it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from minips.protocol.wire import ProtocolError

if TYPE_CHECKING:
    from minips.protocol.auth import ServerKeys


@dataclass(frozen=True)
class Origin:
    """Who sent a request: the connection's routing id and, under CURVE, its public key."""

    routing_id: bytes
    key: bytes | None = None


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
