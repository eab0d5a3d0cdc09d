"""A root outlives its shards by a bound too (minips/group/lost_shards.py): a shard of a group
served by hand that is killed leaves a root that ends within --root-timeout seconds with one
`error:` line naming it, its checkpoint not written again; a shard that joins again in time
(a restart) is not gone. Real processes on loopback, and the root's table alone."""

from __future__ import annotations

import signal
import time
from types import SimpleNamespace

import pytest

from minips.group.lost_shards import ShardGone, check_joins
from minips.group.shard import RootTable
from tests.group.test_group_orphan import _free_port, _joined, _start, _stop


def test_a_killed_shard_ends_its_root_served_by_hand_with_one_error_line(tmp_path):
    port = _free_port()
    root_addr = f"tcp://127.0.0.1:{port}"
    checkpoint = tmp_path / "ck.npz"
    root = _start("--shard", "0", "--bind", root_addr, "--root-timeout", "3",
                  "--checkpoint", str(checkpoint), out=tmp_path / "root.log")  # fmt: skip
    shard = _start("--shard", "1", "--root", root_addr, "--bind", "tcp://127.0.0.1:*",
                   out=tmp_path / "shard.log")  # fmt: skip
    try:
        address = _joined(root_addr)[1]
        own = tmp_path / "ck-shard0.npz"
        written = own.stat().st_mtime_ns if own.exists() else None
        shard.send_signal(signal.SIGKILL)
        shard.wait(10)
        killed = time.monotonic()
        root.wait(25)  # before: it served on, with no worker, until stopped
        took = time.monotonic() - killed
    finally:
        _stop(root, shard)
    text = (tmp_path / "root.log").read_text()
    assert 2 <= took < 15, (took, text[-1500:])  # silent 3 s since the shard's last join
    assert root.returncode == 2, text[-1500:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-1500:]
    assert f"shard 1 of the server group ({address}) sent no join for 3 s" in errors[0]
    assert f"its checkpoint {own} is kept as last written" in errors[0]
    assert (own.stat().st_mtime_ns if own.exists() else None) == written  # not written again
    assert not checkpoint.exists()  # a root by hand never writes the group's checkpoint


def _table() -> RootTable:
    table = RootTable(3, "tcp://root:1")
    table.join({"servers": 3, "shard": 1, "address": "tcp://a:1"}, b"one", now=100.0)
    table.join({"servers": 3, "shard": 2, "address": "tcp://b:2"}, b"two", now=100.0)
    return table


def test_a_shard_silent_past_the_timeout_is_gone_and_named():
    table = _table()
    check_joins(table, 104.9, 5.0)  # within the bound: nothing
    table.join({"servers": 3, "shard": 1, "address": "tcp://a:1"}, b"one", now=104.0)
    with pytest.raises(ShardGone) as gone:
        check_joins(table, 105.5, 5.0, SimpleNamespace(path="G/ck-shard0.npz"))
    assert gone.value.shard == 2
    assert str(gone.value).startswith("shard 2 of the server group (tcp://b:2) sent no join "
                                      "for 5 s")  # fmt: skip
    assert "its checkpoint G/ck-shard0.npz is kept as last written" in str(gone.value)
    check_joins(table, 1000.0, None)  # no timeout: a shard is never gone


def test_a_restarted_shard_asking_again_in_time_is_not_gone():
    table = _table()
    # its new process asks what to be (no address) once the old one's index is free
    table.join({"servers": 3, "shard": 1, "address": None}, b"new", now=104.0)
    table.join({"servers": 3, "shard": 2, "address": "tcp://b:2"}, b"two", now=104.0)
    check_joins(table, 108.0, 5.0)
    assert table.silent(109.5, 5.0) == [1, 2]


def test_a_shard_that_never_joined_is_missing_not_gone():
    table = RootTable(2, "tcp://root:1")
    table.join({"servers": 2, "shard": 1, "address": None}, b"asker", now=0.0)  # a reservation
    assert table.silent(100.0, 5.0) == [] and table.missing() == [1]
