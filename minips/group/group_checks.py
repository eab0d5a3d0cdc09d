"""A reply's `group` (docs/protocol.md 16.4, 16.7) checked before a client connects to any
address it names: the server may be another implementation, or a hostile one, and a field
of the wrong form would otherwise end the client in a traceback, or send it to connect to
whatever the field holds.

    checked_group(reply)            # a hello reply; ProtocolError `malformed`, one line
    checked_group(reply, "stats")   # an operator's reply (stats, stop, checkpoint)

The reply's other fields are checked where a worker reads them (minips/run/hello_checks.py):
the group's are read earlier, inside the client's hello (minips/group/root.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minips.guard.addresses import AddressError, normalize
from minips.protocol.wire import ProtocolError


def checked_group(reply: dict[str, Any], of: str = "hello") -> dict[str, Any]:
    """`reply`, once its `group` is {shard, servers, addresses} as 16.4 gives it: servers an
    integer >= 2 (a group of one shows no `group`), shard one of 0..servers-1, addresses a
    list of `servers` addresses a client can connect to (tcp://host:port, ipc://, inproc://).
    of: the request answered. The root's address (first) is always named; an operator's
    reply (`stats`, `stop`, `checkpoint`: 16.7) or another shard's hello reply may name no
    address (nil) for a shard that has not joined."""
    group = reply.get("group")
    where = f"the server's {of}"
    if not isinstance(group, Mapping):
        _refuse(where, "group", group, "a map of shard, servers and addresses")
    servers, shard, addresses = group.get("servers"), group.get("shard"), group.get("addresses")
    if not _is_int(servers) or servers < 2:
        _refuse(where, "group.servers", servers, "an integer >= 2")
    if not _is_int(shard) or not 0 <= shard < servers:
        _refuse(where, "group.shard", shard, f"an integer in 0..{servers - 1}")
    if not isinstance(addresses, list) or len(addresses) != servers:
        _refuse(where, "group.addresses", addresses, f"a list of {servers} addresses")
    for index, address in enumerate(addresses):
        if address is None and index > 0 and (of != "hello" or shard > 0):
            continue  # a shard not joined yet (a root answers hello only once all have)
        if not isinstance(address, str):
            _refuse(where, f"group.addresses[{index}]", address, "an address")
        if not _connectable(address):
            _refuse(where, f"group.addresses[{index}]", address,
                    "tcp://host:port, ipc:// or inproc://")  # fmt: skip
    return reply


def _connectable(address: str) -> bool:
    """Whether ZeroMQ can connect to `address` as it is (its transport written out)."""
    try:
        return normalize(address, "address", wildcard_port=False) == address
    except AddressError:
        return False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(where: str, field: str, value: Any, expected: str) -> None:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise ProtocolError(f"{where}: {field} must be {expected}, got {shown}")
