"""What a server answers, as a worker sees it: the replies of a pull and of a push, and
the two errors (no reply at all; an error reply). client.py and minips.group.fanout (a
server group's side of the client) both build them.

No reply at all to a first request gets one line that says what may cause it (no server
there yet, a wrong address, CURVE keys). A ZeroMQ client cannot tell "nothing listens"
from "a server that drops our handshake": a server started with --keys silently ignores a
client without its keys, and a server without keys ignores a CURVE client. So the line
names the keys whenever they may be why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from minips.errors import MinipsError
from minips.protocol.auth import ClientKeys
from minips.protocol.wire import Message

log = logging.getLogger("minips.client")


class ServerUnavailable(MinipsError):
    """No reply from the server after all retries (it is down, unreachable or stuck)."""


class ServerError(MinipsError):
    """The server answered with an error reply; `code` is from docs/protocol.md section 9."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(f"server refused the request ({code}): {reason}")
        self.reason = reason
        self.code = code


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


def warn_if_not_below_heartbeat(timeout: float, heartbeat_timeout: float) -> None:
    """A reply timeout not below the server's heartbeat timeout (docs/protocol.md 7)."""
    if timeout >= heartbeat_timeout:
        log.warning("reply timeout %g s is not below the server's heartbeat timeout %g s: "
                    "a lost reply gets this worker declared dead before it retries",
                    timeout, heartbeat_timeout)  # fmt: skip


@dataclass
class PullReply:
    """A pull's answer.

    version: the server's global version t; pass it as `base` of the push computed on these
    parameters and as `since` of the next pull. params: name -> read-only float32 array,
    only the parameters changed since `since` (all when since is None). param_versions:
    name -> version of its last change, for every parameter. stop: the server is stopping.
    """

    version: int
    params: dict[str, np.ndarray]
    param_versions: dict[str, int]
    stop: bool
    # name -> {"indices", "values"}: `delta` tensors (docs/protocol.md 13.7) to ADD to the
    # worker's copy, under a plan that pulls some parameters as deltas.
    deltas: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


@dataclass
class PushReply:
    """A push's answer.

    version: the server's version after handling the push. applied: the gradient went into
    an applied update (False: only queued, `last=False` under ssgd, or the server is
    stopping). staleness: tau = t - base when it was applied. stop: the server is stopping.
    pull: with `push(..., pull_since=v)`, the pull half (then `version` is the pull's).
    """

    version: int
    applied: bool
    staleness: int
    stop: bool
    pull: PullReply | None = None  # a fused push + pull: the parameters, as a pull's reply


def pull_reply(message: Message) -> PullReply:
    """A pull's (or a fused push's) reply: dense/fp16 arrays to set, `delta` ones to add."""
    h = message.header
    deltas = {n: parts for n, parts in message.parts.items() if message.codecs[n] == "delta"}
    return PullReply(h["version"], message.arrays, h["param_versions"], h["stop"], deltas)
