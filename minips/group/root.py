"""The client's side of server groups (minips.worker.session.GroupSide): a PSClient's hello
and operator's requests when it may meet a group (docs/protocol.md 16.3-16.4, 16.7). A first
hello that meets a group is finished here (the wait while the group assembles, the pointer
from a shard to its root); then every worker call goes to the GroupClient it chose. An
operator's request to a root the client did not say hello to goes on to every other shard.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from minips.group.agreements import GROUP_ERROR, HELLO_RETRY, reach
from minips.group.fanout import GroupClient
from minips.group.group_checks import checked_group
from minips.protocol.wire import Message
from minips.worker.replies import ServerError
from minips.worker.session import first_reply

# `client` below is the PSClient that reached the group (not imported: it imports this).
PSClient = Any

log = logging.getLogger("minips.client")


class ServerGroups:
    """The `groups` of a PSClient that may meet a server group: a GroupClient for each (it
    holds the group's state)."""

    def hello(self, client: PSClient, header: dict[str, Any], info: dict[str, Any]) -> dict:
        """The reply to the client's hello `header`, which chooses its session: a plain
        server's reply keeps OneServer; one naming a group (or the root's `group` error, its
        shards not all joined: 16.3) is finished here, and the group's session is the
        client's (16.4)."""
        reply = first_reply(client, header)
        if reply is None or "group" in reply:
            first = None if reply is None else checked_group(reply)  # before any address is used
            reply = self.root_hello(client, header, first)  # the group's root, assembled
            client._close_socket()  # the group's own connection to the root takes our id over
            client.session = client.group = self.join(client, reply, info)
        return reply

    def operator(
        self, client: PSClient, header: dict[str, Any], body: Callable[[dict[str, Any]], dict]
    ) -> tuple[dict[str, Any], dict[int, Message]]:
        """An operator's request through the client's session: (`body` of the root's reply,
        every shard's reply by index: {} for a plain server). A group's root the client did
        not say hello to answers alone, with where its shards are: the request goes on to
        every other one that has joined (16.7)."""
        with client._lock:
            replies = client.session.operator(header)
            answer = body(replies[0].header)
            if answer.get("group") is None:
                return answer, {}
            group = checked_group(answer, replies[0].header.get("op", "reply"))["group"]
            if len(replies) < group["servers"]:  # the root alone: on to its shards
                replies.update(self.others(client, header, group))
            return answer, replies

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
                reply = checked_group(client._request(header).header)
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
