"""Build a server from options, and run a whole local cluster with one call.

`make_server(spec)` is what `minips server` runs. `run_local(spec, out_dir)` is `minips run`:
it starts the server, N workers (single-threaded BLAS) and an evaluator as separate
processes on loopback, watches them, stops the server when the workers are done, and
writes the run directory:

    RUN_DIR/config.json     the options of the run
    RUN_DIR/metrics.jsonl   eval / update / worker records, ordered by time, then a summary
    RUN_DIR/summary.json    final accuracy, wall time, samples, updates, bytes, staleness
    RUN_DIR/checkpoint.npz  the final parameters, versions and optimizer state
    RUN_DIR/logs/           each process's log
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from minips.client import PSClient, ServerUnavailable
from minips.data import find_dataset
from minips.errors import ConfigError, MinipsError
from minips.metrics import MetricsLog, read_metrics
from minips.nn import build_model
from minips.optim import SGD
from minips.rules import make_rule
from minips.server import ParameterServer, ServerOptions
from minips.trainer import TrainingOptions

# Environment for worker processes: one BLAS thread each, so N workers on 2 cores do not
# oversubscribe (user settings win).
SINGLE_THREADED_BLAS = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclass
class ServerSpec(TrainingOptions):
    """Everything that defines a run, as the server serves it to workers in `hello`.

    The training fields (model, dataset, epochs, lr, ...) are `TrainingOptions`', shared
    with the single-process trainer; `epochs` counts passes over each worker's shard.
    """

    rule: str = "asgd"
    rule_options: dict[str, Any] = field(default_factory=dict)
    workers: int = 2
    hetero: list[float] = field(default_factory=list)  # slowdown factor per rank
    bind: str = "tcp://127.0.0.1:5555"
    heartbeat_timeout: float = 10.0
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: str | None = None
    # A global sample budget (0: none): the run stops once the workers together have
    # processed this many samples, so fast workers do more of the work than slow ones.
    # `epochs` stays each worker's upper bound.
    max_samples: int = 0

    def validate(self) -> None:
        """One-line ConfigError/DataError for options no run could use."""
        super().validate()
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.hetero and len(self.hetero) != self.workers:
            raise ConfigError(
                f"--hetero gives {len(self.hetero)} factors for {self.workers} workers"
            )
        if any(factor < 1 for factor in self.hetero):
            raise ConfigError("--hetero factors must be >= 1 (1 = full speed)")
        if self.max_samples < 0:
            raise ConfigError(f"max samples must be >= 0, got {self.max_samples}")
        if find_dataset(self.dataset, self.data_dir) is None:
            # load_dataset words the message: where it looked and how to get the data
            from minips.data import load_dataset

            load_dataset(self.dataset, self.data_dir)

    def worker_config(self, model_spec: dict[str, Any]) -> dict[str, Any]:
        """The `config` map every worker receives in `hello`."""
        return {
            "model": model_spec,
            "dataset": self.dataset,
            "data_dir": self.data_dir,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "hetero": list(self.hetero),
            "lr": self.lr,
        }


def make_server(
    spec: ServerSpec, on_update: Callable[[dict[str, Any]], None] | None = None
) -> ParameterServer:
    """A ParameterServer with the spec's model (seeded init), rule and optimizer."""
    spec.validate()
    model = build_model(spec.model, seed=spec.seed)
    rule = make_rule(spec.rule, **spec.rule_options)
    params = model.params  # one dict: the store and the optimizer must share it
    optimizer = SGD(params, spec.lr, spec.momentum, spec.weight_decay)
    return ParameterServer(
        params,
        rule,
        optimizer,
        ServerOptions(
            bind=spec.bind,
            world_size=spec.workers,
            heartbeat_timeout=spec.heartbeat_timeout,
            checkpoint_path=spec.checkpoint,
            checkpoint_every=spec.checkpoint_every,
            resume=spec.resume,
            max_samples=spec.max_samples,
        ),
        config=spec.worker_config(model.spec),
        on_update=on_update,
    )


def spec_to_args(spec: ServerSpec) -> list[str]:
    """The `minips server` options that rebuild `spec` (used to start the server process)."""
    args = [
        "--model", spec.model, "--dataset", spec.dataset, "--epochs", str(spec.epochs),
        "--batch-size", str(spec.batch_size), "--lr", repr(spec.lr),
        "--momentum", repr(spec.momentum), "--weight-decay", repr(spec.weight_decay),
        "--seed", str(spec.seed), "--rule", spec.rule, "--workers", str(spec.workers),
        "--bind", spec.bind, "--heartbeat-timeout", repr(spec.heartbeat_timeout),
        "--checkpoint-every", str(spec.checkpoint_every),
    ]  # fmt: skip
    if spec.max_samples:
        args += ["--max-samples", str(spec.max_samples)]
    if spec.data_dir:
        args += ["--data-dir", spec.data_dir]
    if spec.hetero:
        args += ["--hetero", ",".join(f"{factor:g}" for factor in spec.hetero)]
    if spec.checkpoint:
        args += ["--checkpoint", spec.checkpoint]
    if spec.resume:
        args += ["--resume", spec.resume]
    for key, value in spec.rule_options.items():
        args += ["--rule-option", f"{key}={value}"]
    return args


