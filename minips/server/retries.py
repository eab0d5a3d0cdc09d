"""Exactly once: a push whose `seq` is not new is a retry, answered from memory, never applied
again (docs/protocol.md 8).

A client that lost a reply sends the same push again, from a new socket (Lazy Pirate). The
worker's registry entry tells what that `seq` is (`WorkerState.seen_push`): still held, the
answer goes to the retry when it comes; answered, the same answer is sent again (a fused
push's pull half answered afresh); failed or older than the last answers kept, refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    (`WorkerState.check_retry`)."""
    seq = header["seq"]
    seen = worker.check_retry(seq)
    if seen == "held":  # still waiting (at a barrier, say): the answer goes to the retry
        worker.held_pushes[seq].reply_to = envelope
    elif "pull_since" in header:  # the same answer, the pull afresh
        pulls.hold(worker, HeldPull(envelope, header["pull_since"], worker.answered[seq]))
    else:
        outbox.reply(envelope, worker.answered[seq], worker=worker)
