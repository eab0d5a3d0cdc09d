"""A replicated server (`--replicas 2`) as `minips server` runs it and `minips run` watches it.

`minips server --replicas 2` is the primary: it serves the clients' address and listens on
a replication link (written beside its endpoint file, `<endpoint file>-link`) for its
backup, `minips server --backup-of LINK` from the same configuration (minips.server.
replication). `minips run --replicas 2` starts both; when the primary dies the backup
takes over on the same address, and `ReplicaWatch` makes it the run's server ("server"),
records the failover for the summary, and starts a replacement backup, which joins the
new primary with a snapshot of its state (minips.ops.snapshot) while training goes on.
A primary lost before its replacement joined (no replica holds the state) is restarted
from its checkpoint instead, as without replicas. With `--servers K` every shard, the
root too, is such a pair (`ReplicaSet`: one watch per shard, docs/protocol.md 17.5).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from minips.group.shard import Joiner
from minips.ops.replication import BACKUP, PRIMARY, ReplicaSettings, ReplicatedServer
from minips.ops.signals import serve_forever
from minips.results.metrics import MetricsLog, read_metrics
from minips.results.whole_file import write_whole
from minips.run.config import RunConfig
from minips.run.processes import MINIPS, Child, ProcessGroup
from minips.run.recovery import last_logged_version
from minips.server.options import ServerOptions

PRIVATE_BIND = "tcp://127.0.0.1:*"  # a backup's own socket: no client knows it
# Seconds a backup whose primary died has to say it was welcomed (it loads the snapshot it
# was sent at once; one still starting was not welcomed and never will be).
WELCOME_GRACE = 3.0
MAX_REPLACEMENTS = 10  # a replica that keeps dying is a bug to report, not to hide


def replicated(
    config: RunConfig, options: ServerOptions
) -> tuple[type[ReplicatedServer], ServerOptions, dict[str, Any]]:
    """The server class, options and extra arguments of one replica of `config`: a backup
    listens on a private address and writes no checkpoint until it took over."""
    bound = config.failover_after
    if not config.backup_of:
        return (
            ReplicatedServer,
            options,
            {"replica": ReplicaSettings(PRIMARY, failover_after=bound)},
        )
    settings = ReplicaSettings(BACKUP, backup_of=config.backup_of, failover_after=bound,
                               checkpoint_path=options.checkpoint_path)  # fmt: skip
    options = replace(options, bind=PRIVATE_BIND, checkpoint_path=None)
    return ReplicatedServer, options, {"replica": settings}


def link_file(endpoint_file: str | Path) -> Path:
    """Where a primary started with an endpoint file writes its replication link's address."""
    return Path(f"{endpoint_file}-link")


def welcomed_file(endpoint_file: str | Path) -> Path:
    """Where a backup started with an endpoint file writes its pid once its primary
    welcomed it (it holds the state: it can take over)."""
    return Path(f"{endpoint_file}-backup")


