"""What a server answers, as a worker sees it: the replies of a pull and of a push, and
the two errors (no reply at all; an error reply). client.py and minips.group.fanout (a
server group's side of the client) both build them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minips.errors import MinipsError
from minips.protocol.wire import Message


class ServerUnavailable(MinipsError):
    """No reply from the server after all retries (it is down, unreachable or stuck)."""


class ServerError(MinipsError):
    """The server answered with an error reply; `code` is from docs/protocol.md section 9."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(f"server refused the request ({code}): {reason}")
        self.reason = reason
        self.code = code


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