ProgressFn = Callable[[int, int, dict[str, Any]], None]
"""progress(samples_done, samples_total, latest) - called about twice a second."""


def run_local(
    spec: ServerSpec,
    out_dir: str | Path,
    eval_interval: float = 2.0,
    progress: ProgressFn | None = None,
    startup_timeout: float = 60.0,
) -> dict[str, Any]:
    """Run a server, `spec.workers` workers and an evaluator as processes; return the summary."""
    spec.validate()
    out = Path(out_dir)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for stale in ("endpoint", "updates.jsonl", "eval.jsonl", "metrics.jsonl", "summary.json"):
        (out / stale).unlink(missing_ok=True)
    spec = replace(
        spec,
        # a free port when none was chosen: two runs side by side do not collide
        bind="tcp://127.0.0.1:*" if spec.bind == ServerSpec.bind else spec.bind,
        checkpoint=spec.checkpoint or str(out / "checkpoint.npz"),
    )
    (out / "config.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")

    t0 = time.monotonic()
    env = {**SINGLE_THREADED_BLAS, **os.environ, "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, "-m", "minips"]
    cluster = _Cluster(logs, env)
    try:
        cluster.start(
            "server",
            base + ["server", *spec_to_args(spec), "--endpoint-file", str(out / "endpoint"),
                    "--updates-log", str(out / "updates.jsonl"), "--t0", repr(t0)],
        )  # fmt: skip
        endpoint = cluster.wait_for_file(out / "endpoint", "server", startup_timeout)
        # The evaluator first: registered before any worker trains, it sees the first and
        # (the server waits for observers when stopping) the final parameters.
        cluster.start(
            "evaluator",
            base + ["evaluate", "--connect", endpoint, "--metrics", str(out / "eval.jsonl"),
                    "--interval", repr(eval_interval), "--t0", repr(t0)],
        )  # fmt: skip
        cluster.wait_for_file(out / "eval.jsonl", "evaluator", startup_timeout)
        for index in range(spec.workers):
            # The server gives ranks in the order hellos arrive, so a process is named by its
            # start order until its rank is known; the worker fills {rank} in its report path.
            cluster.start(
                f"worker.{index}",
                base + ["worker", "--connect", endpoint, "--report",
                        str(out / "worker-{rank}.json"), "--quiet"],
            )  # fmt: skip
        total = 0  # the progress bar's length; loading the data for it only when shown
        if progress is not None:
            total = spec.epochs * _train_size(spec)
            total = min(total, spec.max_samples) if spec.max_samples else total
        # Short timeouts: the server may exit (sample budget spent) while a stats request is
        # in flight, and the launcher must notice that at once rather than after retries.
        with PSClient(endpoint, timeout=1.0, retries=0) as operator:
            wall = _watch(cluster, operator, t0, total, out / "eval.jsonl", progress)
        cluster.wait("evaluator", timeout=120)
        cluster.wait("server", timeout=60)
    finally:
        # Workers that finished before the launcher saw them in `stats` name their rank in
        # their reports; a killed one was seen in `stats` (it registered before it trained).
        for report_path in out.glob("worker-[0-9]*.json"):
            report = json.loads(report_path.read_text())
            cluster.learn_ranks({"workers": [{"rank": report["rank"], "info": report}]})
        cluster.kill_all()
    return _write_results(out, spec, wall, cluster.exit_codes)


def _watch(
    cluster: _Cluster,
    operator: PSClient,
    t0: float,
    total: int,
    eval_log: Path,
    progress: ProgressFn | None,
) -> float:
    """Follow the run until the workers are done; stop the server; return the training time.

    Training time ends when the server starts stopping (its sample budget is spent) or when
    the last worker is done; shutdown is not training.
    """
    wall: float | None = None  # set once the run is over: the stop, or the last worker
    silent_since: float | None = None
    while cluster.running("worker"):
        if cluster.exited("server"):
            if cluster.code("server") != 0:
                cluster.check_alive("server")  # a crash is an error; exit 0 is a stop
            wall = wall if wall is not None else time.monotonic() - t0
            if time.monotonic() - t0 - wall > 10:
                cluster.kill_all()  # workers still knocking at a server that is gone
                break
        elif wall is None:  # training: follow the server's counters
            try:
                stats = operator.stats()
                silent_since = None
            except ServerUnavailable:
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since > 30:
                    raise MinipsError("the server stopped answering; see its log") from None
                continue  # busy, or exiting (seen on the next turn): ask again
            cluster.learn_ranks(stats)
            if stats.get("stopping"):
                wall = time.monotonic() - t0
            elif progress is not None:
                latest = _latest_eval(eval_log)
                latest["updates"] = stats.get("updates", 0)
                progress(int(stats.get("samples", 0)), total, latest)
        time.sleep(0.2 if wall is None else 0.1)
    if wall is None:
        wall = time.monotonic() - t0
        if not cluster.exited("server"):
            _stop_server(operator, cluster)  # the evaluator then tests the final model
    return wall


def _stop_server(operator: PSClient, cluster: _Cluster, attempts: int = 10) -> None:
    """Send `stop` (the evaluator then tests the final model and leaves)."""
    for _ in range(attempts):
        try:
            operator.stop()
            return
        except ServerUnavailable:
            if cluster.exited("server"):
                return  # it stopped by itself meanwhile: fine
    raise MinipsError("the server does not answer `stop`")


def _train_size(spec: ServerSpec) -> int:
    from minips.data import load_dataset

    return len(load_dataset(spec.dataset, spec.data_dir).y_train)


def _latest_eval(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    evals = [r for r in read_metrics(path) if r.get("event") == "eval"]
    return dict(evals[-1]) if evals else {}


def _write_results(
    out: Path, spec: ServerSpec, wall: float, exit_codes: dict[str, int | None]
) -> dict[str, Any]:
    """Merge the processes' records into metrics.jsonl and write summary.json."""
    records: list[dict[str, Any]] = []
    for name in ("updates.jsonl", "eval.jsonl"):
        if (out / name).exists():
            records += read_metrics(out / name)
    server_final = next((r for r in records if r.get("event") == "server"), {})
    records = [r for r in records if r.get("event") != "server"]
    reports = []
    for rank in range(spec.workers):
        path = out / f"worker-{rank}.json"
        if path.exists():
            reports.append(json.loads(path.read_text()))
            records.append({"event": "worker", "time": round(wall, 4), **reports[-1]})
    records.sort(key=lambda record: record.get("time", 0.0))
    evals = [r for r in records if r["event"] == "eval"]
    if not evals:
        raise MinipsError(f"the run produced no evaluation; see {out / 'logs'}")
    stats = server_final.get("stats", {})
    summary = {
        "accuracy": evals[-1]["accuracy"],
        "loss": evals[-1]["loss"],
        "wall_s": round(wall, 3),
        # The server's count is authoritative (a worker killed mid-run wrote no report).
        "samples": stats.get("samples", sum(report["samples"] for report in reports)),
        "updates": stats.get("updates", evals[-1].get("updates")),
        "bytes_up": stats.get("bytes_in"),
        "bytes_down": stats.get("bytes_out"),
        "staleness_mean": stats.get("staleness_mean"),
        "staleness_max": stats.get("staleness_max"),
        "rule": spec.rule,
        "workers": spec.workers,
        "exit_codes": exit_codes,
    }
    with MetricsLog(out / "metrics.jsonl") as metrics:
        for record in records:
            metrics._file.write(json.dumps(record) + "\n")  # already timed by their writers
        metrics.write("summary", **summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


class _Cluster:
    """The child processes of a local run, each logging to logs/<name>.log."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs = logs
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.exit_codes: dict[str, int | None] = {}
        self._rank_names: dict[int, str] = {}  # pid -> "worker-<rank>"

    def start(self, name: str, argv: list[str]) -> None:
        with open(self.logs / f"{name}.log", "w") as log:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env
            )

    def running(self, prefix: str) -> bool:
        return any(
            proc.poll() is None for name, proc in self.procs.items() if name.startswith(prefix)
        )

    def exited(self, name: str) -> bool:
        return self.procs[name].poll() is not None

    def code(self, name: str) -> int | None:
        return self.procs[name].poll()

    def check_alive(self, name: str) -> None:
        code = self.procs[name].poll()
        if code is not None:
            raise MinipsError(f"{name} exited with code {code}: {self._last_line(name)}")

    def wait_for_file(self, path: Path, name: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and path.read_text().strip():
                return path.read_text().strip()
            self.check_alive(name)
            time.sleep(0.05)
        raise MinipsError(f"{name} did not start within {timeout:g} s; see {self.logs}")

    def wait(self, name: str, timeout: float) -> None:
        try:
            self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            self.procs[name].kill()

    def kill_all(self) -> None:
        """SIGTERM every child still running, then SIGKILL what ignores it: none left behind."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.exit_codes = {
            self._rank_names.get(proc.pid, name): proc.returncode
            for name, proc in self.procs.items()
        }

    def learn_ranks(self, stats: dict[str, Any]) -> None:
        """Map worker processes to the ranks the server gave them (from its `stats`)."""
        for entry in stats.get("workers", []):
            pid = (entry.get("info") or {}).get("pid")
            if not entry.get("observer") and pid is not None:
                self._rank_names[pid] = f"worker-{entry['rank']}"

    def _last_line(self, name: str) -> str:
        lines = (self.logs / f"{name}.log").read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(no output)"
