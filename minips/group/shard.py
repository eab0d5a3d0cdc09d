"""What makes a server a shard of a group (docs/protocol.md 16): its slices, the root's table
of the shards that joined, and a shard's joins to the root.

A shard is an ordinary ParameterServer over its slices (`shard_params`); the only
differences on the wire are the ones `ShardRole` adds: `group` in hello (and stats) replies,
the root's `join` handler and its `group` error while shards are missing, and a non-root
shard's `join` every second to the root (`Joiner`), which also tells it when the root
stops, or is gone (no reply for its root_timeout). The joins are the root's heartbeat of
its shards too: a shard that joined and then sent none for as long (its process killed or
stopped by hand) is gone, and the root ends with an error naming it (`ShardGone`).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import zmq

from minips.errors import MinipsError
from minips.group.agreements import (
    ASSEMBLE_TIMEOUT,
    GROUP_ERROR,
    JOIN_INTERVAL,
    JOIN_PATIENCE,
    JOIN_RESERVE,
    JOIN_TAKEOVER,
    ROOT_TIMEOUT,
    group_map,
)
from minips.group.lost_shards import check_joins
from minips.group.partition import Partition
from minips.guard import addresses, wire_checks
from minips.guard.curve import ClientKeys, require_operator
from minips.protocol import wire
from minips.protocol.wire import Message, ProtocolError

if TYPE_CHECKING:
    from minips.server.router import Envelope

log = logging.getLogger("minips.server")


def shard_params(
    params: dict[str, np.ndarray], part: Partition, shard: int
) -> dict[str, np.ndarray]:
    """Shard `shard`'s parameters: a C-contiguous float32 copy of each of its slices of the
    model's `params`, named like the parameter, in model order."""
    return {
        piece.name: np.ascontiguousarray(piece.of(params[piece.name]), np.float32).copy()
        for piece in part.by_shard[shard]
    }


@dataclass
class Holder:
    """The client holding a shard's index: its routing id (`origin`), its last join
    (`seen`), and whether it joined with an address (`announced`; else it only asked what
    to be, a reservation)."""

    origin: bytes
    seen: float
    announced: bool


class RootTable:
    """The root's record of its group: shard 0 is itself, the others as they join (16.3).

    An index is held by the client (routing id) that last joined it for as long as that
    client is live: it joined with an address in the last `takeover` seconds, or without
    one in the last `reserve` seconds. A live holder's index is refused (`full`) to every
    other client, whatever address it names; a holder that went silent frees it.
    """

    def __init__(self, servers: int, own_address: str, takeover: float = JOIN_TAKEOVER,
                 reserve: float = JOIN_RESERVE) -> None:  # fmt: skip
        self.servers, self.takeover, self.reserve = servers, takeover, reserve
        self.holders: dict[int, Holder] = {}
        self._addresses: list[str | None] = [own_address] + [None] * (servers - 1)
        self.started = time.monotonic()

    def join(self, header: dict[str, Any], origin: bytes, now: float) -> int:
        """Record a `join`; return the shard's index. ProtocolError for a bad one, `full`
        for an index another live client holds."""
        servers, shard, address = header.get("servers"), header.get("shard"), header.get("address")
        if servers != self.servers:
            raise ProtocolError(
                f"this group has {self.servers} servers, not {servers!r}", "bad_field"
            )
        if address is not None and not isinstance(address, str):
            raise ProtocolError("join's address must be a string or nil", "bad_field")
        if shard is None:
            shard = self._index_for(origin, now)
        if not isinstance(shard, int) or isinstance(shard, bool) or not 0 < shard < self.servers:
            raise ProtocolError(
                f"join's shard must be in 1..{self.servers - 1}, got {shard!r}", "bad_field"
            )
        held = self.holders.get(shard)
        if held is not None and held.origin != origin and self._live(held, now):
            what, bound = (("a live shard", self.takeover) if held.announced
                           else ("a shard that asked to join", self.reserve))  # fmt: skip
            raise ProtocolError(
                f"shard {shard} is held by {what} (its last join {now - held.seen:.1f} s ago; "
                f"the index is free {bound:g} s after it)",
                "full",
            )
        self.holders[shard] = Holder(origin, now, address is not None)
        if address is not None:  # asking what to be changes no address
            self._addresses[shard] = address
        return shard

    def _live(self, holder: Holder, now: float) -> bool:
        return now - holder.seen < (self.takeover if holder.announced else self.reserve)

    def _index_for(self, origin: bytes, now: float) -> int:
        """DMLC's server processes have no index: the same client's, or the lowest one no
        live client holds."""
        for shard, holder in self.holders.items():
            if holder.origin == origin:
                return shard
        for shard in range(1, self.servers):
            holder = self.holders.get(shard)
            if holder is None or not self._live(holder, now):
                return shard
        raise ProtocolError(f"all {self.servers} shards of the group have joined (each index "
                            "is held by a live shard)", "full")  # fmt: skip

    def addresses(self) -> list[str | None]:
        return list(self._addresses)

    def rebind(self, own_address: str) -> None:
        """The root's own address is `own_address` (a backup replica's: its primary's)."""
        self._addresses[0] = own_address

    def restore(self, addresses: list[str | None]) -> None:
        """The shards' addresses a replica's snapshot gives (minips/ops/snapshot.py)."""
        self._addresses = list(addresses)

    def silent(self, now: float, timeout: float) -> list[int]:
        """The shards that joined with an address and then sent no join for `timeout` s
        (a restarted shard's joins, its asks too, count as its own)."""
        return [j for j, holder in sorted(self.holders.items())
                if self._addresses[j] is not None and now - holder.seen > timeout]  # fmt: skip

    def missing(self) -> list[int]:
        """The shards that have not joined with an address since the root started."""
        return [j for j, address in enumerate(self.addresses()) if address is None]

    def check_complete(self) -> None:
        """ProtocolError `group` (16.3) naming the missing shards, unless none is."""
        missing = self.missing()
        if missing:
            waited = time.monotonic() - self.started
            raise ProtocolError(
                f"the server group is not complete: shard(s) {', '.join(map(str, missing))} "
                f"of {self.servers} have not joined (waiting {waited:.0f} s)",
                GROUP_ERROR,
            )


