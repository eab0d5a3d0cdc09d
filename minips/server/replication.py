"""Primary-backup replication of one server (R = 2): the backup runs the primary's inputs.

The server handles requests to completion in arrival order, so its state is a function of
the sequence of its inputs: the requests it received, and the few decisions it takes by
the clock (a worker declared dead, the end of the assembly, a stop by a signal). The
primary numbers each input, sends it over the replication link to the backup, and handles
it only once the backup acknowledged it: so a reply (a push's answer above all) leaves only
when the backup holds the input that produced it. The backup feeds the same inputs, in the
same order, through the same handlers (`ParameterServer.serve`), its replies going nowhere
(its own socket listens on a private address no client knows), and it never decides by the
clock itself: the primary sends its clock's decisions as `event` inputs, which both apply
the same way (`apply_event`).

When the primary's link has been silent for FAILOVER_AFTER seconds (it sends a `beat` at
least every BEAT seconds), the backup takes over (`take_over`): it binds the primary's
client address, and the workers' sockets reconnect to it by themselves; a request lost
with the primary is retried by the client (Lazy Pirate) and answered exactly once from the
registry the backup holds (docs/protocol.md 17). A primary whose backup does not
acknowledge within FAILOVER_AFTER serves on alone.

The link (docs/protocol.md 17.3): the primary binds a ROUTER, the backup connects a
DEALER; each message is a msgpack map (`r` names it), a forwarded request followed by its
frames as received. A backup joins at any time: the primary welcomes it with a snapshot
of its state taken at the first quiet point (minips/server/snapshot.py), then forwards
the inputs after it; a backup that took over listens for the next one the same way.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgpack
import zmq

from minips.errors import MinipsError
from minips.protocol import address
from minips.server.server import ParameterServer
from minips.server.snapshot import quiet, read_snapshot, write_snapshot
from minips.server.timers import Timers

log = logging.getLogger("minips.server")

BEAT = 0.1  # s: the longest the primary leaves its link silent
FAILOVER_AFTER = 1.0  # s of link silence after which the backup takes over
JOIN_WAIT = 60.0  # s a primary waits for its backup before serving alone
PRIMARY, BACKUP = "primary", "backup"


@dataclass(frozen=True)
class ReplicaSettings:
    """A replica's part: `role` PRIMARY (link_bind: where its link listens) or BACKUP
    (backup_of: the primary's link address; checkpoint_path: where it writes checkpoints
    once it took over, none before)."""

    role: str
    link_bind: str = "tcp://127.0.0.1:*"
    backup_of: str | None = None
    checkpoint_path: str | Path | None = None
    join_wait: float = JOIN_WAIT


def pack(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header)


def unpack(frame: Any) -> dict[str, Any]:
    return msgpack.unpackb(bytes(frame))


class ReplicatedServer(ParameterServer):
    """A ParameterServer that is one replica of two (module docstring).

    replica: its settings. on_promote(): called once a backup took over (its updates log
    starts then: before, the primary's log has the updates). The rest as ParameterServer.
    """

    def __init__(self, *args: Any, replica: ReplicaSettings, on_promote: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.replica, self.on_promote = replica, on_promote
        self.role = replica.role
        self.sent = 0  # inputs numbered so far (the primary's) or received (the backup's)
        self.failovers: list[dict[str, Any]] = []  # this process's takeover, if it took over
        self.timers = ReplicatedTimers(self)
        self._grace = self.registry.grace
        self._link_ctx = zmq.Context()
        self.link: zmq.Socket | None = None
        self.backup: bytes | None = None  # the backup's routing id on the link, once joined
        self.link_endpoint: str | None = None
        self.client_address = ""  # the primary's, which a backup binds when it takes over
        self._last_sent = time.monotonic()
        self._joining: bytes | None = None  # a backup's join, welcomed at a quiet point
        self.joins = 0  # backups welcomed
        if self.role == PRIMARY:
            self._open_link(replica.link_bind)
        else:
            self.registry.grace = math.inf  # the assembly ends by the primary's clock only

    # ------------------------------------------------------------------------ the primary

    def run(self) -> None:
        """A backup follows its primary until it ends (then returns) or falls silent (then
        serves as primary); a primary waits for its backup, serves, then lets it go."""
        if self.role == BACKUP and not self.follow():
            return
        if self.role == PRIMARY and self.sent == 0 and self.link is not None:
            self.await_backup(self.replica.join_wait)
        super().run()

    def finished(self) -> bool:
        """A primary done serving lets its backup go before its last checkpoint, which may
        take longer than the failover bound."""
        done = super().finished()
        if done and self.role == PRIMARY and self.backup is not None:
            self._send({"r": "end"})
            self.backup = None
        return done

    def serve(self, frames: list[Any], dropped: int = 0) -> None:
        """One request: on a primary with a backup, acknowledged by the backup first."""
        if self.role == PRIMARY:
            assembling = self.registry.assembling
            self.replicate({"r": "input", "dropped": dropped}, frames)
            super().serve(frames, dropped)
            if assembling and not self.registry.assembling:  # ended by the clock, maybe
                self.replicate_event({"assembled": True})
        else:
            super().serve(frames, dropped)

    def begin_stop(self) -> None:
        """A stop begun by the primary (a signal's, say) is an input for the backup too."""
        if self.role == PRIMARY and not self.stopping:
            self.replicate({"r": "event", "stop": self.stop.why})
        super().begin_stop()

    def replicate_event(self, event: dict[str, Any]) -> None:
        """A decision of the primary's clock: sent to the backup, then applied here."""
        self.replicate({"r": "event", **event})
        self.apply_event(event)

    def replicate(self, header: dict[str, Any], frames: list[Any] = ()) -> None:
        """Number an input, send it to the backup and wait for its `ack` (at most
        FAILOVER_AFTER s: then the backup is taken for dead and the primary serves alone)."""
        self._take_joins()
        if self.backup is None:
            return
        self.sent += 1
        self._send({**header, "n": self.sent}, frames)
        deadline = time.monotonic() + FAILOVER_AFTER
        while (left := deadline - time.monotonic()) > 0:
            if not self.link.poll(left * 1000):
                break
            routing, body = self._receive_link()
            if routing == self.backup and body.get("r") == "ack" and body["n"] >= self.sent:
                return
            if body.get("r") == "join":
                self._refuse(routing)
        log.warning("the backup did not acknowledge input %d within %.1f s: serving alone",
                    self.sent, FAILOVER_AFTER)  # fmt: skip
        self.backup = None

    def beat(self, now: float) -> None:
        """Keep the link from falling silent (the backup would take over); take joins."""
        self._take_joins()
        if self.backup is not None and now - self._last_sent >= BEAT:
            self._send({"r": "beat"})

    def await_backup(self, timeout: float) -> None:
        """Wait (at most `timeout` s) for the backup to join before serving anything."""
        deadline = time.monotonic() + timeout
        while self.backup is None and time.monotonic() < deadline and not self.stop.requested:
            if self.link.poll(100):
                self._take_joins()
        if self.backup is None:
            log.warning("no backup joined within %.0f s: serving alone", timeout)

    def _take_joins(self) -> None:
        """Answer the `join`s waiting on the link: one backup at a time, welcomed with a
        snapshot of the state at the first quiet point (minips.server.snapshot); a second
        is refused while one is attached."""
        while self.link is not None and self.link.poll(0):
            routing, body = self._receive_link()
            if body.get("r") != "join":
                continue  # a late ack, or a message of a backup let go
            if self.backup is None:
                self._joining = routing  # welcomed once the state is quiet
            else:
                self._refuse(routing)
        if self._joining is not None and self.backup is None and quiet(self):
            self.backup, self._joining = self._joining, None
            path = write_snapshot(self, snapshot_path(self.link_endpoint))
            self._send({"r": "welcome", "address": self.endpoint, "n": self.sent,
                        "version": self.store.version, "snapshot": str(path)})  # fmt: skip
            self.joins += 1
            log.info("backup joined at version %d (input %d)", self.store.version, self.sent)

    def _open_link(self, where: str) -> None:
        self.link = self._link_ctx.socket(zmq.ROUTER)
        self.link.setsockopt(zmq.LINGER, 0)
        self.link_endpoint = address.bind(self.link, where)
        log.info("replication link on %s", self.link_endpoint)

    def stats(self) -> dict[str, Any]:
        """`stats` with this replica's part: its role and process, whether a backup is
        attached, the backups it welcomed and its takeover (docs/protocol.md 17.4)."""
        replication = {"role": self.role, "pid": os.getpid(), "backup": self.backup is not None,
                       "joins": self.joins, "failovers": self.failovers}  # fmt: skip
        return {**super().stats(), "replication": replication}

    def _refuse(self, routing: bytes) -> None:
        why = "this primary has a backup already"
        self.link.send_multipart([routing, pack({"r": "refused", "why": why})])

    def _receive_link(self) -> tuple[bytes, dict[str, Any]]:
        routing, header, *_ = self.link.recv_multipart()
        return routing, unpack(header)

    def _send(self, header: dict[str, Any], frames: list[Any] = ()) -> None:
        self.link.send_multipart([self.backup, pack(header), *frames], copy=False)
        self._last_sent = time.monotonic()

    # ------------------------------------------------------------------------- the backup

    def follow(self) -> bool:
        """The backup's loop: join the primary, apply its inputs in order, acknowledging
        each on receipt. False once the primary ended (it said `end`); True once its link
        was silent FAILOVER_AFTER s and this replica took over."""
        link = self._link_ctx.socket(zmq.DEALER)
        link.setsockopt(zmq.LINGER, 0)
        link.connect(address.normalize_connect(self.replica.backup_of))
        link.send(pack({"r": "join"}))
        welcome = self._welcome(link)
        self.client_address = welcome["address"]
        heard = time.monotonic()
        while True:
            if link.poll(100):
                header, *frames = link.recv_multipart(copy=False)
                body, heard = unpack(header), time.monotonic()
                if body["r"] == "end":
                    link.close()
                    return False
                if body["r"] in ("input", "event"):
                    self.sent = body["n"]
                    link.send(pack({"r": "ack", "n": body["n"]}))
                    self._apply(body, frames)
            elif time.monotonic() - heard > FAILOVER_AFTER:
                link.close()
                self.take_over(time.monotonic() - heard)
                return True

    def _welcome(self, link: zmq.Socket) -> dict[str, Any]:
        """The primary's answer to `join`; MinipsError when it refuses, does not answer
        within JOIN_WAIT s, or started from another state than this replica."""
        if not link.poll(self.replica.join_wait * 1000):
            raise MinipsError(f"the primary at {self.replica.backup_of} did not answer")
        body = unpack(link.recv())
        if body["r"] != "welcome":
            raise MinipsError(f"the primary refused this backup: {body.get('why')}")
        snapshot = Path(body["snapshot"])
        read_snapshot(self, snapshot)
        snapshot.unlink(missing_ok=True)
        self.sent = body["n"]
        log.info("backup of %s (clients at %s) from version %d", self.replica.backup_of,
                 body["address"], self.store.version)  # fmt: skip
        return body

    def _apply(self, body: dict[str, Any], frames: list[Any]) -> None:
        """One input of the primary's, through the same code path the primary took."""
        if body["r"] == "input":
            self.ops.delivered(frames, body["dropped"], 0)
            self.serve(frames, body["dropped"])
        elif "stop" in body:
            if not self.stopping:
                self.stop.request(body["stop"])
                self.begin_stop()
        else:
            self.apply_event(body)

    def take_over(self, silent: float) -> None:
        """Become the primary: the clients' address bound here, the clock's decisions
        this replica's own from now on, checkpoints written, replies sent."""
        started = time.monotonic()
        self.role = PRIMARY
        self.registry.grace = self._grace
        for worker in self.registry.by_id.values():  # a full heartbeat to reconnect
            worker.last_seen = started
        if self.stopping:
            self.stop.deadline = started + self.options.stop_grace
        self.options = replace(self.options, checkpoint_path=self.replica.checkpoint_path)
        ops: Any = self.ops  # the usual operations (minips/ops/server_ops.py) hold both
        ops.options, ops.checkpoints.path = self.options, self.replica.checkpoint_path
        self.endpoint = bind_retrying(self.socket, self.client_address)
        self._open_link(self.replica.link_bind)  # for the backup that replaces this one
        record = {"silent_s": round(silent, 3), "version": self.store.version,
                  "inputs": self.sent, "bind_s": round(time.monotonic() - started, 3)}  # fmt: skip
        self.failovers.append(record)
        log.warning("took over as primary on %s at version %d (the primary's link was "
                    "silent %.2f s)", self.endpoint, self.store.version, silent)  # fmt: skip
        if self.on_promote is not None:
            self.on_promote(record)

    # ------------------------------------------------------------------- both replicas

    def apply_event(self, event: dict[str, Any]) -> None:
        """A decision the primary took by its clock, applied the same way on both
        replicas: workers declared dead (in order), the assembly ended, then the rule's
        own timer (its decisions depend on the replicated state only)."""
        for worker_id in event.get("retired", []):
            worker = self.registry.by_id.get(worker_id)
            if worker is not None and worker.alive:
                log.warning("%s declared dead by the primary's clock", worker_id)
                self.after_leaving(self.membership.retire(worker, "heartbeat timeout"))
        if event.get("assembled") and self.registry.assembling:
            self.registry.assembling = False
            self.pulls.release()
        self.carry_out(self.rule.on_tick(time.monotonic()))

    def close(self) -> None:
        super().close()
        self._link_ctx.destroy(linger=0)


class ReplicatedTimers(Timers):
    """The loop's jobs on a replica: the clock's decisions that change the state (workers
    silent too long, the assembly's end) go through the backup first, as one `event`."""

    def __init__(self, server: ReplicatedServer) -> None:
        ops = server.ops
        super().__init__(ops.inflow, ops.checkpoints, server.membership, server.pulls,
                         server.rule, server.carry_out, server.after_leaving)  # fmt: skip
        self.server = server

    def tick(self, now: float) -> None:
        with self.contained("inflow"):
            self.inflow.check(now)
        with self.contained("checkpoint"):
            self.checkpoints.if_due(now)
        with self.contained("replication"):
            self.server.beat(now)
        with self.contained("clock"):
            event = self.decide(now)
            if event:
                self.server.replicate_event(event)

    def decide(self, now: float) -> dict[str, Any]:
        """What the clock decided this turn ({}: nothing): the workers silent past the
        heartbeat timeout, and whether the assembly's grace ran out."""
        silent = self.registry.silent(now, self.membership.heartbeat_timeout)
        event: dict[str, Any] = {}
        if silent:
            event["retired"] = [worker.worker_id for worker in silent]
        if self.registry.assembling:
            self.registry.update_assembly(now)  # ends it here; the event ends it there
            if not self.registry.assembling:
                self.registry.assembling = True  # ended by apply_event, on both alike
                event["assembled"] = True
        return event


def snapshot_path(link: str | None) -> Path:
    """Where a primary writes the snapshot a joining backup reads (one machine: a file in
    the system's temporary directory, named by the link's address)."""
    name = "".join(c if c.isalnum() else "-" for c in str(link))
    return Path(tempfile.gettempdir()) / f"minips-snapshot-{name}.npz"


def bind_retrying(socket: zmq.Socket, where: str, timeout: float = 5.0) -> str:
    """Bind `where`, which a dead process held a moment ago (tried again for `timeout` s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return address.bind(socket, where)
        except MinipsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
