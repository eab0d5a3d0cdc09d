"""What the shards of a server group and their clients agree on (docs/protocol.md 16),
besides the partition itself (partition.py) and VSGD's samples per slice (sampling.py):
the `group` map of a hello reply, how an advertised address is reached, the timers of
joining.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from minips.worker import client as _client

JOIN_INTERVAL = 1.0  # seconds between a shard's joins (its heartbeat to the root)
JOIN_TAKEOVER = 3.0  # a shard that joined with an address holds its index this long after
JOIN_RESERVE = 10.0  # an address-less join holds its index this long (the asker builds)
JOIN_PATIENCE = JOIN_RESERVE + 2 * JOIN_INTERVAL  # a shard refused `full` asks this long
ROOT_TIMEOUT = 15.0  # a shard whose root answers no join this long stops (16.7)
HELLO_RETRY = 0.5  # seconds between a client's hellos while the group is incomplete
ASSEMBLE_TIMEOUT = _client.ASSEMBLE_TIMEOUT  # the reference client waits for a group, a shard too
GROUP_ERROR = "group"  # the root's error code for a hello before the group is complete

_WILDCARD_HOSTS = ("*", "0.0.0.0", "[::]", "::")
_TCP = re.compile(r"^tcp://(\[[^\]]*\]|[^:/]*):(\d+|\*)$")


def group_map(shard: int, servers: int, addresses: Sequence[str | None]) -> dict[str, Any]:
    """The `group` key of a shard's hello reply (and of the root's stats): 16.4."""
    return {"shard": shard, "servers": servers, "addresses": list(addresses)}


def reach(advertised: str, root: str) -> str:
    """The address a client connects to for a shard that advertised `advertised`, having
    reached the root at `root`: a wildcard host (* 0.0.0.0 [::]) becomes the root's host."""
    shard, via = _TCP.match(advertised), _TCP.match(root)
    if shard is None or via is None or shard.group(1) not in _WILDCARD_HOSTS:
        return advertised
    return f"tcp://{via.group(1)}:{shard.group(2)}"


def check_shard_hello(reply: dict[str, Any], root: dict[str, Any], shard: int) -> str | None:
    """Why shard `shard`'s hello reply does not belong to the root's group (None: it does)."""
    group = reply.get("group")
    if not isinstance(group, Mapping):
        return f"answered with group {str(group)[:60]}, not a map"
    if group.get("shard") != shard or group.get("servers") != root["group"]["servers"]:
        return f"answered as shard {group.get('shard')} of {group.get('servers')}"
    if reply.get("rank") != root.get("rank"):  # world_size may differ: 16.4, the root's counts
        return f"gave rank {reply.get('rank')}, the root {root.get('rank')}"
    return None
