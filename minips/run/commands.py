"""The command line of each process `minips run` starts: the server (a group's root), a
shard, the evaluator and a NumPy worker, all as `python -m minips ...` with the run
directory's paths. A mixin of LocalRun (and so of minips launch's coordinator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minips.provision import keyfiles
from minips.run.processes import MINIPS

if TYPE_CHECKING:
    from minips.results.rundir import RunDir
    from minips.run.config import RunConfig
    from minips.run.processes import ProcessGroup
    from minips.run.recovery import ServerRestarts


class ProcessCommands:
    """Builds the processes' command lines from the run's state, which the class that
    mixes it in holds: its config, run directory, clock origin t0, the server's and the
    shards' link prefixes, the process group, the startup timeout, the evaluation
    interval, and each server's restart policy (for its --resume options)."""

    config: RunConfig
    dir: RunDir
    t0: float
    server_prefix: list[str]
    shard_links: list[tuple[list[str], str | None]]
    processes: ProcessGroup
    startup_timeout: float
    eval_interval: float
    restarts: list[ServerRestarts]
    server_restarts: ServerRestarts

    def _server_command(self, generation: int) -> list[str]:
        """The server of one generation (0, then one per restart), from config.json; in a
        group, its root (shard 0), waiting for the other shards to join."""
        root = ["--shard", "0"] if self.config.servers > 1 else []
        return [
            *self.server_prefix, *MINIPS, "server", "--config", str(self.dir.config), *root,
            "--endpoint-file", str(self.dir.endpoint),
            "--updates-log", str(self.dir.updates_log(generation)), "--t0", repr(self.t0),
            *self.server_restarts.resume_options(generation),
        ]  # fmt: skip

    def _shard_command(self, shard: int, generation: int) -> list[str]:
        """Shard `shard` (1..K-1) of a group: it joins the root, whose address is in the
        run directory by the time it asks, and takes the run's configuration from it."""
        prefix, host = self.shard_links[shard - 1]
        bind = f"tcp://{host}:*" if host else self._local_bind(shard)
        root = self.processes.wait_for_file(self.dir.endpoint, "server", self.startup_timeout)
        keys = ["--keys", self.config.keys] if self.config.keys else []
        own = ["--bind", bind, *keys] if generation == 0 else keys
        return [
            *prefix, *MINIPS, "server", "--servers", str(self.config.servers),
            "--shard", str(shard), "--root", root, *own,
            "--endpoint-file", str(self.dir.shard_endpoint(shard)),
            "--updates-log", str(self.dir.updates_log(generation, shard)), "--t0", repr(self.t0),
            *self.restarts[shard].resume_options(generation),
        ]  # fmt: skip

    def _local_bind(self, shard: int) -> str:
        """A shard's own address on this machine, like the root's (ipc, else tcp loopback)."""
        if self.config.bind.startswith("ipc://"):
            return f"ipc://{self.dir.shard_socket(shard).resolve()}"
        return "tcp://127.0.0.1:*"

    def _evaluator_command(self, endpoint: str) -> list[str]:
        return [
            *self.server_prefix, *MINIPS, "evaluate", "--connect", endpoint,
            "--metrics", str(self.dir.eval_log), "--interval", repr(self.eval_interval),
            "--t0", repr(self.t0), *self._client_keys(),
        ]  # fmt: skip

    def _worker_command(self, endpoint: str, index: int) -> list[str]:
        """A NumPy worker's; it fills {rank} of its report path in itself."""
        trace = ["--trace", self.config.trace] if self.config.trace and index == 0 else []
        return [
            *MINIPS, "worker", "--connect", endpoint, "--wait", repr(self.startup_timeout),
            "--report", str(self.dir.worker_report("{rank}")), "--quiet", *trace,
            *self._client_keys(),
        ]  # fmt: skip

    def _client_keys(self) -> list[str]:
        """The `--keys` option of the run's workers and evaluator (none without keys)."""
        keys = self.config.keys
        return ["--keys", keys, "--key-name", keyfiles.WORKER] if keys else []
