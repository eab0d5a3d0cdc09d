"""What PSClient's calls go to, chosen once at hello: one server or a server group.

    PSClient.hello() --reply without `group`--> OneServer (below): one
                                                 request on the client's own socket
                     --reply with `group`-----> the group's Session (minips.group.fanout:
                                                 one request per shard, all at once)

Both are a `Session`; PSClient hands each worker call to its session, so neither request
path asks which one it is in. Hello and an operator's requests go through the client's
`groups` (a `GroupSide`): OneServerOnly below, or minips.group.root.GROUPS, given by
whoever builds a client that may meet a group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from minips.errors import ConfigError
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
    """How a PSClient's hello and operator's requests reach what answers them: one server
    (`OneServerOnly`, a client's when it is given none) or also a server group
    (minips.group.root.GROUPS)."""

    def hello(self, client: Any, header: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        """The reply to the client's hello `header` (its `info` for every shard), which
        chooses the client's session: a group's reply makes it the group's (16.3-16.4)."""

    def operator(
        self, client: Any, header: dict[str, Any], body: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[int, Message]]:
        """An operator's request (stats, stop, checkpoint) through the client's session:
        (`body` of the root's reply, every shard's reply by index: {} for a plain server)."""


def first_reply(client: PSClient, header: dict[str, Any]) -> dict[str, Any] | None:
    """The reply to the client's hello `header`; None when a group's root answered `group`
    (its shards not all joined yet, 16.3)."""
    try:
        return client._request(header).header
    except ServerError as exc:
        if exc.code != "group":
            raise
        return None


class OneServerOnly:
    """A client's hello and operator's requests to one server: a client given no `groups`
    says so, in one line, when it meets a server group (docs/protocol.md 16); whoever
    builds a client that may meet one gives it minips.group.root.GROUPS (`minips worker`,
    the launcher, the dashboard)."""

    def hello(self, client: PSClient, header: dict[str, Any], info: dict[str, Any]) -> dict:
        """One server's reply to the client's hello `header`; ConfigError for a group's."""
        reply = first_reply(client, header)
        if reply is None or "group" in reply:
            raise self.refused(client)
        return reply

    def operator(
        self, client: PSClient, header: dict[str, Any], body: Callable[[dict[str, Any]], dict]
    ) -> tuple[dict[str, Any], dict[int, Message]]:
        """(`body` of one server's reply to an operator's `header`, {}); ConfigError when it
        is the root of a group of several shards (which the request then reached alone)."""
        with client._lock:
            replies = client.session.operator(header)
        answer = body(replies[0].header)
        group = answer.get("group")
        if group is not None and group["servers"] > 1:  # a group of one is all here
            raise self.refused(client)
        return answer, ({} if group is None else replies)

    def refused(self, client: PSClient) -> ConfigError:
        """The one line saying that the client needs `groups` to reach this server."""
        return ConfigError(
            f"the server at {client.address} belongs to a server group (docs/protocol.md 16): "
            "build the client with groups=minips.group.root.GROUPS to reach it"
        )


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
