"""The primary's side of the replication link: inputs out, acknowledgements in, replies held.

The primary numbers each input and sends it to its backup (`forward`), handles it at once,
and holds every reply it sends meanwhile (`HeldReplies`, the outbox's socket) until the
backup acknowledged the input that reply came after: the primary's and the backup's work
on one input overlap, and no reply leaves before the backup holds what produced it. A
backup that acknowledges nothing for the failover bound (FAILOVER_AFTER s unless the run's
`--failover-after` says otherwise; it acknowledges beats too) is let
go (its replies sent: the primary serves alone). A backup's `join` is welcomed at the
first quiet point with a snapshot of the state (minips.ops.snapshot). The wire:
docs/protocol.md 17.3.

Under CURVE keys the link is CURVE too, and admits one client key: the server's own. A
backup proves it holds the server's secret key by completing the handshake with that pair
(`link_client`), so a process without it never joins and never sees an input; and since
a forwarded request does not carry its sender's key (the link's connection is the
primary's), the primary names it in the input (`input_header`) and the backup's handlers
read it from there (`KeyedFrame`): a worker's owner and an operator's `stop` are checked on
the backup against the key the client really used.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import zmq

from minips.guard import addresses, curve
from minips.ops.snapshot import quiet, write_snapshot
from minips.protocol import auth

if TYPE_CHECKING:
    from minips.server.server import ParameterServer

log = logging.getLogger("minips.server")

BEAT = 0.1  # s: the longest the primary leaves its link silent
FAILOVER_AFTER = 1.0  # s of link silence after which the backup takes over (the default)


def pack(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header)


def unpack(frame: Any) -> dict[str, Any]:
    return msgpack.unpackb(bytes(frame))


class HeldReplies:
    """Stands for the server's socket in its outbox: a reply sent while input `current` is
    not acknowledged waits, in order, until it is (`release`)."""

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self.current = 0  # the last input numbered: what a reply sent now comes after
        self.acked = 0  # the last input the backup acknowledged
        self.held: deque[tuple[int, list[Any]]] = deque()

    def send_multipart(self, frames: list[Any], copy: bool = False) -> None:
        if self.current <= self.acked:
            self.socket.send_multipart(frames, copy=copy)
        else:  # the arrays are never modified once handed over (store.py): no copy
            self.held.append((self.current, frames))

    def release(self, acked: int) -> None:
        """Inputs up to `acked` are held by the backup: their replies go."""
        self.acked = max(self.acked, acked)
        while self.held and self.held[0][0] <= self.acked:
            self.socket.send_multipart(self.held.popleft()[1], copy=False)


class PrimaryLink:
    """The link's ROUTER socket bound at `where`, the backup attached to it (None: the
    primary serves alone), the inputs numbered so far (`sent`, from `first`). bound: the
    seconds without an acknowledgement after which the backup is let go."""

    def __init__(self, context: zmq.Context, where: str, replies: HeldReplies, first: int = 0,
                 keys: curve.ServerKeys | None = None,
                 bound: float = FAILOVER_AFTER) -> None:  # fmt: skip
        self.bound = bound
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self._gatekeeper = None
        if keys is not None:  # before the bind: no connection ever skips the check
            self._gatekeeper = curve.start_gatekeeper(context, link_keys(keys))
            curve.make_curve_server(self.socket, keys)
        self.endpoint = addresses.bind(self.socket, where)
        self._snapshots = snapshots_dir()
        self.replies, self.sent = replies, first
        replies.current = replies.acked = first
        self.backup: bytes | None = None  # its routing id on the link
        self.joining: bytes | None = None  # a join waiting for a quiet point
        self.waiting_since: float | None = None  # an input unacknowledged since
        self.heard = time.monotonic()  # the backup's last acknowledgement (of a beat too)
        self.last_sent = time.monotonic()
        self.joins = 0  # backups welcomed
        self.before_alone: Callable[[], None] | None = None  # the fence (replication.py)
        log.info("replication link on %s", self.endpoint)

    def forward(self, header: dict[str, Any], frames: list[Any] | tuple = ()) -> None:
        """Number an input and send it to the backup (nothing without one)."""
        if self.backup is None:
            return
        self.sent += 1
        self.replies.current = self.sent
        self._send({**header, "n": self.sent}, frames)
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def turn(self, now: float, server: ParameterServer) -> None:
        """Each turn of the loop: acknowledgements and joins read, a silent backup let go,
        a waiting one welcomed at a quiet point, a beat when the link was quiet."""
        self.read()
        waited = now - min(self.waiting_since or now, self.heard)
        if self.backup is not None and waited > self.bound:
            self.lose(f"acknowledged nothing for {self.bound:g} s")
        if self.joining is not None and self.backup is None and quiet(server):
            self.welcome(server)
        if self.backup is not None and now - self.last_sent >= BEAT:
            self._send({"r": "beat"})

    def read(self) -> None:
        """Every message waiting: acknowledgements release replies; a join waits for a
        quiet point with no backup attached (the last one to come is welcomed: a backup
        replacing one that died comes before the primary saw it silent)."""
        while self.socket.poll(0):
            routing, body = link_message(self.socket.recv_multipart())
            if body.get("r") == "ack" and routing == self.backup:
                acked = body.get("n")
                if not isinstance(acked, int) or isinstance(acked, bool):
                    continue  # not an acknowledgement: nothing is taken as held
                self.heard = time.monotonic()
                # never past what was sent: an `n` ahead would let later replies go unheld
                self.replies.release(min(acked, self.sent))
                self.waiting_since = None if acked >= self.sent else self.heard
            elif body.get("r") == "join":
                self.joining = routing

    def welcome(self, server: ParameterServer) -> None:
        """Attach the waiting backup: the state's snapshot, then every input after it."""
        self.backup, self.joining, self.heard = self.joining, None, time.monotonic()
        path = write_snapshot(server, self._snapshots / "snapshot.npz")
        self._send({"r": "welcome", "address": server.endpoint, "n": self.sent,
                    "version": server.store.version, "snapshot": str(path)})  # fmt: skip
        self.joins += 1
        log.info("backup joined at version %d (input %d)", server.store.version, self.sent)

    def lose(self, why: str) -> None:
        """Serve alone: the held replies go."""
        log.warning("the backup %s: serving alone", why)
        if self.before_alone is not None:  # before any reply the backup lacks leaves
            self.before_alone()
        self.backup = self.waiting_since = None
        self.replies.release(self.sent)

    def end(self) -> None:
        """The primary is done: once the backup acknowledged everything (at most
        the bound), the last replies go and the backup is told to exit."""
        deadline = time.monotonic() + self.bound
        while self.waiting_since is not None and time.monotonic() < deadline:
            if self.socket.poll(50):
                self.read()
        if self.backup is not None:
            if self.waiting_since is not None:
                self.lose("did not acknowledge the last inputs")
                return
            self._send({"r": "end"})
            self.backup = None

    def close(self) -> None:
        self.socket.close()
        if self._gatekeeper is not None:
            self._gatekeeper.stop()
        shutil.rmtree(self._snapshots, ignore_errors=True)

    def _send(self, header: dict[str, Any], frames: list[Any] | tuple = ()) -> None:
        self.socket.send_multipart([self.backup, pack(header), *frames], copy=False)
        self.last_sent = time.monotonic()


