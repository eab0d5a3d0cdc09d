"""What PSClient's calls go to, chosen once at hello: one server or a server group.

    PSClient.hello() --reply without `group`--> OneServer (below): one
                                                 request on the client's own socket
                     --reply with `group`-----> the group's Session (minips.group.fanout:
                                                 one request per shard, all at once)

Both are a `Session`; PSClient hands each worker call to its session, so neither request
path asks which one it is in. The group's side reaches the client through `GroupSide`,
given to PSClient (or found when a server first turns out to be a group).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from minips.protocol import wire
from minips.protocol.wire import Message
from minips.transmission.codecs import Gradient, Spec
from minips.worker.replies import PullReply, PushReply, ServerError, pull_reply

# `client` below is the PSClient whose calls these are (not imported: it imports this).
PSClient = Any

NO_PULL = object()  # push() without its pull half


def fused_pull(pull_since: Any) -> tuple[Any, bool]:
    """push()'s pull_since as (the version to pull since or None, whether to pull at all)."""
    fused = pull_since is not NO_PULL
    return (pull_since if fused else None), fused


def identified(header: dict[str, Any]) -> dict[str, Any]:
    """A hello says that this client sets its own routing id on every socket: the server
    then refuses a hello that an abandoned socket left queued (docs/protocol.md 15), so a
    retry and the socket it gave up on are never two owners of the worker id."""
    return {**header, "own_routing_id": True} if header.get("op") == "hello" else header


def push_header(
    worker_id: str,
    seq: int,
    base: int,
    last: bool,
    samples: int | None,
    loss: float | None,
    pull_since: Any,
) -> dict[str, Any]:
    """A push's header (docs/protocol.md 5.3): the optional fields only when given."""
    header = {"op": "push", "worker": worker_id, "seq": seq, "base": base, "last": last}
    optional = {"samples": samples, "loss": loss}
    header.update({key: value for key, value in optional.items() if value is not None})
    if pull_since is not NO_PULL:  # a fused push + pull (None: pull everything)
        header["pull_since"] = pull_since
    return header


class Session(Protocol):
    """A worker's calls to what hello found; PSClient.push's arguments (pull_since may be
    NO_PULL) and PSClient's other calls, each under the client's lock."""

    def pull(self, since: Any) -> PullReply: ...

    def push(
        self,
        grads: Mapping[str, Gradient],
        base: Any,
        extra: dict[str, np.ndarray] | None,
        last: bool,
        codecs: Mapping[str, Spec] | None,
        samples: int | None,
        pull_since: Any,
        loss: float | None,
    ) -> PushReply: ...

    def ping(self) -> bool:
        """The heartbeat; the `stop` flag."""

    def bye(self, header: dict[str, Any]) -> None:
        """Say `header` (a bye) everywhere; an error reply raises ServerError."""

    def operator(self, header: dict[str, Any]) -> dict[int, Message]:
        """An operator's request; the replies by shard (one server: {0: its reply})."""

    def bytes_sent(self) -> dict[str, int]:
        """Array bytes pushed so far per parameter and per "extra/<key>"."""

    def close(self) -> None: ...


class GroupSide(Protocol):
    """How a PSClient reaches a server group (minips.group.root.GROUPS)."""

    def root_hello(
        self, client: Any, header: dict[str, Any], reply: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The group root's reply to `header` (the client's hello), whose first `reply` named
        a group (None: the root answered `group`, still assembling; 16.3-16.4)."""

    def join(self, client: Any, root_reply: dict[str, Any], info: dict[str, Any]) -> Session:
        """The group's session for `client`, whose hello the root answered `root_reply`:
        hello to every other shard (docs/protocol.md 16.4)."""

    def others(
        self, client: Any, header: dict[str, Any], group: Mapping[str, Any]
    ) -> dict[int, Message]:
        """An operator's `header` to every shard but the root that has joined, where the
        root's reply lists them in `group` (16.7); one that does not answer is left out."""


def hello_and_choose(client: PSClient, header: dict[str, Any], info: dict[str, Any]) -> Any:
    """The reply to the client's hello `header`, which chooses its session: a plain
    server's reply keeps OneServer; one naming a group (or the root's `group` error, its
    shards not all joined: 16.3) is the group's side's to finish, which gives the group's
    session (16.4)."""
    try:
        reply: dict[str, Any] | None = client._request(header).header
    except ServerError as exc:
        if exc.code != "group":
            raise
        reply = None
    if reply is None or "group" in reply:
        from minips.worker.client import group_side  # the client's module imports this one

        groups = group_side(client)
        reply = groups.root_hello(client, header, reply)  # the group's root, assembled
        client._close_socket()  # the group's own connection to the root takes our id over
        client.session = client.group = groups.join(client, reply, info)
    return reply


def operator_request(
    client: PSClient, header: dict[str, Any], body: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[dict[str, Any], dict[int, Message]]:
    """An operator's request (stats, stop, checkpoint) through the client's session.
    Returns (`body` of the root's reply, every shard's reply by index: {} for a plain
    server). A group's root the client did not say hello to answers alone, with where its
    shards are: the request goes on to every other one that has joined (16.7)."""
    with client._lock:
        replies = client.session.operator(header)
        answer = body(replies[0].header)
        group = answer.get("group")
        if group is None:
            return answer, {}
        if len(replies) < group["servers"]:  # the root alone: on to its shards
            from minips.worker.client import group_side  # the client's module imports this one

            replies.update(group_side(client).others(client, header, group))
        return answer, replies


class OneServer:
    """The worker calls to one server, each one request on the client's socket (a
    `Session`, minips.worker.session); the client's Encoder keeps the codec state."""

    def __init__(self, client: PSClient) -> None:
        self.client = client

    def pull(self, since: int | None) -> PullReply:
        header = {"op": "pull", "worker": self.client.worker_id, "since": since}
        return pull_reply(self.client._worker_request(header))

    def push(
        self,
        grads: Mapping[str, Gradient],
        base: int,
        extra: dict[str, np.ndarray] | None,
        last: bool,
        codecs: Mapping[str, Spec] | None,
        samples: int | None,
        pull_since: Any,
        loss: float | None,
    ) -> PushReply:
        """PSClient.push to one server: every gradient by its codec, one request."""
        client = self.client
        extras = [wire.WirePart(f"extra/{key}", a) for key, a in (extra or {}).items()]
        parts = client.encoder.encode(grads, codecs)  # counts each parameter's bytes
        client.encoder.count(extras)
        seq = client.next_seq()  # the next push is new even if this one fails
        header = push_header(client.worker_id, seq, base, last, samples, loss, pull_since)
        h = (message := client._worker_request(header, parts + extras)).header
        pulled = pull_reply(message) if "param_versions" in h else None
        return PushReply(h["version"], h["applied"], h["staleness"], h["stop"], pulled)

    def ping(self) -> bool:
        header = {"op": "ping", "worker": self.client.worker_id}
        return self.client._worker_request(header).header["stop"]

    def bye(self, header: dict[str, Any]) -> None:
        self.client._request(header)

    def operator(self, header: dict[str, Any]) -> dict[int, Message]:
        return {0: self.client._request(header)}

    def bytes_sent(self) -> dict[str, int]:
        return dict(self.client.encoder.bytes_sent)

    def close(self) -> None:
        """Nothing of its own: the socket is the client's."""
