"""The primary's side of the replication link on real sockets, no server: a reply waits for
the acknowledgement of the input it came after; acknowledgements count only from the
backup, only as integers, never past what was sent; a silent backup is let go past the
bound, the fence first, then the held replies; a quiet link beats; a primary that ends
waits for the last acknowledgements before it tells the backup to end (docs/protocol.md 17);
the snapshot directory a killed primary left is removed by the next one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import msgpack
import zmq

from minips.ops.replica_link import (
    BEAT,
    FAILOVER_AFTER,
    SNAPSHOTS,
    HeldReplies,
    PrimaryLink,
    remove_orphaned_snapshots,
    snapshots_dir,
)


class Backup:
    """A backup's end of the link: a DEALER that joins, reads inputs and acknowledges them."""

    def __init__(self, context: zmq.Context, link: PrimaryLink) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(link.endpoint)

    def send(self, body: dict) -> None:
        self.socket.send(msgpack.packb(body))

    def ack(self, n: object) -> None:
        self.send({"r": "ack", "n": n})

    def receive(self, timeout_ms: int = 2000) -> dict | None:
        """The next message's map (None: nothing within the timeout)."""
        if not self.socket.poll(timeout_ms):
            return None
        return msgpack.unpackb(self.socket.recv_multipart()[0])


@contextmanager
def linked() -> Iterator[tuple[PrimaryLink, Backup, zmq.Socket]]:
    """A link with a backup attached (as a welcome leaves it) and the clients' end of the
    primary's replies (what HeldReplies lets go arrives there)."""
    with zmq.Context() as context:
        server_side, client_side = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
        server_side.bind("inproc://replies")
        client_side.connect("inproc://replies")
        link = PrimaryLink(context, "tcp://127.0.0.1:*", HeldReplies(server_side))
        backup = Backup(context, link)
        backup.send({"r": "join"})
        deadline = time.monotonic() + 10
        while link.joining is None:
            assert time.monotonic() < deadline, "the join never arrived"
            link.read()
            time.sleep(0.01)
        link.backup, link.joining, link.heard = link.joining, None, time.monotonic()
        try:
            yield link, backup, client_side
        finally:
            link.close()
            for socket in (backup.socket, server_side, client_side):
                socket.close(linger=0)


def _replies(client_side: zmq.Socket, timeout_ms: int = 300) -> list[bytes]:
    """Every reply that left, in order, waiting at most `timeout_ms` for the first."""
    got = []
    while client_side.poll(timeout_ms if not got else 50):
        got.append(client_side.recv())
    return got