ORPHAN_AGE = 600.0  # seconds: a dead primary's snapshot directory older than this is removed
SNAPSHOTS = "minips-snapshot-"  # a primary's snapshot directory: SNAPSHOTS + its pid + "-..."


def snapshots_dir() -> Path:
    """A new directory for this primary's snapshots, the owner's alone (mkdtemp: mode 0700):
    the state in a file nobody else reads. Its name carries the process id, so that the next
    primary removes what a killed one left (a SIGKILL runs no clean-up)."""
    remove_orphaned_snapshots(Path(tempfile.gettempdir()))
    return Path(tempfile.mkdtemp(prefix=f"{SNAPSHOTS}{os.getpid()}-"))


def remove_orphaned_snapshots(parent: Path) -> list[Path]:
    """Remove the snapshot directories in `parent` that this user's processes made, that
    outlived them (their pid is gone) and that are older than ORPHAN_AGE; the ones removed."""
    removed = []
    for path in parent.glob(f"{SNAPSHOTS}*-*"):
        pid = path.name[len(SNAPSHOTS) :].split("-", 1)[0]
        try:
            mine = path.stat().st_uid == os.getuid()
        except OSError:
            continue  # removed meanwhile
        if pid.isdigit() and mine and not _alive(int(pid)) and _older_than(path, ORPHAN_AGE):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _older_than(path: Path, seconds: float) -> bool:
    """Left long enough ago: a backup welcomed just before its primary died may still be
    reading the snapshot in it."""
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def link_message(frames: list[bytes]) -> tuple[bytes | None, dict[str, Any]]:
    """A message the link received: its sender and its map; ({}: nothing) for frames that
    are not one (garbage costs the sender its message, never the primary its loop)."""
    if len(frames) < 2:
        return None, {}
    try:
        body = unpack(frames[1])
    except (ValueError, TypeError):  # msgpack's errors are ValueErrors; a map's bad key
        return None, {}
    return frames[0], body if isinstance(body, dict) else {}


def link_keys(keys: curve.ServerKeys) -> curve.ServerKeys:
    """The link's admission: the server's own public key alone (a backup is a replica of
    this server, so it holds the server's pair; the clients' keys admit no one here)."""
    return curve.ServerKeys(keys.pair, frozenset({keys.pair.public}), frozenset())


def link_client(socket: zmq.Socket, keys: curve.ServerKeys | None) -> None:
    """A backup's link socket: under keys a CURVE client with the server's own pair, which
    the primary admits and no one without the server's secret key can present."""
    if keys is not None:
        curve.make_curve_client(socket, curve.ClientKeys(keys.pair, keys.pair.public))


def input_header(frames: list[Any], dropped: int) -> dict[str, Any]:
    """The header of a forwarded request: `key` is its sender's (the Z85 text, under CURVE
    only: a run without keys forwards what it always did)."""
    header: dict[str, Any] = {"r": "input", "dropped": dropped}
    key = auth.sender_key(frames[0]) if frames and isinstance(frames[0], zmq.Frame) else None
    if key is not None:
        header["key"] = key.decode("ascii")
    return header


class KeyedFrame(zmq.Frame):
    """A forwarded request's routing-id frame as the backup's handlers read it: with the
    key the primary received the request with (auth.sender_key reads `User-Id`)."""

    sender: str | None = None

    def get(self, option: Any) -> Any:
        return self.sender if option == "User-Id" else super().get(option)


def with_sender(frames: list[Any], body: dict[str, Any]) -> list[Any]:
    """The forwarded `frames` with their sender's key (`body["key"]`), as the primary had them."""
    key = body.get("key")
    if not isinstance(key, str) or not frames:
        return frames
    first = KeyedFrame(bytes(frames[0]))
    first.sender = key
    return [first, *frames[1:]]
