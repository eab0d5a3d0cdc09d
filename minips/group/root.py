"""The client's side of server groups (minips.worker.session.GroupSide): what a PSClient
whose hello or operator's request reached a group's root asks for (docs/protocol.md
16.3-16.4, 16.7). A first hello that meets a group is finished here (the wait while the
group assembles, the pointer from a shard to its root); then every worker call goes to the
GroupClient `join` returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from minips.group.agreements import GROUP_ERROR, HELLO_RETRY, reach
from minips.group.fanout import GroupClient
from minips.protocol.wire import Message
from minips.worker.replies import ServerError

# `client` below is the PSClient that reached the group (not imported: it imports this).
PSClient = Any

log = logging.getLogger("minips.client")


class ServerGroups:
    """PSClient's default `groups`: a GroupClient for each (it holds the group's state)."""

    def root_hello(
        self, client: PSClient, header: dict[str, Any], reply: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The root's reply to the client's hello `header`, from the first `reply`. None: the
        root answered `group`, its group still assembling: ask again every HELLO_RETRY s
        for at most the client's `assemble_timeout` s. A shard that is not the root sends
        us on to the root (the client's address becomes the root's)."""
        deadline = time.monotonic() + client.assemble_timeout
        while reply is None or _shard(reply) != 0:
            if reply is None:
                time.sleep(HELLO_RETRY)
            else:
                client._close_socket()
                client.address = reach(reply["group"]["addresses"][0], client.address)
                log.info("shard %d is not the group's root: asking %s", _shard(reply),
                         client.address)  # fmt: skip
            try:
                reply = client._request(header).header
            except ServerError as exc:
                if exc.code != GROUP_ERROR or time.monotonic() > deadline:
                    raise
                reply = None
        return reply

    def join(
        self, client: PSClient, root_reply: dict[str, Any], info: dict[str, Any]
    ) -> GroupClient:
        """The group behind the root's hello reply, every other shard said hello to (16.4)."""
        group = GroupClient(client, root_reply["group"])
        group.join(root_reply, info)
        return group

    def others(
        self, client: PSClient, header: dict[str, Any], group: Mapping[str, Any]
    ) -> dict[int, Message]:
        """An operator's `header` to every shard but the root that has joined (16.7). The
        client keeps the shards reached (`_shards`, closed with it) while the root lists
        the same ones (joins happen while a group starts)."""
        client._shards = GroupClient.refreshed(client._shards, client, group)
        return client._shards.others(header)


def _shard(reply: dict[str, Any]) -> int:
    """The shard that sent a hello reply (a plain server's reply: 0, as a root's)."""
    return int((reply.get("group") or {}).get("shard", 0))


GROUPS = ServerGroups()
