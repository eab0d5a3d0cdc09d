"""A client's first contact with a server: the first hello, which waits while a server
group assembles and follows a shard's pointer to its root (docs/protocol.md 16.3), and the
one line that says nothing answers at an address, with what may cause it (no server there
yet, a wrong address, CURVE keys).

A ZeroMQ client cannot tell "nothing listens" from "a server that drops our handshake": a
server started with --keys silently ignores a client without its keys, and a server
without keys ignores a CURVE client. So the line names the keys whenever they may be why.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from minips.protocol.auth import ClientKeys
from minips.protocol.group import GROUP_ERROR, HELLO_RETRY, reach
from minips.worker.replies import ServerError, ServerUnavailable

# `client` below is the PSClient saying hello (not imported: it imports this).
PSClient = Any

log = logging.getLogger("minips.client")


def identified(header: dict[str, Any]) -> dict[str, Any]:
    """A hello says that this client sets its own routing id on every socket: the server
    then refuses a hello that an abandoned socket left queued (docs/protocol.md 15), so a
    retry and the socket it gave up on are never two owners of the worker id."""
    return {**header, "own_routing_id": True} if header.get("op") == "hello" else header


def hello_root(client: PSClient, header: dict[str, Any]) -> dict[str, Any]:
    """The reply to the client's hello from the server at its address, or from the root
    of the group that server belongs to (docs/protocol.md 16.3-16.4). A root whose group
    is still assembling answers `group`: ask again every HELLO_RETRY s for at most the
    client's `assemble_timeout` s. A shard that is not the root sends us on to the root
    (the client's address becomes the root's). A plain server's reply is returned as it
    came."""
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


def keys_hint(keys: ClientKeys | None) -> str:
    """What to check about CURVE keys, for a client given `keys` (None: none given)."""
    if keys is None:
        return (
            "If the server was started with --keys (CURVE authentication), give this client "
            "the run's key directory too: --keys DIR"
        )
    return (
        "Check that --keys holds this server's server.key and a key pair it admits "
        "(a server started without keys does not answer a CURVE client either)"
    )


def nothing_answers(address: str, waited: float, keys: ClientKeys | None) -> ServerUnavailable:
    """The error of a first request that got no reply in `waited` seconds."""
    return ServerUnavailable(
        f"nothing answers at {address} (no reply in {waited:g} s): is the server started, "
        f"and is the address right? {keys_hint(keys)}"
    )