class PromotedLog:
    """A backup's updates log, opened when it takes over (before, the primary logs)."""

    def __init__(self, path: str | None, t0: float | None) -> None:
        self.path, self.t0 = path, t0
        self.log: MetricsLog | None = None

    def open(self, record: dict[str, Any]) -> None:
        self.log = MetricsLog(self.path, start_time=self.t0)
        self.log.write("failover", **record)

    def write(self, event: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.write(event, **fields)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def serve_replica(
    config: RunConfig,
    endpoint_file: str | None,
    updates_log: str | None,
    t0: float | None,
    joiner: Joiner | None = None,
) -> ReplicatedServer:
    """`minips server --replicas 2` (the primary) or `--backup-of LINK` (the backup): serve
    until stopped; returns the stopped server. The primary writes its link's address
    beside its endpoint file; the backup logs updates only once it took over. joiner: a
    group's shard 1..K-1 primary's link to its root (its Joiner, asked already); a
    backup of such a shard has one that joins only once it took over."""
    import click

    from minips.run.build import make_server

    backup = bool(config.backup_of)
    if backup and config.servers > 1 and config.shard >= 1:
        joiner = standby_joiner(config)
    log = PromotedLog(updates_log, t0) if backup else MetricsLog(updates_log, start_time=t0)
    try:

        def on_update(record: dict[str, Any]) -> None:
            log.write("update", **{key: value for key, value in record.items() if key != "time"})

        ps = make_server(config, on_update=on_update, joiner=joiner)
        assert isinstance(ps, ReplicatedServer)

        def listening(record: dict[str, Any] | None = None) -> None:
            """Serving: the clients' address and the link's, for a launcher and a person."""
            if record is not None:
                log.open(record)
            click.echo(f"minips server on {ps.endpoint}, rule {config.rule}, replication "
                       f"link {ps.link_endpoint}")  # fmt: skip
            if endpoint_file:
                write_whole(link_file(endpoint_file), (ps.link_endpoint or "") + "\n")
                write_whole(endpoint_file, ps.endpoint + "\n")

        if endpoint_file:  # the fence: the welcomed file names the backup holding the state
            welcomed, pid = welcomed_file(endpoint_file), str(os.getpid())
            ps.on_alone = lambda: welcomed.unlink(missing_ok=True)
            ps.holds_state = lambda: _read(welcomed) == pid
        if backup:
            ps.on_promote = listening
            if endpoint_file:  # the launcher's: this backup holds the state from now on
                ps.on_welcome = lambda: write_whole(welcomed, pid + "\n")
            click.echo(f"minips server: backup of {config.backup_of}, rule {config.rule}")
        else:
            listening()
        serve_forever(ps)
        if ps.role == PRIMARY:  # a backup that never took over leaves no record
            log.write("server", stats=ps.stats(), failovers=ps.failovers)
        return ps
    finally:
        log.close()


def standby_joiner(config: RunConfig) -> Joiner:
    """The root link of a backup of shard `config.shard`: it asks nothing (the primary is
    the shard the root knows) and joins only when its server ticks, once it took over;
    the root gives the index to it once the dead primary's joins stopped (16.3)."""
    from minips.provision.keyfiles import OPERATOR, load_client_keys

    assert config.root is not None  # check_group: a shard >= 1 names its root
    keys = load_client_keys(config.keys, OPERATOR) if config.keys else None  # as join_root's
    return Joiner(config.root, config.shard, config.servers, keys,
                  root_timeout=config.root_timeout)  # fmt: skip


def _failover_record(log: Path) -> dict[str, Any]:
    """The `failover` record a backup that took over wrote first in its log ({}: none)."""
    if not log.exists():
        return {}
    records = read_metrics(log)
    return next((r for r in records if r.get("event") == "failover"), {})


class ReplicaWatch:
    """The replicas of a `minips run`'s server, or of one shard of its group (module
    docstring): the backup's start, the failover the launcher sees when the primary's
    process dies, and a replacement for each replica lost (a new backup, which joins the
    live one with a snapshot of its state). shard / servers: which shard of a group of
    `servers` (a group's shard j's processes are "shard-j", its backups "shard-j-backup..."
    and its files the shard's; the root's and a lone server's "server" and "backup...").
    root: the address a shard's backup joins once it took over (None: the run's endpoint
    file's; a launched shard's rank knows it from the launcher, minips.run.shardrank)."""

    def __init__(self, processes: ProcessGroup, config_file: Path, run_dir: Any, t0: float,
                 shard: int = 0, servers: int = 1, root: str | None = None) -> None:  # fmt: skip
        self.processes, self.config_file, self.dir, self.t0 = processes, config_file, run_dir, t0
        self.shard, self.servers, self.root = shard, servers, root
        self.name = "server" if shard == 0 else f"shard-{shard}"  # the primary's child
        self.endpoint = run_dir.shard_endpoint(shard)
        self.failovers: list[dict[str, Any]] = []
        self.backup_lost: list[dict[str, Any]] = []
        self.replacements: list[dict[str, Any]] = []
        self.unjoined: list[dict[str, Any]] = []
        self.rolled_back: list[dict[str, Any]] = []  # backups a group rollback stopped
        self.backup: str | None = None  # the live backup's child name
        self._backup_log = 1  # the generation of the live backup's updates log
        self._logs: list[tuple[int, int]] = []  # each failover's: (the dead's, the new's)
        self._dead = 0  # primaries lost
        # a promoted backup not known to hold the state yet: until when, the dead primary's
        # log generation, its failover record
        self._pending: tuple[float, int, dict[str, Any]] | None = None
        self.started = 0  # backups started
        self._backup_of = ""  # the link of the primary the live backup follows
        self._dead_link = ""  # the link of the primary that died last (none to join)

    def start_backup(self, timeout: float) -> None:
        """Start the first backup once the primary's link is known."""
        link = self.processes.wait_for_file(link_file(self.endpoint), self.name, timeout)
        self._start(link)

    def _start(self, link: str) -> str:
        """A backup of the primary at `link`; if it ever takes over, it logs its updates
        to the next generation's log (the one after the live primary's)."""
        self.started += 1
        base = "backup" if self.shard == 0 else f"{self.name}-backup"
        name = base if self.started == 1 else f"{base}-{self.started}"
        self._backup_log = self.processes[self.name].generation + 1
        log = self.dir.updates_log(self._backup_log, self.shard)
        command = [*MINIPS, "server", "--config", str(self.config_file), *self._group_options(),
                   "--backup-of", link, "--endpoint-file", str(self.endpoint),
                   "--updates-log", str(log), "--t0", repr(self.t0)]  # fmt: skip
        self.processes.start(name, command)
        self.backup, self._backup_of = name, link
        return name

    def _group_options(self) -> list[str]:
        """A group's shard: its index, and (1..K-1) its root's address, which it joins once
        it took over (the root's backup binds the same one)."""
        if self.servers == 1:
            return []
        root = [] if self.shard == 0 else ["--root", self.root or _read(self.dir.endpoint)]
        return ["--servers", str(self.servers), "--shard", str(self.shard), *root]

    def check(self) -> None:
        """One look: a primary that died while its backup lives is replaced by it (the
        backup becomes the primary's child, with its restart policy; the dead one stays
        as "...-dead-N"); that backup is a failover once it says it was welcomed (it
        holds the state), else it is stopped after WELCOME_GRACE s and the caller
        restarts the server from its checkpoint (minips.run.recovery), as without
        replicas. A replica lost is replaced by a new backup once the live one listens."""
        server = self.processes[self.name]
        backup = self.processes[self.backup] if self.backup is not None else None
        if self._pending is not None:
            self._confirm(server)
        elif backup is not None and backup.crashed() and not server.exited():
            self.backup_lost.append(self._record(exit_code=backup.code()))
            self.backup = None
        elif backup is not None and server.crashed() and not backup.exited():
            self._promote(server, backup)
            self._dead_link = self._backup_of  # until the next primary writes its own
            self.backup = None
        if self.backup is None and self._pending is None and not server.exited():
            address = _read(link_file(self.endpoint))
            if address and address != self._dead_link and self.started <= MAX_REPLACEMENTS:
                name = self._start(address)
                self.replacements.append(self._record(name=name))

    def live_backup(self) -> Child | None:
        """The backup process, while it runs."""
        backup = self.processes[self.backup] if self.backup is not None else None
        return backup if backup is not None and not backup.exited() else None

    def roll_back(self, stopped: list[Child]) -> None:
        """The group goes back to a checkpoint (minips.run.group_recovery), the backups in
        `stopped` stopped with the primaries: a failover pending is settled, this pair's
        stopped backup recorded (neither lost nor replaced; one that had died by itself is
        lost), and the restarted primary gets a new backup once it listens on a new link
        (`check`)."""
        if self._pending is not None:
            self._confirm(self.processes[self.name], final=True)
        if self.backup is not None:
            backup = self.processes[self.backup]
            if any(backup is child for child in stopped):
                self.rolled_back.append(self._record(name=self.backup))
            else:
                self.backup_lost.append(self._record(exit_code=backup.code()))
            self.backup = None
        self._dead_link = _read(link_file(self.endpoint))

    def _promote(self, server: Child, backup: Child) -> None:
        """The backup is the primary's child now, pending its welcome (`_confirm`): a
        crash of it restarts it from its checkpoint, its log the generation it writes."""
        self._dead += 1
        self.processes.children[f"{self.name}-dead-{self._dead}"] = server
        self.processes.children[self.name] = backup
        del self.processes.children[backup.name]
        failover = self._record(exit_code=server.code())
        self._pending = (time.monotonic() + WELCOME_GRACE, server.generation, failover)
        backup.log_as, backup.name = backup.log_name, self.name
        backup.command, backup.policy, server.policy = server.command, server.policy, None
        backup.generation = self._backup_log

    def _confirm(self, promoted: Child, final: bool = False) -> None:
        """The promoted backup's failover counts once it was welcomed. One that was not
        within WELCOME_GRACE s holds no state: it is killed, as the dead primary's next
        generation (its restart's log follows the dead one's). final: the run is over,
        nothing is killed: the failover is one or it is not."""
        assert self._pending is not None
        deadline, dead_generation, failover = self._pending
        if _read(welcomed_file(self.endpoint)) == str(promoted.pid):
            self._logs.append((dead_generation, promoted.generation))
            self.failovers.append(failover)
            self._pending = None
        elif final or promoted.exited() or time.monotonic() > deadline:
            if not (final or promoted.exited()):
                promoted.kill()
            self.unjoined.append({**failover, "name": promoted.log_name})
            promoted.generation = dead_generation
            self._pending = None

    def records(self) -> dict[str, Any]:
        """The summary's replication fields. Each failover's `redone`: the updates the dead
        primary applied past the last input its backup held (its log's `failover`
        record's version). Their replies were held, never sent, so their workers sent
        them again to the new primary: done twice on the way, once in the model. None
        are lost: a reply leaves only once the backup holds its input (protocol.md 17).
        `unjoined`: the backups stopped because their primary died before it welcomed
        them (the server then restarted from its checkpoint, as without replicas);
        `rolled_back`: those stopped when an ssgd group went back to a checkpoint."""
        if self._pending is not None:  # the run ended within a failover's grace
            self._confirm(self.processes[self.name], final=True)
        for failover, (dead_log, own_log) in zip(self.failovers, self._logs, strict=True):
            taken = _failover_record(self.dir.updates_log(own_log, self.shard))
            dead = last_logged_version(self.dir.updates_log(dead_log, self.shard))
            failover["version"] = taken.get("version")
            failover["takeover_s"] = taken and round(taken["silent_s"] + taken["bind_s"], 3)
            failover["redone"] = max(0, dead - taken["version"]) if taken else None
        return {"replicas": 2, "failovers": self.failovers, "backups_lost": self.backup_lost,
                "replacements": self.replacements, "unjoined": self.unjoined,
                "rolled_back": self.rolled_back}  # fmt: skip

    def _record(self, **fields: Any) -> dict[str, Any]:
        """A record of this pair's: when, and a group's shard."""
        shard = {"shard": self.shard} if self.servers > 1 else {}
        return {**shard, **fields, "at_s": round(time.monotonic() - self.t0, 3)}


class ReplicaSet:
    """Every replicated server of a run: one ReplicaWatch for a lone server, one per shard
    for a group (the root's first). Its records merge theirs (each names its `shard`).
    shards: how many of them, from the root on, are this launcher's children (default:
    all; `minips launch`'s coordinator runs the root's pair alone);
    `reported`: the records of pairs another process watched (a launched group's shard
    ranks, minips.run.shardrank), merged too."""

    def __init__(self, processes: ProcessGroup, config_file: Path, run_dir: Any, t0: float,
                 servers: int, shards: int | None = None) -> None:  # fmt: skip
        self.watches = [ReplicaWatch(processes, config_file, run_dir, t0, shard, servers)
                        for shard in range(servers if shards is None else shards)]  # fmt: skip
        self.reported: list[dict[str, Any]] = []

    def start_backups(self, timeout: float) -> None:
        """Each primary's first backup, in shard order (a shard's primary listens once the
        root, which waits for its own backup, gave it its configuration)."""
        for watch in self.watches:
            watch.start_backup(timeout)

    def started(self) -> bool:
        """Whether the first backups were started (`start_backups`)."""
        return all(watch.started for watch in self.watches)

    def check(self) -> None:
        """One look at every pair (ReplicaWatch.check)."""
        for watch in self.watches:
            watch.check()

    def backs_up(self, shard: int) -> bool:
        """Whether shard `shard` (0: the root or the one server) has a backup running."""
        return self.watches[shard].live_backup() is not None

    def live_backups(self) -> list[Child]:
        """Every backup process that runs (a group rollback stops them with the primaries)."""
        return [backup for watch in self.watches if (backup := watch.live_backup())]

    def roll_back(self, stopped: list[Child]) -> None:
        """The backups in `stopped` were stopped by a group rollback (ReplicaWatch.roll_back)."""
        for watch in self.watches:
            watch.roll_back(stopped)

    def records(self) -> dict[str, Any]:
        """The summary's `replication`: every pair's records, in the order they happened."""
        merged: dict[str, Any] = {"replicas": 2, "failovers": [], "backups_lost": [],
                                  "replacements": [], "unjoined": [],
                                  "rolled_back": []}  # fmt: skip
        for pair in [*(watch.records() for watch in self.watches), *self.reported]:
            for key, records in pair.items():
                if isinstance(records, list):
                    merged[key] += records
        for records in merged.values():  # in the order they happened
            if isinstance(records, list):
                records.sort(key=lambda record: record["at_s"])
        return merged


def _read(path: Path) -> str:
    """The address a process wrote to `path` ("" while there is none)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""
