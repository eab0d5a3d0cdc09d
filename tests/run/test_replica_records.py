"""What the summary says of a failover, from the two replicas' update logs (minips.run.
replicas.ReplicaWatch): the version the backup took over at, how long the takeover took
(the link's silence and the bind), and the updates the dead primary did past what its
backup held (`redone`); a promoted backup counts as a failover only once the fence's file
names it, and one never welcomed within the grace is stopped and recorded as unjoined."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from minips.results.rundir import RunDir
from minips.run.processes import ProcessGroup
from minips.run.replicas import WELCOME_GRACE, ReplicaWatch, link_file, welcomed_file


class Promoted:
    """A promoted backup as the watch sees it: its pid, its log's generation, alive or not."""

    def __init__(self, pid: int, generation: int) -> None:
        self.pid, self.generation, self.log_name = pid, generation, "backup"
        self.killed = False

    def exited(self) -> bool:
        return self.killed

    def kill(self) -> None:
        self.killed = True


def _log(path: Path, *records: dict) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def _watch(tmp_path: Path, shard: int = 1, servers: int = 2) -> ReplicaWatch:
    run_dir = RunDir(tmp_path)
    return ReplicaWatch(None, tmp_path / "config.json", run_dir, time.monotonic(), shard, servers)


def _pending(watch: ReplicaWatch, dead_generation: int, grace: float = WELCOME_GRACE) -> None:
    failover = watch._record(exit_code=-9)
    watch._pending = (time.monotonic() + grace, dead_generation, failover)


def test_a_welcomed_backup_is_a_failover_read_from_both_logs(tmp_path):
    watch = _watch(tmp_path)
    dead, promoted = 0, Promoted(pid=4242, generation=1)
    _log(
        watch.dir.updates_log(dead, 1), *({"event": "update", "version": v} for v in range(50, 58))
    )
    _log(watch.dir.updates_log(1, 1),
         {"event": "failover", "silent_s": 1.02, "bind_s": 0.05, "version": 55},
         *({"event": "update", "version": v} for v in range(56, 61)))  # fmt: skip
    welcomed_file(watch.endpoint).write_text("4242\n")  # the fence names it
    _pending(watch, dead)
    watch._confirm(promoted)
    records = watch.records()
    (failover,) = records["failovers"]
    assert failover["shard"] == 1 and failover["exit_code"] == -9
    assert failover["version"] == 55
    assert failover["takeover_s"] == pytest.approx(1.07)  # the silence, then the bind
    assert failover["redone"] == 2  # 56 and 57: done by the dead primary, again by this one
    assert records["unjoined"] == [] and not promoted.killed


def test_a_promoted_backup_the_fence_does_not_name_is_stopped_after_the_grace(tmp_path):
    watch = _watch(tmp_path)
    promoted = Promoted(pid=4242, generation=1)
    welcomed_file(watch.endpoint).write_text("999\n")  # another backup holds the state
    _pending(watch, dead_generation=0, grace=0.2)
    watch._confirm(promoted)
    assert watch._pending is not None and not promoted.killed  # within its grace: waited for
    time.sleep(0.3)
    watch._confirm(promoted)
    assert promoted.killed and watch.failovers == []
    (unjoined,) = watch.records()["unjoined"]
    assert unjoined["shard"] == 1 and promoted.generation == 0  # it logs as the dead one's next


def test_every_record_of_a_group_names_its_shard_the_roots_too(tmp_path):
    assert _watch(tmp_path, shard=0, servers=2)._record()["shard"] == 0
    assert "shard" not in _watch(tmp_path, shard=0, servers=1)._record()  # a lone server


@pytest.mark.parametrize(("status", "lost"), [(0, False), (1, True)])
def test_only_a_backup_that_failed_is_lost_and_replaced(tmp_path, status, lost):
    """A backup exits 0 when its primary told it the run ended (`end`), while the primary
    still writes its last checkpoint: a look then finds nothing lost. One that failed
    (status 1) while its primary lives is lost, and a replacement is started."""
    logs = tmp_path / "logs"
    logs.mkdir()
    processes = ProcessGroup(logs, dict(os.environ))
    watch = ReplicaWatch(processes, tmp_path / "config.json", RunDir(tmp_path), time.monotonic())
    try:
        processes.start("server", [sys.executable, "-c", "import time; time.sleep(60)"])
        processes.start("backup", [sys.executable, "-c", f"raise SystemExit({status})"])
        watch.backup = "backup"
        link_file(watch.endpoint).write_text("tcp://127.0.0.1:9\n")  # the live primary's
        assert processes["backup"].wait_exit(30)
        watch.check()
    finally:
        processes.stop_all(grace=1)
    assert [record["exit_code"] for record in watch.backup_lost] == ([status] if lost else [])
    assert len(watch.replacements) == (1 if lost else 0)


def test_after_a_failover_the_replacement_follows_the_new_primarys_link(tmp_path):
    """The primary dies; the promoted backup is welcomed (the fence names it) before it took
    over and wrote its own link: no replacement is started against the dead primary's link
    (it would never be welcomed); one is, once the new link is written."""
    logs = tmp_path / "logs"
    logs.mkdir()
    processes = ProcessGroup(logs, dict(os.environ))
    watch = ReplicaWatch(processes, tmp_path / "config.json", RunDir(tmp_path), time.monotonic())
    dead_link, new_link = "tcp://127.0.0.1:9", "tcp://127.0.0.1:10"
    try:
        processes.start("server", [sys.executable, "-c", "import os; os.abort()"])
        backup = processes.start("backup", [sys.executable, "-c", "import time; time.sleep(60)"])
        watch.backup, watch._backup_of, watch.started = "backup", dead_link, 1
        link_file(watch.endpoint).write_text(dead_link + "\n")
        welcomed_file(watch.endpoint).write_text(f"{backup.pid}\n")
        assert processes["server"].wait_exit(30)
        watch.check()  # promoted, pending its welcome
        watch.check()  # welcomed: a failover
        assert len(watch.failovers) == 1 and watch.replacements == []
        link_file(watch.endpoint).write_text(new_link + "\n")  # it took over
        watch.check()
        (replacement,) = watch.replacements
        command = processes[replacement["name"]].command(0)
    finally:
        processes.stop_all(grace=1)
    assert command[command.index("--backup-of") + 1] == new_link
