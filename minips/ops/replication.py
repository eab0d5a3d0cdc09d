"""Primary-backup replication of one server (R = 2): the backup runs the primary's inputs.

The server handles requests to completion in arrival order, so its state is a function of
the sequence of its inputs: the requests it received, and the few decisions it takes by
the clock (a worker declared dead, the end of the assembly, a stop by a signal). The
primary numbers each input, sends it over the replication link to the backup and handles
it, holding its replies until the backup acknowledged it (minips/ops/replica_link.py):
so a reply (a push's answer above all) leaves only once the backup holds the input that
produced it. The backup feeds the same inputs, in the same order, through the same
handlers (`ParameterServer.serve`), its replies going nowhere (its own socket listens on a
private address no client knows), and it never decides by the clock itself: the primary
sends its clock's decisions as `event` inputs, which both apply alike (`apply_event`).

When the primary's link has been silent for the failover bound (`failover_after`,
FAILOVER_AFTER = 1 s unless the run's `--failover-after` says otherwise; the primary sends
a `beat` at least every 0.1 s), the backup takes over (`take_over`): it binds the primary's
client address, and the workers' sockets reconnect to it by themselves; a request lost
with the primary is retried by the client (Lazy Pirate) and answered exactly once from the
registry the backup holds (docs/protocol.md 17). A primary whose backup does not
acknowledge within the same bound serves on alone.

The link (docs/protocol.md 17.3): the primary binds a ROUTER, the backup connects a
DEALER; each message is a msgpack map (`r` names it), a forwarded request followed by its
frames as received. A backup joins at any time: the primary welcomes it with a snapshot
of its state taken at the first quiet point (minips/ops/snapshot.py), then forwards
the inputs after it; a backup that took over listens for the next one the same way.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import zmq

from minips.errors import MinipsError
from minips.guard import addresses
from minips.ops.replica_link import (
    FAILOVER_AFTER,
    HeldReplies,
    PrimaryLink,
    input_header,
    link_client,
    pack,
    unpack,
    with_sender,
)
from minips.ops.snapshot import read_snapshot
from minips.ops.timers import Timers
from minips.server.server import ParameterServer

log = logging.getLogger("minips.server")

JOIN_WAIT = 60.0  # s a primary waits for its backup before serving alone
PRIMARY, BACKUP = "primary", "backup"


@dataclass(frozen=True)
class ReplicaSettings:
    """A replica's part: `role` PRIMARY (link_bind: where its link listens) or BACKUP
    (backup_of: the primary's link address; checkpoint_path: where it writes checkpoints
    once it took over, none before); failover_after: the seconds of link silence after
    which a backup takes over and a primary lets its backup go (both replicas the same)."""

    role: str
    link_bind: str = "tcp://127.0.0.1:*"
    failover_after: float = FAILOVER_AFTER
    backup_of: str | None = None
    checkpoint_path: str | Path | None = None
    join_wait: float = JOIN_WAIT


class ReplicatedServer(ParameterServer):
    """A ParameterServer that is one replica of two (module docstring).

    replica: its settings. on_promote(record): called once a backup took over, with its
    failover record (its updates log starts then: before, the primary's log has the
    updates). The rest as ParameterServer.
    """

    def __init__(
        self,
        *args: Any,
        replica: ReplicaSettings,
        on_promote: Callable[[dict[str, Any]], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.replica, self.on_promote = replica, on_promote
        self.on_welcome: Callable[[], None] | None = None  # a backup holds the state now
        # The fence (docs/protocol.md 17.2): a primary about to serve alone says its backup
        # no longer holds the state (`on_alone`), and a backup takes over only while it
        # still does (`holds_state`): one the primary let go is behind what it acknowledged.
        self.on_alone: Callable[[], None] | None = None
        self.holds_state: Callable[[], bool] | None = None
        self.role = replica.role
        self.sent = 0  # inputs numbered so far (the primary's) or received (the backup's)
        self.failovers: list[dict[str, Any]] = []  # this process's takeover, if it took over
        self.timers = ReplicatedTimers(self)
        self._grace = self.registry.grace
        self._link_ctx = zmq.Context()
        self.replies = HeldReplies(self.socket)  # the outbox's socket: replies wait for acks
        self.outbox.socket = self.replies
        self.link: PrimaryLink | None = None  # a primary's (a backup's once it took over)
        self.client_address = ""  # the primary's, which a backup binds when it takes over
        if self.role == PRIMARY:
            self.link = PrimaryLink(self._link_ctx, replica.link_bind, self.replies,
                                    keys=self.options.keys,
                                    bound=replica.failover_after)  # fmt: skip
            self.link.before_alone = self._before_alone
        else:
            self.registry.grace = math.inf  # the assembly ends by the primary's clock only

    # ------------------------------------------------------------------------ the primary

    def run(self) -> None:
        """A backup follows its primary until it ends (then returns) or falls silent (then
        serves as primary); a primary waits for its backup, serves, then lets it go."""
        if self.role == BACKUP and not self.follow():
            return
        if self.link is not None and self.link.sent == 0 and not self.failovers:
            self.await_backup(self.replica.join_wait)  # a backup that took over serves at once
        super().run()

    def poller(self) -> zmq.Poller:
        """The loop also wakes for the link: an acknowledgement releases replies."""
        poller = super().poller()
        if self.link is not None:
            poller.register(self.link.socket, zmq.POLLIN)
        return poller

    def finished(self) -> bool:
        """A primary done serving lets its backup go before its last checkpoint, which may
        take longer than the failover bound."""
        done = super().finished()
        if done and self.link is not None:
            self.link.end()
        return done

    def serve(self, frames: list[Any], dropped: int = 0) -> None:
        """One request: on a primary, sent to the backup first."""
        if self.link is None:
            return super().serve(frames, dropped)
        assembling = self.registry.assembling
        self.link.forward(input_header(frames, dropped), frames)
        super().serve(frames, dropped)
        if assembling and not self.registry.assembling:  # ended by the clock, maybe
            self.replicate_event({"assembled": True})

    def begin_stop(self) -> None:
        """A stop begun by the primary (a signal's, say) is an input for the backup too."""
        if self.link is not None and not self.stopping:
            self.link.forward({"r": "event", "stop": self.stop.why})
        super().begin_stop()

    def replicate_event(self, event: dict[str, Any]) -> None:
        """A decision of the primary's clock: sent to the backup, then applied here."""
        if self.link is not None:
            self.link.forward({"r": "event", **event})
        self.apply_event(event)

    def await_backup(self, timeout: float) -> None:
        """Wait (at most `timeout` s) for the backup to join before serving anything."""
        link, deadline = self.link, time.monotonic() + timeout
        assert link is not None
        while link.backup is None and time.monotonic() < deadline and not self.stop.requested:
            if link.socket.poll(100):
                link.turn(time.monotonic(), self)
        if link.backup is None:
            log.warning("no backup joined within %.0f s: serving alone", timeout)

    @property
    def link_endpoint(self) -> str | None:
        return self.link.endpoint if self.link is not None else None

    def stats(self) -> dict[str, Any]:
        """`stats` with this replica's part: its role and process, whether a backup is
        attached, the backups it welcomed and its takeover (docs/protocol.md 17.4)."""
        link = self.link
        replication = {"role": self.role, "pid": os.getpid(),
                       "backup": link is not None and link.backup is not None,
                       "joins": link.joins if link else 0, "failovers": self.failovers}  # fmt: skip
        return {**super().stats(), "replication": replication}

    # ------------------------------------------------------------------------- the backup

    def follow(self) -> bool:
        """The backup's loop: join the primary, apply its inputs in order, acknowledging
        each on receipt. False once the primary ended (it said `end`); True once its link
        was silent `failover_after` s and this replica took over."""
        link = self._link_ctx.socket(zmq.DEALER)
        link.setsockopt(zmq.LINGER, 0)
        link_client(link, self.options.keys)
        link.connect(addresses.normalize_connect(self.replica.backup_of))
        link.send(pack({"r": "join"}))
        welcome = self._welcome(link)
        if welcome is None:  # stopped by a signal before the primary welcomed it
            link.close()
            return False
        self.client_address = welcome["address"]
        if self.group is not None:  # a shard's: the group knows it by the clients' address
            self.group.rebind(self.client_address)
        heard = time.monotonic()
        while True:  # signals do not end it: a primary that dies meanwhile is taken over
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
                elif body["r"] == "beat":  # the primary knows this backup lives
                    link.send(pack({"r": "ack", "n": self.sent}))
            elif time.monotonic() - heard > self.replica.failover_after:
                link.close()
                self.take_over(time.monotonic() - heard)
                return True

    def _welcome(self, link: zmq.Socket) -> dict[str, Any] | None:
        """The primary's answer to `join` (None: a signal came first); MinipsError when it
        refuses, does not answer within JOIN_WAIT s, or started from another state than
        this replica."""
        deadline = time.monotonic() + self.replica.join_wait
        while not link.poll(100):  # in slices: a signal stops a backup nobody welcomed
            if self.stop.signalled:
                return None
            if time.monotonic() > deadline:
                raise MinipsError(f"the primary at {self.replica.backup_of} did not answer")
        body = unpack(link.recv())
        if body["r"] != "welcome":
            raise MinipsError(f"the primary answered {body['r']!r} to this backup's join")
        snapshot = Path(body["snapshot"])
        read_snapshot(self, snapshot)
        snapshot.unlink(missing_ok=True)
        self.sent = body["n"]
        log.info("backup of %s (clients at %s) from version %d", self.replica.backup_of,
                 body["address"], self.store.version)  # fmt: skip
        if self.on_welcome is not None:
            self.on_welcome()
        return body

    def _apply(self, body: dict[str, Any], frames: list[Any]) -> None:
        """One input of the primary's, through the same code path the primary took."""
        if body["r"] == "input":
            frames = with_sender(frames, body)
            self.ops.delivered(frames, body["dropped"], 0)
            self.serve(frames, body["dropped"])
        elif "stop" in body:
            if not self.stopping:
                self.stop.request(body["stop"])
                self.begin_stop()
        else:
            self.apply_event(body)

    def _before_alone(self) -> None:
        """The fence's primary half: said before a reply leaves that the backup lacks."""
        if self.on_alone is not None:
            self.on_alone()

    def take_over(self, silent: float) -> None:
        """Become the primary: the clients' address bound here, the clock's decisions
        this replica's own from now on, checkpoints written, replies sent."""
        if self.holds_state is not None and not self.holds_state():
            raise MinipsError(
                "the primary let this backup go and served alone: its state is "
                "behind what the primary acknowledged, so it does not take over"
            )
        started = time.monotonic()
        self.role = PRIMARY
        self.registry.grace = self._grace
        for worker in self.registry.by_id.values():  # a full heartbeat to reconnect
            worker.last_seen = started
        if self.stopping:
            self.stop.deadline = started + self.options.stop_grace
        self.options = replace(self.options, checkpoint_path=self.replica.checkpoint_path)
        ops: Any = self.ops  # the usual operations (minips/ops/server_ops.py) hold both
        ops.options = settings = replace(ops.options, checkpoint_path=self.replica.checkpoint_path)
        ops.checkpoints.write_to(self.replica.checkpoint_path, settings.checkpoint_every,
                                 settings.checkpoint_interval)  # fmt: skip
        self.endpoint = bind_retrying(self.socket, self.client_address)
        # for the backup that replaces this one; inputs numbered on from the last one
        self.link = PrimaryLink(self._link_ctx, self.replica.link_bind, self.replies, self.sent,
                                self.options.keys, self.replica.failover_after)  # fmt: skip
        self.link.before_alone = self._before_alone
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
        if self.link is not None:
            self.link.close()
        self._link_ctx.destroy(linger=0)


class ReplicatedTimers(Timers):
    """The loop's jobs on a replica: the clock's decisions that change the state (workers
    silent too long, the assembly's end) go through the backup first, as one `event`."""

    def __init__(self, server: ReplicatedServer) -> None:
        ops = server.ops
        super().__init__(ops.inflow, ops.checkpoints, server.membership, server.pulls,
                         server.rule, server.carry_out, server.after_leaving,
                         server.group)  # fmt: skip
        self.server = server

    def tick(self, now: float) -> None:
        with self.contained("inflow"):
            self.inflow.check(now)
        with self.contained("checkpoint"):
            self.checkpoints.if_due(now)
        if self.server.link is not None:
            with self.contained("replication"):
                self.server.link.turn(now, self.server)
        with self.contained("clock"):
            event = self.decide(now)
            if event:
                self.server.replicate_event(event)
        if self.group is not None:  # a shard's joins: a stop with its root is a stop event
            with self.contained("group"):
                self.group.tick(now)

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


def bind_retrying(socket: zmq.Socket, where: str, timeout: float = 5.0) -> str:
    """Bind `where`, which a dead process held a moment ago (tried again for `timeout` s);
    MinipsError while a live process still listens there (a primary that only stalled)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if addresses.still_listening(where):
                raise MinipsError(f"{where} still answers: the primary lives (it stalled)")
            return addresses.bind(socket, where)
        except MinipsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
