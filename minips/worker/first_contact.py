"""A server that has never answered this client: the one line that says nothing answers at
its address, with what may cause it (no server there yet, a wrong address, CURVE keys).

A ZeroMQ client cannot tell "nothing listens" from "a server that drops our handshake": a
server started with --keys silently ignores a client without its keys, and a server
without keys ignores a CURVE client. So the line names the keys whenever they may be why.
"""

from __future__ import annotations

from minips.protocol.auth import ClientKeys
from minips.worker.replies import ServerUnavailable


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
