"""A replicated server (`--replicas 2`) as `minips server` runs it and `minips run` watches it.

`minips server --replicas 2` is the primary: it serves the clients' address and listens on
a replication link (written beside its endpoint file, `<endpoint file>-link`) for its
backup, `minips server --backup-of LINK` from the same configuration (minips.server.
replication). `minips run --replicas 2` starts both; when the primary dies the backup
takes over on the same address, and `ReplicaWatch` makes it the run's server ("server"),
records the failover for the summary, and starts a replacement backup, which joins the
new primary with a snapshot of its state (minips.ops.snapshot) while training goes on.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from minips.ops.replication import BACKUP, PRIMARY, ReplicaSettings, ReplicatedServer
from minips.results.metrics import MetricsLog, read_metrics
from minips.run.config import RunConfig
from minips.run.processes import MINIPS, ProcessGroup
from minips.run.recovery import last_logged_version
from minips.server.options import ServerOptions

PRIVATE_BIND = "tcp://127.0.0.1:*"  # a backup's own socket: no client knows it
MAX_REPLACEMENTS = 10  # a replica that keeps dying is a bug to report, not to hide


def replicated(
    config: RunConfig, options: ServerOptions
) -> tuple[type[ReplicatedServer], ServerOptions, dict[str, Any]]:
    """The server class, options and extra arguments of one replica of `config`: a backup
    listens on a private address and writes no checkpoint until it took over."""
    if not config.backup_of:
        return ReplicatedServer, options, {"replica": ReplicaSettings(PRIMARY)}
    settings = ReplicaSettings(BACKUP, backup_of=config.backup_of,
                               checkpoint_path=options.checkpoint_path)  # fmt: skip
    options = replace(options, bind=PRIVATE_BIND, checkpoint_path=None)
    return ReplicatedServer, options, {"replica": settings}


def link_file(endpoint_file: str | Path) -> Path:
    """Where a primary started with an endpoint file writes its replication link's address."""
    return Path(f"{endpoint_file}-link")


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
    config: RunConfig, endpoint_file: str | None, updates_log: str | None, t0: float | None
) -> ReplicatedServer:
    """`minips server --replicas 2` (the primary) or `--backup-of LINK` (the backup): serve
    until stopped; returns the stopped server. The primary writes its link's address
    beside its endpoint file; the backup logs updates only once it took over."""
    import click

    from minips.run.build import make_server

    backup = bool(config.backup_of)
    log = PromotedLog(updates_log, t0) if backup else MetricsLog(updates_log, start_time=t0)
    try:

        def on_update(record: dict[str, Any]) -> None:
            log.write("update", **{key: value for key, value in record.items() if key != "time"})

        ps = make_server(config, on_update=on_update)
        assert isinstance(ps, ReplicatedServer)

        def listening(record: dict[str, Any] | None = None) -> None:
            """Serving: the clients' address and the link's, for a launcher and a person."""
            if record is not None:
                log.open(record)
            click.echo(f"minips server on {ps.endpoint}, rule {config.rule}, replication "
                       f"link {ps.link_endpoint}")  # fmt: skip
            if endpoint_file:
                _write_atomically(link_file(endpoint_file), ps.link_endpoint or "")
                _write_atomically(Path(endpoint_file), ps.endpoint)

        if backup:
            ps.on_promote = listening
            click.echo(f"minips server: backup of {config.backup_of}, rule {config.rule}")
        else:
            listening()
        ps.serve_forever()
        if ps.role == PRIMARY:  # a backup that never took over leaves no record
            log.write("server", stats=ps.stats(), failovers=ps.failovers)
        return ps
    finally:
        log.close()


