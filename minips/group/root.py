"""A client's requests to a server group's root (docs/protocol.md 16.3, 16.7): the first
hello, which waits while the group assembles and follows a shard's pointer to the root,
and an operator's requests (stats, stop, checkpoint), sent on to every shard.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from minips.group.fanout import GroupClient
from minips.protocol.group import GROUP_ERROR, HELLO_RETRY, reach
from minips.protocol.wire import Message
from minips.worker.replies import ServerError

# `client` below is the PSClient whose calls these are (not imported: it imports this).
PSClient = Any

log = logging.getLogger("minips.client")


def hello_root(client: PSClient, header: dict[str, Any]) -> dict[str, Any]:
    """The root's reply to the client's hello (docs/protocol.md 16.3-16.4). A root whose
    group is still assembling answers `group`: ask again every HELLO_RETRY s for at most
    the client's `assemble_timeout` s. A shard that is not the root sends us on to the
    root. A plain server's reply is returned as it came."""
    deadline = time.monotonic() + client.assemble_timeout
    while True:
        try:
            reply = client._request(header).header
        except ServerError as exc:
            if exc.code != GROUP_ERROR or time.monotonic() > deadline:
                raise
            time.sleep(HELLO_RETRY)
            continue
        group = reply.get("group")
        if group is None or group["shard"] == 0:
            return reply
        client._close_socket()
        client.address = reach(group["addresses"][0], client.address)
        log.info("shard %d is not the group's root: asking %s", group["shard"], client.address)


def operator_request(
    client: PSClient, header: dict[str, Any], body: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[dict[str, Any], dict[int, Message]]:
    """An operator's request (stats, stop, checkpoint) to the root, then to every other
    shard of its group that has joined: the root's reply says where they are (16.7).
    Returns (`body` of the root's reply, every shard's reply by index: {} for a plain
    server). A client that said hello to the group asks all its shards at once."""
    with client._lock:
        if client.group is not None:
            replies = client.group.each(header)
            return body(replies[0].header), replies
        root = client._request(header).header
        group = body(root).get("group")
        if group is None:
            return body(root), {}
        shards = client.operated = GroupClient.refreshed(client.operated, client, group)
        joined = [j for j in range(1, shards.servers) if shards.addresses[j]]
        others = shards.each(header, joined, tolerate=True)  # a shard may have stopped
        return body(root), {0: Message(root), **others}
