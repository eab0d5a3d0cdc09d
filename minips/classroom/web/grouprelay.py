"""A browser's stand-in in a server group: the gateway joins the group for it.

A browser speaks to one server (docs/protocol.md 1-13, through the WebSocket of 14). In
front of a server group the gateway cannot pass its frames on unread: they must be split
over the shards. So for each browser it holds a PSClient (the group's client, minips.worker
.group) named like the browser's worker, reads each request, makes the same call on the
group, and answers with the reply one server would have sent (docs/protocol.md 14.5):

    hello  -> PSClient.hello(info): the browser's rank, the run's config, no `group`
    pull   -> PSClient.pull(since): every parameter whole, as one server sends them
    push   -> PSClient.push(...) with the browser's own `seq` on every shard, so a retry
              (the same seq) is applied once end to end: a shard answers it from memory,
              or replaces the held one (docs/protocol.md 8); a retry of a push answered
              here is answered from this relay's memory, its pull half made afresh
    ping, bye -> the same calls

The group's versions (one per shard) are numbered for the browser in the order they are
first sent to it, 1, 2, ... (0: the group's start); the browser passes them back as `base`
and `since` and the relay maps them back, so staleness and the rules stay per shard.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import numpy as np

from minips.group.fanout import GroupVersion
from minips.group.root import GROUPS
from minips.guard import wire_checks
from minips.ops.client_retries import RetryingClient
from minips.protocol import wire
from minips.protocol.wire import Message, ProtocolError
from minips.transmission.codecs import decode_gradients
from minips.worker.client import PSClient, PullReply, ServerError, ServerUnavailable

log = logging.getLogger("minips.classroom.web")

REMEMBERED_PUSHES = 64  # as a server remembers them (docs/protocol.md 8)
BYE_TIMEOUT = 2.0  # s the relay waits for a shard to answer its bye for a tab (as 14.3's)


class RelayedClient(RetryingClient):
    """The group's client for one browser: each push goes to the shards with the `seq`
    the browser gave it (`push_seq`), not one of the client's own. A browser's retry then
    reaches every shard as a retry, whether the relay gave up on the first attempt or not."""

    push_seq = 0

    def next_seq(self) -> int:
        return self.push_seq


class GroupRelay:
    """One browser's requests to the group at `root` (module docstring)."""

    def __init__(self, root: str, keys: Any = None) -> None:
        self.root, self.keys = root, keys
        self.client: PSClient | None = None
        self.tokens: dict[tuple[int, ...], int] = {}  # a group version -> its number here
        self.versions: dict[int, tuple[int, ...]] = {}  # and back
        self.answered: OrderedDict[int, dict[str, Any]] = OrderedDict()  # seq -> push reply
        self.seated = False  # it holds a rank: said hello (not as an observer), not bye

    def handle(self, frames: list[bytes]) -> list[Any] | None:
        """The reply frames to one request from the browser (None: nothing to send, the
        group did not answer: the browser times out and retries, as with a server)."""
        try:
            request = wire_checks.decode_request(frames)
        except ProtocolError as exc:
            return wire.error_frames(exc.reason, exc.code, wire_checks.peek_rid(frames))
        rid = request.header.get("rid")
        try:
            header, parts = self._call(request)
        except ProtocolError as exc:
            return wire.error_frames(exc.reason, exc.code, rid)
        except ServerError as exc:
            return wire.error_frames(exc.reason, exc.code, rid)
        except ServerUnavailable as exc:
            log.warning("browser request %s: %s", request.op, exc)
            return None
        return wire.encode_parts({**header, "rid": rid} if rid is not None else header, parts)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def leave(self, timeout: float = BYE_TIMEOUT) -> bool:
        """The browser's WebSocket closed: say `bye` (finished: false) on every shard for
        it if it holds a rank (docs/protocol.md 14.3), waiting at most `timeout` s for
        each, then close. Whether a bye was said for it."""
        seated = self.seated and self.client is not None
        if seated:
            self.client.timeout, self.client.retries = timeout, 0
            log.info("browser (worker %s) left without bye: its seat is free",
                     self.client.worker_id)  # fmt: skip
            try:
                self.client.bye(finished=False)
            except (ServerError, ServerUnavailable) as exc:
                log.warning("the group did not answer the bye for worker %s: %s",
                            self.client.worker_id, exc)  # fmt: skip
        self.close()
        return seated

    # ------------------------------------------------------------------------ the calls
    def _call(self, request: Message) -> tuple[dict[str, Any], list[wire.WirePart]]:
        op, header = request.op, request.header
        if op == "hello":
            return self._hello(header), []
        if self.client is None:
            raise ProtocolError(f"{op} from a worker that has not said hello", "unknown_worker")
        if op == "pull":
            return self._pull_reply(
                {"op": "pull"}, self.client.pull(self._since(header.get("since")))
            )
        if op == "push":
            return self._push(request)
        if op == "ping":
            return {"op": "ping", "version": self._token(self.client.group.versions),
                    "stop": self.client.ping()}, []  # fmt: skip
        if op == "bye":
            self.client.bye(finished=header.get("finished", True))
            self.seated = False
            return {"op": "bye"}, []
        raise ProtocolError(
            f"op {op!r} is not a worker's (the gateway relays workers)", "unknown_op"
        )

    def _hello(self, header: dict[str, Any]) -> dict[str, Any]:
        if self.client is None or self.client.worker_id != header["worker"]:
            self.close()
            self.client = RelayedClient(
                self.root, worker_id=header["worker"], keys=self.keys, groups=GROUPS
            )
        info = header.get("info")
        hello = self.client.hello(info)
        self.seated = not (isinstance(info, dict) and info.get("role") == "observer")
        version = self._token(self.client.group.versions)
        return {"op": "hello", "worker": header["worker"], **hello, "version": version}

    def _push(self, request: Message) -> tuple[dict[str, Any], list[wire.WirePart]]:
        header = request.header
        fused = "pull_since" in header
        if header["seq"] in self.answered:  # a retry: applied once, answered again
            reply = self.answered[header["seq"]]
            if fused:  # its pull half afresh (docs/protocol.md 5.3)
                return self._pull_reply(reply, self.client.pull(self._since(header["pull_since"])))
            return reply, []
        grads, extras = decode_gradients(request)
        extra = {name.removeprefix("extra/"): array for name, array in extras.items()}
        pulled = {"pull_since": self._since(header["pull_since"])} if fused else {}
        self.client.push_seq = header["seq"]
        pushed = self.client.push(grads, self._base(header["base"]), extra,
                                  last=header.get("last", True), samples=header.get("samples"),
                                  **pulled)  # fmt: skip
        reply = {"op": "push", "version": self._token(pushed.version), "seq": header["seq"],
                 "applied": pushed.applied, "staleness": pushed.staleness,
                 "stop": pushed.stop}  # fmt: skip
        self.answered[header["seq"]] = reply
        while len(self.answered) > REMEMBERED_PUSHES:
            self.answered.popitem(last=False)
        if fused:
            return self._pull_reply(reply, pushed.pull)
        return reply, []

    def _pull_reply(self, header: dict[str, Any], pulled: PullReply) -> tuple[dict, list]:
        """A pull (or a fused push's) reply as one server sends it: whole float32 tensors,
        `delta`s with int32 positions in the whole tensor."""
        parts = [wire.WirePart(name, np.ascontiguousarray(a, np.float32))
                 for name, a in pulled.params.items()]  # fmt: skip
        for name, delta in pulled.deltas.items():
            shape = self.client.group.partition.shapes[name]
            for part in ("indices", "values"):
                dtype = np.int32 if part == "indices" else delta["values"].dtype
                parts.append(wire.WirePart(name, delta[part].astype(dtype), "delta", part, shape))
        reply = {**header, "version": self._token(pulled.version),
                 "param_versions": pulled.param_versions, "stop": pulled.stop}  # fmt: skip
        return reply, parts

    # ---------------------------------------------------------------------- versions
    def _token(self, version: Any) -> int:
        """The number the browser sees for the group version `version`."""
        key = tuple(int(v) for v in version)
        if key not in self.tokens:
            given = [token for token in self.versions if token]  # 0 is the start's alone
            self.tokens[key] = len(given) + 1 if any(key) else 0
            self.versions[self.tokens[key]] = key
        return self.tokens[key]

    def _since(self, token: int | None) -> GroupVersion | None:
        """The group version behind a `since` the browser sent (None, or a number this
        relay never gave: everything)."""
        return GroupVersion(self.versions[token]) if token in self.versions else None

    def _base(self, token: int) -> GroupVersion | int:
        """The group version behind a `base` (a number this relay never gave: the start,
        the oldest base there is)."""
        return GroupVersion(self.versions[token]) if token in self.versions else 0
