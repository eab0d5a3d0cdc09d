"""A launched group's shard with a backup: ranks 1..K-1 of `minips launch --servers K
--replicas 2`.

Without replicas such a rank becomes its shard's server (exec). With them it stays, and
runs the shard's primary and backup as its own two child processes, watched by the same
ReplicaWatch that `minips run --servers K --replicas 2` gives that shard
(minips.run.replicas): when the primary dies, the backup takes its address over and a new
backup joins, while the launcher, which ends the whole job when a rank dies (mpirun),
sees no rank die. Both children are on this rank's host, the only place the backup can
bind its primary's address. One difference from `minips run`: a shard that lost both
replicas is not restarted from its checkpoint here; the rank ends with its error (and
the launcher ends the job, as when an unreplicated shard's rank dies).

The rank starts nothing before the root listens: rank 0 claims and prepares the run
directory first, so this rank's logs and files are never taken for (or cleared with) a
previous run's. It ends once its shard's server stopped with the root, and writes its
pair's records beside the shard's endpoint file (`replication_file`), where the
coordinator reads them for the run's summary (minips.run.cluster.LaunchedRun).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from minips.errors import MinipsError
from minips.results.rundir import RunDir
from minips.results.whole_file import write_whole
from minips.run.processes import SINGLE_THREADED_BLAS, ProcessGroup, signals_stop_the_run
from minips.run.replicas import ReplicaWatch


def replication_file(endpoint_file: Path) -> Path:
    """Where a shard's rank writes its pair's records once both replicas stopped (beside
    the shard's endpoint file, among the files a new run clears)."""
    return Path(f"{endpoint_file}-replication")


def supervise(
    argv: list[str],
    root: tuple[str, int],
    shard: int,
    servers: int,
    run_dir: RunDir,
    startup_timeout: float,
) -> None:
    """Serve shard `shard` of a group of `servers` as a replicated pair: its primary runs
    `argv` (`minips server --shard ...`, joining the root at `root`, host and port).
    Returns once the shard stopped with its root; MinipsError (one line) when the root
    does not listen or the pair does not start within `startup_timeout` s, or when the
    shard's server died with no backup holding its state. SIGTERM or SIGINT stops both
    replicas first (KeyboardInterrupt, as `minips run` does)."""
    deadline = time.monotonic() + startup_timeout
    _wait_for_root(*root, shard, startup_timeout)
    run_dir.logs.mkdir(parents=True, exist_ok=True)  # a directory of this host's own, maybe
    t0 = time.monotonic()  # the clock of this pair's logs and records
    env = {**SINGLE_THREADED_BLAS, **os.environ, "PYTHONUNBUFFERED": "1"}
    processes = ProcessGroup(run_dir.logs, env)
    host, port = root
    address = f"tcp://{f'[{host}]' if ':' in host else host}:{port}"
    watch = ReplicaWatch(processes, run_dir.config, run_dir, t0, shard, servers, root=address)
    with signals_stop_the_run():
        try:
            processes.start(watch.name, [*argv, "--t0", repr(t0)])
            watch.start_backup(max(1.0, deadline - time.monotonic()))
            _watch_until_stopped(processes, watch)
        finally:
            processes.stop_all()
            _write_records(watch, replication_file(run_dir.shard_endpoint(shard)))


def _wait_for_root(host: str, port: int, shard: int, timeout: float) -> None:
    """Return once the root accepts a connection (rank 0 listens only once the run
    directory is ready); MinipsError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:  # not listening yet
            time.sleep(0.2)
    raise MinipsError(f"shard {shard}: the root at {host}:{port} did not listen within "
                      f"{timeout:g} s (did rank 0 start?)")  # fmt: skip


def _watch_until_stopped(processes: ProcessGroup, watch: ReplicaWatch) -> None:
    """Look at the pair every 0.2 s until the shard's server stopped cleanly: a dead
    primary whose backup runs is replaced by it (the next look), a dead backup by a new
    one (ReplicaWatch.check); a dead server that no backup can replace is the error."""
    while True:
        watch.check()
        server = processes[watch.name]
        if server.code() == 0:
            return  # stopped with the root; its backup leaves with it
        # A primary that died after this look's check still has its backup: the next
        # look makes that one the server, so it is no error yet.
        if server.crashed() and watch.live_backup() is None:
            raise MinipsError(
                f"shard {watch.shard}'s server exited with code {server.code()} and no "
                f"backup held its state: {server.last_line(processes.logs)} "
                f"(see {processes.logs / server.log_name}.log)"
            )
        time.sleep(0.2)


def _write_records(watch: ReplicaWatch, path: Path) -> None:
    """The pair's records (ReplicaWatch.records), written whole or not at all."""
    write_whole(path, json.dumps(watch.records()) + "\n")
