"""The requests a server answers beside training: `stats` (anyone's), `stop` and `checkpoint`
(an operator's; docs/protocol.md 5.5, 5.7, 5.8), and `join`, refused by a server not in a group.

The operations add them to the server's `handlers` table (`ops.handlers(server)`, called
once the server's outbox exists); a shard's role replaces `join` with its own
(group/shard.py). The checks of who may stop a server or ask it for a checkpoint
(`check_operator`: under CURVE an operator's key) come with them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from minips.protocol.wire import ProtocolError

if TYPE_CHECKING:
    from minips.protocol.wire import Message
    from minips.rules import Outcome
    from minips.server.router import Envelope
    from minips.server.seams import GroupRole
    from minips.state.requests import Origin

Handler = Callable[["Envelope", "Message"], "Outcome | None"]


class OperatorRequests:
    """The handlers of `stats`, `stop`, `checkpoint` and `join` for `server` (a
    ParameterServer: its outbox, stop, store, group, stats and its operations' checkpoint);
    `check_operator(origin)` refuses a `stop` or a `checkpoint` from anyone else."""

    def __init__(self, server: Any, check_operator: Callable[[Origin], None]) -> None:
        self.server, self.check_operator = server, check_operator

    def handlers(self) -> dict[str, Handler]:
        """op -> handler(envelope, request), for the server's `handlers` table."""
        return {"stats": self.handle_stats, "stop": self.handle_stop,
                "checkpoint": self.handle_checkpoint, "join": refuse_join}  # fmt: skip

    def handle_stats(self, envelope: Envelope, request: Message) -> None:
        self.server.outbox.reply(envelope, {"op": "stats", "stats": self.server.stats()})

    def handle_stop(self, envelope: Envelope, request: Message) -> None:
        self.check_operator(envelope.origin)  # an operator's key
        server = self.server
        server.stop.request("an operator asked")
        server.begin_stop()
        server.outbox.reply(envelope, {"op": "stop", **operator_fields(server.group)})

    def handle_checkpoint(self, envelope: Envelope, request: Message) -> None:
        self.check_operator(envelope.origin)  # an operator's key
        server = self.server
        path, version = server.ops.checkpoint(), server.store.version
        server.outbox.reply(envelope, {"op": "checkpoint", "path": str(path), "version": version,
                                       **operator_fields(server.group)})  # fmt: skip


def operator_fields(group: GroupRole | None) -> dict[str, Any]:
    """What a root adds to its replies to `stop` and `checkpoint`: where its shards are
    (docs/protocol.md 16.7); nothing for any other server."""
    return {"group": group.group()} if group is not None and group.is_root else {}


def refuse_join(envelope: Envelope, request: Message) -> None:
    """`join` to a server that is not in a group (docs/protocol.md 16.3)."""
    raise ProtocolError("op 'join' is not a request", "unknown_op")
