"""Exactly once: a push whose `seq` is not new is a retry, answered from memory, never applied
again (docs/protocol.md 8).

A client that lost a reply sends the same push again, from a new socket (Lazy Pirate). The
worker's registry entry tells what that `seq` is (`WorkerState.seen_push`): still held, the
answer goes to the retry when it comes; answered, the same answer is sent again (a fused
push's pull half answered afresh); failed or older than the last answers kept, refused.
The server asks it at its named point `answer_retry` (minips/server/seams.py); what a
`seq` is stays the registry's, which holds the pushes and remembers their answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minips.protocol.wire import ProtocolError
from minips.state.requests import HeldPull

if TYPE_CHECKING:
    from minips.server.pulls import Pulls
    from minips.server.router import Envelope, Outbox
    from minips.state.registry import WorkerState


def answer_retry(
    worker: WorkerState, envelope: Envelope, header: dict[str, Any], pulls: Pulls, outbox: Outbox
) -> None:
    """Answer the retried push `header` of `worker` at `envelope` as its first attempt was or
    will be. One whose handling failed gets its error again; an older one is `stale_seq`
    (`check_retry`)."""
    seq = header["seq"]
    seen = check_retry(worker, seq)
    if seen == "held":  # still waiting (at a barrier, say): the answer goes to the retry
        worker.held_pushes[seq].reply_to = envelope
    elif "pull_since" in header:  # the same answer, the pull afresh
        pulls.hold(worker, HeldPull(envelope, header["pull_since"], worker.answered[seq]))
    else:
        outbox.reply(envelope, worker.answered[seq], worker=worker)


def check_retry(worker: WorkerState, seq: int) -> str:
    """What a retried `seq` of `worker` is, "held" or "answered"; one whose first attempt
    failed is refused with that error again, one neither held nor answered with `stale_seq`."""
    seen = worker.seen_push(seq)
    if seen == "failed":
        raise ProtocolError(worker.answered[seq]["reason"], worker.answered[seq]["code"])
    if seen == "stale":
        raise ProtocolError(
            f"push seq {seq} is older than this worker's last push ({worker.highest_seq})",
            "stale_seq",
        )
    return seen
