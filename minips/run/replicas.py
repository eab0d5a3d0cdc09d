"""A replicated server (`--replicas 2`) as `minips server` runs it and `minips run` watches it.

`minips server --replicas 2` is the primary: it serves the clients' address and listens on
a replication link (written beside its endpoint file, `<endpoint file>-link`) for its
backup, `minips server --backup-of LINK` from the same configuration (minips.server.
replication). `minips run --replicas 2` starts both; when the primary dies the backup
takes over on the same address, and `ReplicaWatch` makes it the run's server ("server")
and records the failover for the summary. A replacement for the dead replica (a state
transfer to a new backup) is not built yet: the run goes on with one replica.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from minips.results.metrics import MetricsLog, read_metrics
from minips.run.config import RunConfig
from minips.run.processes import MINIPS, ProcessGroup
from minips.run.recovery import last_logged_version
from minips.server.options import ServerOptions
from minips.server.replication import BACKUP, PRIMARY, ReplicaSettings, ReplicatedServer

PRIVATE_BIND = "tcp://127.0.0.1:*"  # a backup's own socket: no client knows it


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
        if backup:
            ps.on_promote = log.open
            click.echo(f"minips server: backup of {config.backup_of}, rule {config.rule}")
        else:
            click.echo(f"minips server on {ps.endpoint}, rule {config.rule}, replication "
                       f"link {ps.link_endpoint}")  # fmt: skip
            if endpoint_file:
                _write_atomically(link_file(endpoint_file), ps.link_endpoint or "")
                _write_atomically(Path(endpoint_file), ps.endpoint)
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
    """The replicas of a `minips run` (module docstring): the backup's start, and the
    failover the launcher sees when the primary's process dies."""

    def __init__(self, processes: ProcessGroup, config_file: Path, run_dir: Any,
                 t0: float) -> None:  # fmt: skip
        self.processes, self.config_file, self.dir, self.t0 = processes, config_file, run_dir, t0
        self.failovers: list[dict[str, Any]] = []
        self.backup_lost: list[dict[str, Any]] = []
        self.generation = 0

    def start_backup(self, timeout: float) -> None:
        """Start the backup once the primary's link is known."""
        link = self.processes.wait_for_file(link_file(self.dir.endpoint), "server", timeout)
        self.generation += 1
        command = [*MINIPS, "server", "--config", str(self.config_file), "--backup-of", link,
                   "--updates-log", str(self.dir.updates_log(self.generation)),
                   "--t0", repr(self.t0)]  # fmt: skip
        self.processes.start("backup", command)

    def check(self) -> bool:
        """True when the primary died and the backup lives: the backup is now "server"
        (the dead one kept as "server-dead-N"), the failover recorded."""
        server, backup = self.processes["server"], self.processes.children.get("backup")
        if backup is not None and backup.crashed() and not server.exited():
            self.backup_lost.append({"exit_code": backup.code(), "at_s": self._now()})
            self.processes.children[f"backup-dead-{len(self.backup_lost)}"] = backup
            del self.processes.children["backup"]
            return False
        if not server.crashed() or backup is None or backup.exited():
            return False
        dead = f"server-dead-{len(self.failovers) + 1}"
        self.processes.children[dead] = server
        self.processes.children["server"] = backup
        del self.processes.children["backup"]
        self.failovers.append({"exit_code": server.code(), "at_s": self._now(),
                               "updates_lost": 0})  # fmt: skip
        return True

    def records(self) -> dict[str, Any]:
        """The summary's replication fields; each failover's updates lost: the versions
        the dead primary logged past the one its backup took over at (its log's
        `failover` record)."""
        for number, failover in enumerate(self.failovers, start=1):
            taken = _failover_record(self.dir.updates_log(number))
            dead = last_logged_version(self.dir.updates_log(number - 1))
            failover["version"] = taken.get("version")
            failover["takeover_s"] = taken and round(taken["silent_s"] + taken["bind_s"], 3)
            failover["updates_lost"] = max(0, dead - taken["version"]) if taken else None
        lost = sum(f["updates_lost"] or 0 for f in self.failovers)
        return {"replicas": 2, "failovers": self.failovers, "backups_lost": self.backup_lost,
                "replacements": [], "updates_lost": lost}  # fmt: skip

    def _now(self) -> float:
        return round(time.monotonic() - self.t0, 3)