class Refused(MinipsError):
    """The root answered a shard's `join` with an error (`code`: 9, 16.3)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"the group's root refused this shard ({code}): {reason}")
        self.code = code


class Joiner:
    """A non-root shard's DEALER to the root: it asks what to be, then joins every second.

    keys: CURVE client keys (an operator's: `join` needs one under CURVE). root_timeout:
    seconds without any reply to its joins after which the root is gone (`root_gone`).
    """

    def __init__(self, root: str, shard: int | None, servers: int,
                 keys: ClientKeys | None = None,
                 root_timeout: float = ROOT_TIMEOUT) -> None:  # fmt: skip
        self.root, self.shard, self.servers = root, shard, servers
        self.root_timeout = root_timeout
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTING_ID, b"\x02" + os.urandom(15))  # one per process
        self.socket.setsockopt(zmq.IMMEDIATE, 1)  # no joins queued while the root is away
        self.socket.setsockopt(zmq.SNDHWM, 4)
        if keys is not None:
            keys.secure(self.socket)
        self.socket.connect(root)
        self.addresses: list[str | None] = [root] + [None] * (servers - 1)
        self.root_stopping = False
        self._sent = 0.0
        self._heard: float | None = None  # the root's last reply (None: none while serving)

    def ask(
        self, timeout: float | None = None, on_wait: Callable[[str], None] | None = None
    ) -> dict[str, Any]:
        """The first join, without an address: the root's reply (index, run config), or
        MinipsError once `timeout` seconds (default ASSEMBLE_TIMEOUT) passed without one.
        An index another live shard holds (`full`) is asked for again for JOIN_PATIENCE
        seconds (a restarted shard's old self frees it within JOIN_TAKEOVER), then the
        refusal is raised. on_wait(line) is told once, after the first second without a
        reply or at the first refusal, what the shard waits for and how long."""
        timeout = ASSEMBLE_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        refused: float | None = None
        while time.monotonic() < deadline:
            self._send(None)
            if self.socket.poll(1000):
                try:
                    reply = self._read()
                except Refused as exc:
                    refused = time.monotonic() if refused is None else refused
                    if exc.code != "full" or time.monotonic() - refused > JOIN_PATIENCE:
                        raise
                    if on_wait is not None:
                        on_wait(f"{exc}; asking again for up to {JOIN_PATIENCE:g} s")
                        on_wait = None
                    time.sleep(JOIN_INTERVAL)
                    continue
                if reply is not None:
                    return reply
            elif on_wait is not None:
                on_wait(f"waiting for the group's root at {self.root} (up to {timeout:g} s)")
                on_wait = None
        raise MinipsError(f"no answer from the group's root at {self.root} within {timeout:g} s")

    def tick(self, now: float, address: str) -> None:
        """Every JOIN_INTERVAL: join with `address`; read the replies that came meanwhile."""
        if self._heard is None:  # serving begins: the root's silence counts from here
            self._heard = now
        while self.socket.poll(0):
            try:
                self._read()
            except Refused as exc:
                if exc.code != "full":
                    raise
                # a backup replica that took this shard over joins as a new client: the
                # root frees the index once the dead primary's joins stopped (16.3)
                log.info("%s; joining again", exc)
        if now - self._sent >= JOIN_INTERVAL:
            self._send(address)
            self._sent = now

    def root_gone(self, now: float) -> bool:
        """Whether the root has answered none of this shard's joins for root_timeout s."""
        return self._heard is not None and now - self._heard > self.root_timeout

    def _send(self, address: str | None) -> None:
        header = {"op": "join", "shard": self.shard, "servers": self.servers, "address": address}
        try:
            self.socket.send_multipart(wire.encode_parts(header, []), zmq.NOBLOCK)
        except zmq.Again:  # the root is not there: the next tick sends again
            pass

    def _read(self) -> dict[str, Any] | None:
        message = wire_checks.decode_reply(self.socket.recv_multipart(), wire.DEFAULT_LIMITS)
        if self._heard is not None:
            self._heard = time.monotonic()
        if message.op == "error":
            raise Refused(message.header["code"], message.header["reason"])
        header = message.header
        self.shard = header["shard"]
        self.addresses = list(header.get("addresses") or self.addresses)
        self.root_stopping = bool(header.get("stop"))
        return header

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


def advertised(endpoint: str, root: str) -> str:
    """Where clients reach a shard bound to `endpoint` that joins `root`: a shard bound to
    every interface of another machine than the root's names the address it reaches the
    root from (a wildcard host would be read as the root's, docs/protocol.md 16.4)."""
    match = re.match(r"^tcp://(\*|0\.0\.0\.0):(\d+)$", endpoint)
    root_host = re.match(r"^tcp://([^:/]+):\d+$", root)
    if match is None or root_host is None or addresses.is_loopback(root):
        return endpoint
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((root_host.group(1), 9))  # a UDP "connect" sends nothing
        return f"tcp://{probe.getsockname()[0]}:{match.group(2)}"
    except OSError:
        return endpoint
    finally:
        probe.close()


class ShardRole:
    """What a shard of a group adds to a server (module docstring).

    shard / servers: its index and K; part: the group's partition (its slices are this
    shard's parameters). run: the configuration a root gives joining shards (16.3).
    joiner: a non-root shard's link to its root. shard_timeout: the seconds without a join
    after which a root's shard that joined is gone (None: never; a run's root_timeout).
    """

    def __init__(self, shard: int, servers: int, part: Partition, run: dict[str, Any] | None = None,
                 joiner: Joiner | None = None,
                 shard_timeout: float | None = None) -> None:  # fmt: skip
        self.shard, self.servers, self.run = shard, servers, dict(run or {})
        self.shard_timeout = shard_timeout
        self.slices = part.shard_slices(shard)
        msgpack.packb(self.run)  # it travels in join replies
        self.joiner = joiner
        self.table: RootTable | None = None

    @property
    def is_root(self) -> bool:
        return self.shard == 0

    def attach(self, server: Any) -> None:
        """The shard's ParameterServer bound its endpoint: the root starts its table of the
        group there and answers joins (through the server's outbox, saying whether it
        stops; under CURVE only to an operator's key); a shard will tell the root where
        clients reach it."""
        endpoint, self.outbox, self.stop = server.endpoint, server.outbox, server.stop
        self.keys = server.options.keys
        self._checkpoints = getattr(server.ops, "checkpoints", None)  # named when a shard is gone
        server.handlers["join"] = self.handle_join
        if self.is_root:
            self.endpoint = endpoint
            self.table = RootTable(self.servers, endpoint)
        else:
            self.endpoint = advertised(endpoint, self.joiner.root)

    def rebind(self, endpoint: str) -> None:
        """A backup replica of this shard (docs/protocol.md 17) serves, once it took over,
        the primary's address `endpoint`, not the private one it bound: the group's
        addresses are the primary's."""
        if self.table is not None:
            self.table.rebind(endpoint)
            self.endpoint = endpoint
        else:
            self.endpoint = advertised(endpoint, self.joiner.root)

    def addresses(self) -> list[str | None]:
        return self.table.addresses() if self.table is not None else self.joiner.addresses

    def group(self) -> dict[str, Any]:
        """The `group` map of this shard's hello, stats, stop and checkpoint replies (16.4)."""
        return group_map(self.shard, self.servers, self.addresses())

    def check_hello(self) -> None:
        """A root answers hello only once its group is complete (error `group`)."""
        if self.table is not None:
            self.table.check_complete()

    def handle_join(self, envelope: Envelope, request: Message) -> None:
        """The root's answer to a shard's `join` (16.3): an operator's request; a shard
        that is not the root answers it `unknown_op`."""
        if self.table is None:
            raise ProtocolError("join goes to the group's root (shard 0)", "unknown_op")
        require_operator(envelope.origin, self.keys)
        shard = self.table.join(request.header, envelope.origin.routing_id, time.monotonic())
        reply = {"op": "join", "shard": shard, "servers": self.servers,
                 "addresses": self.table.addresses(), "run": self.run,
                 "stop": self.stop.stopping}  # fmt: skip
        self.outbox.reply(envelope, reply)

    def tick(self, now: float) -> None:
        """A non-root shard's joins; once its root says it is stopping, or has answered
        none of them for the joiner's root_timeout (the root is gone), it stops too. A
        root serving watches its shards' joins instead (minips.group.lost_shards)."""
        if self.joiner is None:
            if self.table is not None and not self.stop.requested:
                check_joins(self.table, now, self.shard_timeout, self._checkpoints)
            return
        self.joiner.tick(now, self.endpoint)
        if self.joiner.root_stopping and not self.stop.requested:
            self.stop.request("the group's root is stopping")
        if self.joiner.root_gone(now) and not self.stop.requested:
            why = (f"the group's root at {self.joiner.root} answered no join for "
                   f"{self.joiner.root_timeout:g} s")  # fmt: skip
            log.warning("%s: this shard stops", why)
            self.stop.request(why)

    def close(self) -> None:
        if self.joiner is not None:
            self.joiner.close()
