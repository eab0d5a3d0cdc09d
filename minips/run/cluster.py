"""`minips launch`: one process of a job that torchrun, Slurm's srun, Open MPI's mpirun or a
ps-lite / BytePS / MXNet (DMLC) script started, taking its role from their variables
(minips.run.launchenv) and becoming it:

    rank 0 (DMLC: the scheduler)      the coordinator: the run directory, the group's root
                                      (a child process), the evaluator, the summary
    ranks 1 .. K-1 (DMLC: a server)   shard r: `minips server --shard r --root ROOT`
    ranks K .. N-1 (DMLC: a worker)   worker r - K: `minips worker --connect ROOT --rank r-K`

With N processes and `--servers K`, N - K train. Under DMLC the scheduler serves shard 0 as
well, so DMLC_NUM_SERVER server processes make a group of K = DMLC_NUM_SERVER + 1 shards,
and DMLC_NUM_WORKER workers train (their ranks: DMLC_WORKER_ID, or the order they arrive).

Shards and workers replace this process with their command (exec), so the launcher signals
and reaps them directly (a replicated shard's rank stays: below). The coordinator is
`minips run`'s LocalRun without local shards or workers: its root stops by itself once
every worker said bye. Nothing waits without bound: a shard that gets no answer from the
root, a worker that cannot say hello, and a coordinator whose group or workers do not all
arrive within the startup timeout each stop with a one-line error naming who is missing.

With `--replicas 2` every server is a primary and a backup, both child processes of its
rank, watched and replaced as `minips run` does (minips.run.replicas): rank 0 runs the
root's pair (or the one server's), and each shard rank 1..K-1, instead of exec, runs its
shard's pair until the shard stopped (minips.run.shardrank). A launcher such as mpirun
ends the whole job when one of its ranks dies, but a rank's child may die and be replaced
without the launcher knowing, and the backup takes the primary's address over, which only
a process on the same machine can (docs/running.md says what a backup on its own host
would need). The summary merges the shard ranks' failovers and replacements, which each
writes into the run directory when it ends. Under DMLC a server learns its shard index
only when it joins, too late for its backup: refused there (`check_launch_replicas`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from minips.errors import ConfigError, MinipsError
from minips.guard import addresses
from minips.results.metrics import ProgressFn
from minips.results.rundir import RunDir
from minips.run import shardrank
from minips.run.config import RunConfig
from minips.run.launch import LocalRun
from minips.run.launchenv import LaunchEnv
from minips.run.prepare import prepare_run_dir
from minips.run.processes import MINIPS, signals_stop_the_run

COORDINATOR, SHARD, WORKER = "coordinator", "shard", "worker"


@dataclass(frozen=True)
class Role:
    """What this process is in the job: kind (COORDINATOR, SHARD or WORKER), its index (a
    shard's, 0 for the coordinator's root; a worker's rank; None: given by the root), the
    group's size K and the number of workers."""

    kind: str
    index: int | None
    servers: int
    workers: int


def role_of(env: LaunchEnv, servers: int) -> Role:
    """This process's role (module docstring); ConfigError when the job cannot be one."""
    if env.launcher == "dmlc":
        if servers not in (1, env.dmlc_servers + 1):
            raise ConfigError(
                f"--servers {servers}: a DMLC job of DMLC_NUM_SERVER={env.dmlc_servers} has "
                f"{env.dmlc_servers + 1} shards (the scheduler serves one too)"
            )
        kinds = {"scheduler": (COORDINATOR, 0), "server": (SHARD, None),
                 "worker": (WORKER, env.dmlc_worker_id)}  # fmt: skip
        kind, index = kinds[env.dmlc_role]
        return Role(kind, index, env.dmlc_servers + 1, env.dmlc_workers)
    if env.world_size <= servers:
        raise ConfigError(
            f"{env.world_size} processes cannot be {servers} server(s) and at least one worker "
            "(the first --servers ranks serve, the rest train)"
        )
    if env.rank == 0:
        return Role(COORDINATOR, 0, servers, env.world_size - servers)
    if env.rank < servers:
        return Role(SHARD, env.rank, servers, env.world_size - servers)
    return Role(WORKER, env.rank - servers, servers, env.world_size - servers)


def root_bind(env: LaunchEnv) -> str:
    """Where the root listens: its port on loopback for a job on one machine, else on every
    interface (the other processes connect to `env.root`)."""
    loopback = env.root_host == "localhost" or addresses.is_loopback(env.root)
    return f"tcp://{'127.0.0.1' if loopback else '*'}:{env.root_port}"


def own_bind(env: LaunchEnv) -> str:
    """Where a shard listens: a free port, on loopback when the whole job is."""
    return root_bind(env).rsplit(":", 1)[0] + ":*"


def check_launch_replicas(config: RunConfig, launcher: str) -> None:
    """ConfigError for replication `minips launch` does not build: a DMLC server's shard
    index is given by the root when it joins, and its backup must know it beforehand."""
    if config.replicas > 1 and config.servers > 1 and launcher == "dmlc":
        raise ConfigError(
            "minips launch --replicas 2 under DMLC: a server's shard index is the root's to "
            "give, and its backup needs it first; use mpirun, torchrun or srun"
        )


def launch(
    config: RunConfig,
    env: LaunchEnv,
    out: Path,
    eval_interval: float = 2.0,
    startup_timeout: float = 60.0,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Take this process's role: a shard or a worker never returns (exec; a replicated
    shard exits once its pair stopped); the coordinator returns the run's summary
    (progress: told the samples trained, as `minips run`'s)."""
    role = role_of(env, config.servers)
    config = replace(config, servers=role.servers, workers=role.workers)
    check_launch_replicas(config, env.launcher)
    run_dir = RunDir(out)
    if role.kind == SHARD and config.replicas > 1:
        _supervise(shard_argv(config, env, role, run_dir), env, role, run_dir, startup_timeout)
    if role.kind == SHARD:
        _become(shard_argv(config, env, role, run_dir))
    if role.kind == WORKER:
        _become(worker_argv(config, env, role, run_dir, startup_timeout))
    return coordinate(config, env, run_dir, eval_interval, startup_timeout, progress)


def shard_argv(config: RunConfig, env: LaunchEnv, role: Role, run_dir: RunDir) -> list[str]:
    """The command of a shard rank: it joins the root (index -1: the one the root gives)
    and takes the run's config from it; its files carry the index it ends up with."""
    keys = ["--keys", config.keys] if config.keys else []
    index = -1 if role.index is None else role.index
    return [*MINIPS, "server", "--servers", str(role.servers), "--shard", str(index),
            "--root", env.root, "--bind", own_bind(env),
            "--endpoint-file", str(run_dir.path / "endpoint-shard{shard}"),
            "--updates-log", str(run_dir.path / "updates-shard{shard}.jsonl"), *keys]  # fmt: skip


def worker_argv(
    config: RunConfig, env: LaunchEnv, role: Role, run_dir: RunDir, startup_timeout: float = 60.0
) -> list[str]:
    """The command of a worker rank: the root's address and, when known, its rank; it waits
    for the root (started by rank 0 at the same time) as long as the job may assemble."""
    rank = ["--rank", str(role.index)] if role.index is not None else []
    keys = ["--keys", config.keys, "--key-name", "worker"] if config.keys else []
    return [*MINIPS, "worker", "--connect", env.root, *rank, "--quiet",
            "--wait", repr(startup_timeout),
            "--report", str(run_dir.worker_report("{rank}")), *keys]  # fmt: skip


def _become(argv: list[str]) -> NoReturn:
    """Replace this process with `argv` (the launcher then watches the real one)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


def _supervise(
    argv: list[str], env: LaunchEnv, role: Role, run_dir: RunDir, startup_timeout: float
) -> NoReturn:
    """Run the shard's primary and backup as this process's children (minips.run.
    shardrank) until the shard stopped, then exit."""
    assert role.index is not None  # check_launch_replicas: not under DMLC
    shardrank.supervise(argv, (env.root_host, env.root_port), role.index, role.servers,
                        run_dir, startup_timeout)  # fmt: skip
    sys.exit(0)


def coordinate(
    config: RunConfig,
    env: LaunchEnv,
    run_dir: RunDir,
    eval_interval: float,
    startup_timeout: float,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Rank 0: prepare the run directory, serve the root and evaluate beside it, wait for
    the group and the workers (at most `startup_timeout` s), write the results."""
    run_dir.path.mkdir(parents=True, exist_ok=True)
    # The evaluator starts beside the root, the workers anywhere: a job shorter than the
    # evaluator's start would end before its hello without the root awaiting it.
    config = replace(prepare_run_dir(config, run_dir), bind=root_bind(env), observers_awaited=1)
    run_dir.config.write_text(config.to_json())
    run = LaunchedRun(config, run_dir, eval_interval=eval_interval,
                      startup_timeout=startup_timeout, progress=progress)  # fmt: skip
    run.launcher = env.launcher
    # a job cancelled (srun, mpirun or torchrun send SIGTERM to every rank) stops as
    # Ctrl-C does: the root and evaluator stopped, the group checkpoint assembled
    with signals_stop_the_run():
        return run.run()


class LaunchedRun(LocalRun):
    """A LocalRun whose shards 1..K-1 and workers are the job's other processes: here only
    the root and the evaluator. Training lasts as long as the root serves (it stops once
    every worker said bye); the job must assemble within the startup timeout."""

    def start(self) -> str:
        self.processes.start("server", self._server_command, self.server_restarts)
        endpoint = self._wait_for(self.dir.endpoint, "server")
        if self.replicas is not None:  # the primary serves once its backup joined
            self.replicas.start_backups(self.startup_timeout)
        self.processes.start("evaluator", self._evaluator_command(endpoint))
        self._assembled = False
        try:  # its hello waits until every shard joined
            self._wait_for(self.dir.eval_log, "evaluator")
        except MinipsError:
            if self._finished_without_evaluator():
                return endpoint  # watch() sees the server gone; the launcher tests the model
            with self._operator(endpoint) as operator:
                self._check_assembly(operator.stats())  # raises, naming who is missing
            raise
        return endpoint

    def _finished_without_evaluator(self) -> bool:
        """The job ended before the evaluator wrote its first record (on a loaded machine
        the workers can train their whole budget first, and another observer may have been
        the one the root awaited): the root stopped by itself, which is no assembly failure.
        The final model is then tested from the checkpoint (minips.run.final_test)."""
        server = self.processes["server"]
        return server.wait_exit(2.0) and not server.crashed()

    def _server_names(self) -> list[str]:
        return ["server"]  # the other shards are not this process's children

    def _restart_crashed_shards(self) -> None:
        """Not ours to restart (the job's launcher owns them); a missing one is reported."""

    def _training(self) -> bool:
        """While the server serves: a dead primary's backup is the server from its takeover
        (looked at first, or the primary's death would end the training)."""
        if self.replicas is not None:
            self.replicas.check()
        return not self.processes["server"].exited()

    def _follow_counters(self, operator: Any, total: int) -> bool:
        answered = super()._follow_counters(operator, total)
        if not self._assembled and self.stats is not None:
            self._check_assembly(self.stats)
        return answered

    def _check_assembly(self, stats: dict[str, Any]) -> None:
        """MinipsError naming the shards and worker ranks still missing once the startup
        timeout passed (the root is stopped first, which stops everyone else)."""
        shards = [j for j, a in enumerate(stats.get("group", {}).get("addresses", [])) if not a]
        ranks = {w["rank"] for w in stats.get("workers", []) if not w.get("observer")}
        # While a shard is missing no worker can say hello: only the shards are named then.
        workers = [] if shards else [r for r in range(self.config.workers) if r not in ranks]
        if not shards and not workers:
            self._assembled = True
            return
        if self._elapsed() < self.startup_timeout:
            return
        if self.launcher == "dmlc":  # no ranks: DMLC_ROLE server / worker processes
            missing = [f"shard {j} (a DMLC server)" for j in shards]
            missing += [f"worker {r} (a DMLC worker)" for r in workers]
        else:
            missing = [f"shard {j} (rank {j})" for j in shards]
            missing += [f"worker {r} (rank {r + self.config.servers})" for r in workers]
        self.processes.stop_all()
        raise MinipsError(
            f"the job did not assemble within {self.startup_timeout:g} s: "
            f"{', '.join(missing)} never arrived"
        )

    def wait_for_shards(self, timeout: float = 30.0) -> None:
        """The other shards stop when the root did (its join replies say so); wait, at
        most `timeout` s, for each one's last record (written after its final checkpoint)
        before the group checkpoint and the summary are made from their files; with
        replicas, for its rank's records of its pair, which the summary merges."""
        deadline = time.monotonic() + timeout
        for shard in range(1, self.config.servers):
            log = self.dir.updates_log(0, shard)  # none: it never joined
            while log.exists() and time.monotonic() < deadline and not self._stopped(shard):
                time.sleep(0.1)
            records = shardrank.replication_file(self.dir.shard_endpoint(shard))
            if self.replicas is not None and records.exists():
                self.replicas.reported.append(json.loads(records.read_text()))

    def _stopped(self, shard: int) -> bool:
        """Whether shard `shard` stopped: its last server's last record is written (with
        replicas: its rank wrote its pair's records, once both replicas stopped)."""
        if self.replicas is not None:
            return shardrank.replication_file(self.dir.shard_endpoint(shard)).exists()
        return _has_final_record(self.dir.update_logs(shard)[-1])


def _has_final_record(log: Path) -> bool:
    """Whether a server's update log ends with its `server` record (it stopped)."""
    if not log.exists():
        return False
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return bool(lines) and '"event": "server"' in lines[-1]