def _read_until(link: PrimaryLink, done, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the link never read it"
        link.read()
        time.sleep(0.01)


def test_a_reply_waits_for_the_acknowledgement_of_the_input_it_came_after():
    with linked() as (link, backup, clients):
        link.forward({"r": "input"}, [b"request-1"])
        link.replies.send_multipart([b"reply-1"])
        link.forward({"r": "input"}, [b"request-2"])
        link.replies.send_multipart([b"reply-2"])
        sent = [backup.receive(), backup.receive()]
        assert [m["n"] for m in sent] == [1, 2]  # numbered from the first, in order
        assert _replies(clients) == []  # neither input is held by the backup yet
        backup.ack(1)
        _read_until(link, lambda: link.replies.acked == 1)
        assert _replies(clients) == [b"reply-1"]  # the second's input is not acknowledged
        backup.ack(2)
        _read_until(link, lambda: link.replies.acked == 2)
        assert _replies(clients) == [b"reply-2"]
        assert link.waiting_since is None  # everything sent is acknowledged


def test_an_acknowledgement_counts_only_from_the_backup_as_an_integer_up_to_what_was_sent():
    with linked() as (link, backup, clients), zmq.Context() as context:
        link.forward({"r": "input"})
        link.replies.send_multipart([b"reply-1"])
        stranger = Backup(context, link)
        stranger.ack(1)  # not the backup
        backup.ack(True)  # a bool is not an input number
        backup.ack("1")
        backup.ack(None)
        time.sleep(0.3)
        link.read()
        assert _replies(clients) == [] and link.replies.acked == 0
        backup.ack(5)  # ahead of what was sent: taken as everything sent, no more
        _read_until(link, lambda: link.replies.acked > 0)
        assert link.replies.acked == 1 and _replies(clients) == [b"reply-1"]
        link.forward({"r": "input"})
        link.replies.send_multipart([b"reply-2"])
        assert _replies(clients) == []  # input 2 was never acknowledged
        stranger.socket.close(linger=0)


def test_a_backup_heard_within_the_bound_is_kept_and_its_replies_held():
    with linked() as (link, backup, clients):
        link.forward({"r": "input"})
        link.replies.send_multipart([b"reply-1"])
        link.waiting_since = link.heard = time.monotonic() - FAILOVER_AFTER / 2
        link.turn(time.monotonic(), server=None)
        assert link.backup is not None and _replies(clients) == []


def test_a_silent_backup_is_let_go_the_fence_first_then_its_held_replies():
    with linked() as (link, backup, clients):
        link.forward({"r": "input"})
        link.replies.send_multipart([b"reply-1"])
        seen_at_fence = []
        link.before_alone = lambda: seen_at_fence.append(_replies(clients, timeout_ms=100))
        link.waiting_since = link.heard = time.monotonic() - FAILOVER_AFTER - 0.5
        link.turn(time.monotonic(), server=None)
        assert seen_at_fence == [[]]  # the fence ran, before any held reply left
        assert link.backup is None and _replies(clients) == [b"reply-1"]
        link.forward({"r": "input"})  # alone: nothing numbered, nothing held
        link.replies.send_multipart([b"reply-2"])
        assert _replies(clients) == [b"reply-2"] and link.sent == 1


def test_a_quiet_link_beats_well_within_the_bound():
    with linked() as (link, backup, clients):
        link.last_sent = time.monotonic() - BEAT * 1.5  # quiet for a beat and a half
        link.turn(time.monotonic(), server=None)
        assert backup.receive(500) == {"r": "beat"}
        assert BEAT * 3 < FAILOVER_AFTER  # a few beats lost in a row let no backup go


def test_a_primary_that_ends_tells_the_backup_once_it_acknowledged_everything():
    with linked() as (link, backup, clients):
        link.forward({"r": "input"})
        link.replies.send_multipart([b"reply-1"])
        assert backup.receive()["n"] == 1
        backup.ack(1)  # read by end(), which waits for it
        link.end()
        assert backup.receive() == {"r": "end"}
        assert _replies(clients) == [b"reply-1"] and link.backup is None


def test_a_primary_that_ends_before_the_last_acknowledgement_lets_the_backup_go():
    fence = []
    with linked() as (link, backup, clients):
        link.before_alone = lambda: fence.append(True)
        link.forward({"r": "input"})
        link.replies.send_multipart([b"reply-1"])
        started = time.monotonic()
        link.end()  # never acknowledged
        assert time.monotonic() - started >= FAILOVER_AFTER  # it waited the bound out
        assert fence == [True] and _replies(clients) == [b"reply-1"]
        assert backup.receive()["r"] == "input" and backup.receive(300) is None  # no end


def test_a_new_primary_removes_the_snapshots_a_killed_one_left_and_keeps_live_ones(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    left = tmp_path / f"{SNAPSHOTS}{gone.pid}-abc"
    live = tmp_path / f"{SNAPSHOTS}{os.getpid()}-def"
    unnamed = tmp_path / f"{SNAPSHOTS}xyz"  # not a name this code makes: not ours to remove
    recent = tmp_path / f"{SNAPSHOTS}{gone.pid}-ghi"  # its backup may still be reading it
    for path in (left, live, unnamed, recent):
        path.mkdir()
        (path / "snapshot.npz").write_bytes(b"state")
    an_hour_ago = time.time() - 3600
    for path in (left, live, unnamed):
        os.utime(path, (an_hour_ago, an_hour_ago))
    assert remove_orphaned_snapshots(tmp_path) == [left]
    assert not left.exists() and live.exists() and unnamed.exists() and recent.exists()


def test_a_primary_s_snapshot_directory_is_named_for_its_process_and_its_owner_s_alone():
    made = snapshots_dir()
    try:
        assert made.name.startswith(f"{SNAPSHOTS}{os.getpid()}-")
        assert made.stat().st_mode & 0o777 == 0o700
    finally:
        made.rmdir()