def _write_atomically(path: Path, text: str) -> None:
    """The launcher never reads half an address."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def _failover_record(log: Path) -> dict[str, Any]:
    """The `failover` record a backup that took over wrote first in its log ({}: none)."""
    if not log.exists():
        return {}
    records = read_metrics(log)
    return next((r for r in records if r.get("event") == "failover"), {})


class ReplicaWatch:
    """The replicas of a `minips run` (module docstring): the backup's start, the failover
    the launcher sees when the primary's process dies, and a replacement for each replica
    lost (a new backup, which joins the live one with a snapshot of its state)."""

    def __init__(self, processes: ProcessGroup, config_file: Path, run_dir: Any,
                 t0: float) -> None:  # fmt: skip
        self.processes, self.config_file, self.dir, self.t0 = processes, config_file, run_dir, t0
        self.failovers: list[dict[str, Any]] = []
        self.backup_lost: list[dict[str, Any]] = []
        self.replacements: list[dict[str, Any]] = []
        self.backup: str | None = None  # the live backup's child name
        self.started = 0  # backups started
        self._backup_of = ""  # the link of the primary the live backup follows
        self._dead_link = ""  # the link of the primary that died last (none to join)

    def start_backup(self, timeout: float) -> None:
        """Start the first backup once the primary's link is known."""
        link = self.processes.wait_for_file(link_file(self.dir.endpoint), "server", timeout)
        self._start(link)

    def _start(self, link: str) -> str:
        """A backup of the primary at `link`; if it ever takes over, it logs its updates
        to the next generation's log (each failover's is the one after the dead one's)."""
        self.started += 1
        name = "backup" if self.started == 1 else f"backup-{self.started}"
        log = self.dir.updates_log(len(self.failovers) + 1)
        command = [*MINIPS, "server", "--config", str(self.config_file), "--backup-of", link,
                   "--endpoint-file", str(self.dir.endpoint), "--updates-log", str(log),
                   "--t0", repr(self.t0)]  # fmt: skip
        self.processes.start(name, command)
        self.backup, self._backup_of = name, link
        return name

    def check(self) -> None:
        """One look: a primary that died while its backup lives is replaced by it (the
        backup becomes "server", the dead one stays as "server-dead-N"); a replica lost
        is replaced by a new backup once the live one listens for it."""
        server = self.processes["server"]
        backup = self.processes[self.backup] if self.backup is not None else None
        if backup is not None and backup.crashed() and not server.exited():
            self.backup_lost.append({"exit_code": backup.code(), "at_s": self._now()})
            self.backup = None
        elif backup is not None and server.crashed() and not backup.exited():
            self.processes.children[f"server-dead-{len(self.failovers) + 1}"] = server
            self.processes.children["server"] = backup
            del self.processes.children[self.backup]
            self.failovers.append({"exit_code": server.code(), "at_s": self._now()})
            self._dead_link = self._backup_of  # until the new primary writes its own
            self.backup = None
        if self.backup is None and not self.processes["server"].exited():
            address = self._link()
            if address and address != self._dead_link and self.started <= MAX_REPLACEMENTS:
                name = self._start(address)
                self.replacements.append({"name": name, "at_s": self._now()})

    def _link(self) -> str:
        """The live primary's link address as its file says ("" while there is none)."""
        try:
            return link_file(self.dir.endpoint).read_text().strip()
        except FileNotFoundError:
            return ""

    def records(self) -> dict[str, Any]:
        """The summary's replication fields. Each failover's `redone`: the updates the dead
        primary applied past the last input its backup held (its log's `failover`
        record's version). Their replies were held, never sent, so their workers sent
        them again to the new primary: done twice on the way, once in the model. None
        are lost: a reply leaves only once the backup holds its input (protocol.md 17)."""
        for number, failover in enumerate(self.failovers, start=1):
            taken = _failover_record(self.dir.updates_log(number))
            dead = last_logged_version(self.dir.updates_log(number - 1))
            failover["version"] = taken.get("version")
            failover["takeover_s"] = taken and round(taken["silent_s"] + taken["bind_s"], 3)
            failover["redone"] = max(0, dead - taken["version"]) if taken else None
        return {"replicas": 2, "failovers": self.failovers, "backups_lost": self.backup_lost,
                "replacements": self.replacements}  # fmt: skip

    def _now(self) -> float:
        return round(time.monotonic() - self.t0, 3)
