"""The client's side of server groups (minips.worker.session.GroupSide): what a PSClient
whose hello or operator's request reached a group's root asks for (docs/protocol.md 16.4,
16.7). PSClient finds the first hello's root itself (minips.worker.first_contact) and
then hands every worker call to the GroupClient `join` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minips.group.fanout import GroupClient

# `client` below is the PSClient that reached the group (not imported: it imports this).
PSClient = Any


class ServerGroups:
    """PSClient's default `groups`: a GroupClient for each (it holds the group's state)."""

    def join(
        self, client: PSClient, root_reply: dict[str, Any], info: dict[str, Any]
    ) -> GroupClient:
        """The group behind the root's hello reply, every other shard said hello to (16.4)."""
        group = GroupClient(client, root_reply["group"])
        group.join(root_reply, info)
        return group

    def shards(
        self, client: PSClient, known: GroupClient | None, group: Mapping[str, Any]
    ) -> GroupClient:
        """The shards an operator reaches: `known` while the root lists the same ones
        (joins happen while a group starts), else new ones."""
        return GroupClient.refreshed(known, client, group)


GROUPS = ServerGroups()
