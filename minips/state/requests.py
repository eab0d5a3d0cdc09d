"""What the server holds of a request besides the push itself: who sent it (`Origin`), and
a pull answered later (`HeldPull`). Booked per worker in minips.state.registry (beside
`Push`, which names its worker). The checks of who sent a request (a hello's connection
and `info`, an operator's key) are operations: the server's named point `check_hello`
(minips/server/seams.py) and the operations' own `stop` and `checkpoint` handlers
(minips/ops/request_checks.py, minips/ops/operator_requests.py; an operator's key:
minips/guard/curve.py's `require_operator`, which a group's root asks too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Origin:
    """Who sent a request: the connection's routing id and, under CURVE, its public key."""

    routing_id: bytes
    key: bytes | None = None


@dataclass(eq=False)
class HeldPull:
    """A pull the server answers later: where the reply goes, and the puller's `since`.

    push_reply: for the pull half of a fused push + pull, the push's answer, sent together
    with the parameters in one reply.
    """

    reply_to: Any  # the server loop's Envelope
    since: int | None
    push_reply: dict[str, Any] | None = None
