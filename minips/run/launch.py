"""Run a whole cluster on this machine with one call: `minips run`.

`run_local(config, out_dir)` starts the server, N workers (single-threaded BLAS) and an
evaluator as separate processes on loopback, watches them, stops the server when the
workers are done, and writes the run directory (its files: minips.run.runlog).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import zmq

from minips.errors import ConfigError, MinipsError
from minips.protocol import auth
from minips.run import recovery
from minips.run.build import auto_rate, resolve_plan
from minips.run.config import RunConfig
from minips.run.metrics import ProgressFn
from minips.run.runlog import RUN_OUTPUTS, latest_eval, write_results
from minips.worker.client import PSClient, ServerUnavailable

# Environment for worker processes: one BLAS thread each, so N workers on 2 cores do not
# oversubscribe (user settings win).
SINGLE_THREADED_BLAS = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def _plan_in_subprocess(config: RunConfig, path: Path) -> None:
    """`minips plan ... --json path` as workers run (one BLAS thread): `--plan auto` of run."""
    rate = auto_rate(config)
    argv = [sys.executable, "-m", "minips", "plan", "--model", config.model,
            "--batch-size", str(config.batch_size), "--workers", str(config.workers),
            "--json", str(path)]  # fmt: skip
    if rate is not None:
        argv += ["--bandwidth", f"{rate!r}bps", "--per-worker"]
    env = {**os.environ, **SINGLE_THREADED_BLAS}
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise MinipsError(f"the planner failed: {done.stderr.strip().splitlines()[-1:]}")
    (path.parent / "logs" / "planner.log").write_text(done.stdout)


def run_local(
    config: RunConfig,
    out_dir: str | Path,
    eval_interval: float = 2.0,
    progress: ProgressFn | None = None,
    startup_timeout: float = 60.0,
    on_start: Callable[[str], None] | None = None,
    announce: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run a server, `config.workers` workers and an evaluator as processes; return the summary.

    The run directory's files are described in minips.run.runlog. on_start(endpoint): called
    once every process is started (`minips run --dashboard` starts its page there). With
    `config.browser` = B, B of the workers are browser slots (minips.web.slots): the
    gateway is started too and `announce(line)` is told the URL to open.
    """
    out = Path(out_dir)
    config = _prepare_run_dir(config, out)
    with _server_link(config) as (server_prefix, server_host):
        if server_host is not None:  # tcp on the shaped link (ipc would go around it)
            config = replace(config, bind=f"tcp://{server_host}:*")
        try:
            return _run_cluster(
                config, out, eval_interval, progress, startup_timeout, server_prefix, on_start,
                announce,
            )  # fmt: skip
        finally:
            (out / "server.sock").unlink(missing_ok=True)  # local_endpoint's ipc socket file


def _run_cluster(
    config: RunConfig,
    out: Path,
    eval_interval: float,
    progress: ProgressFn | None,
    startup_timeout: float,
    server_prefix: list[str],
    on_start: Callable[[str], None] | None,
    announce: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    t0 = time.monotonic()
    env = {**SINGLE_THREADED_BLAS, **os.environ, "PYTHONUNBUFFERED": "1"}
    cluster = _Cluster(out / "logs", env)
    try:
        endpoint = _start(
            cluster, config, out, t0, eval_interval, startup_timeout, server_prefix, announce
        )
        if on_start is not None:
            on_start(endpoint)
        total = 0  # the progress bar's length; loading the data for it only when shown
        if progress is not None:
            total = config.epochs * _train_size(config)
            total = min(total, config.max_samples) if config.max_samples else total
        # Short timeouts: the server may exit (sample budget spent) while a stats request is
        # in flight, and the launcher must notice that at once rather than after retries.
        operator_keys = auth.load_client_keys(config.keys, auth.OPERATOR) if config.keys else None
        with PSClient(endpoint, timeout=1.0, retries=0, keys=operator_keys) as operator:
            wall = _watch(cluster, operator, t0, total, out / "eval.jsonl", progress, config, out)
        cluster.wait("evaluator", timeout=120)
        cluster.wait("server", timeout=60)
    finally:
        # Workers that finished before the launcher saw them in `stats` name their rank in
        # their reports; a killed one was seen in `stats` (it registered before it trained).
        for report_path in out.glob("worker-[0-9]*.json"):
            report = json.loads(report_path.read_text())
            cluster.learn_ranks({"workers": [{"rank": report["rank"], "info": report}]})
        cluster.kill_all()
    restarts = [restart.record() for restart in cluster.restarts]
    return write_results(out, config.rule, config.workers, wall, cluster.exit_codes, restarts)


@contextlib.contextmanager
def _server_link(config: RunConfig) -> Iterator[tuple[list[str], str | None]]:
    """--netem: (the command prefix that runs the server behind the shaped link, its address).

    Without --netem: ([], None), the server on loopback. minips.run.netem builds the link
    (root only) and removes it when the run ends.
    """
    if not config.netem:
        yield [], None
        return
    from minips.run import netem  # only a run with --netem needs ip and tc

    try:
        with netem.shaped_link(config.netem) as link:
            yield link.prefix, link.server_addr
    except netem.NetemError as exc:
        raise ConfigError(f"--netem: {exc}") from None


def local_endpoint(out: Path) -> str:
    """The server's address for a run on this machine: an ipc:// socket in the run directory
    where ZeroMQ has ipc (a raw exchange of LeNet-5's 1.72 MB each way took 0.6-0.9x the
    time of tcp loopback: BENCHMARKS.md, "wire, after the reshaping"), else a free tcp port
    on loopback."""
    path = (out / "server.sock").resolve()
    if zmq.has("ipc") and len(str(path)) < 100:  # sun_path holds 107 bytes
        return f"ipc://{path}"
    return "tcp://127.0.0.1:*"


def _prepare_run_dir(config: RunConfig, out: Path) -> RunConfig:
    """Check the config (before anything is written), clear old outputs, write config.json.

    Returns the config as run: a local endpoint of its own unless a bind address was chosen
    (two runs side by side do not collide), the checkpoint in the run directory unless one
    was chosen.
    """
    config.validate()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for stale in RUN_OUTPUTS:
        (out / stale).unlink(missing_ok=True)
    recovery.clear_restart_logs(out)
    config = replace(
        config,
        bind=local_endpoint(out) if config.bind == RunConfig.bind else config.bind,
        checkpoint=config.checkpoint or str(out / "checkpoint.npz"),
        keys=_run_keys(config, out),
    )
    (out / "config.json").write_text(config.to_json())
    (out / "plan.json").unlink(missing_ok=True)
    if config.plan == "auto":
        # Resolved once, here, measured as the workers will run (one BLAS thread); the
        # server reads the file, and the run directory keeps the choice, the predicted
        # bytes and the planner's table (logs/planner.log).
        _plan_in_subprocess(config, out / "plan.json")
        config = replace(config, plan=str(out / "plan.json"))
    elif config.plan != "dense":
        plan = resolve_plan(config)
        (out / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
        config = replace(config, plan=str(out / "plan.json"))
    return config


def _run_keys(config: RunConfig, out: Path) -> str | None:
    """The key directory of an authenticated run (`--auth` or `--keys`), made if it has no
    keys yet: the server's pair, a worker pair (workers and the evaluator) and an operator
    pair (the launcher's `stats` and `stop`). None: the run is not authenticated."""
    if not (config.auth or config.keys):
        return None
    directory = Path(config.keys or out / "keys")
    if not (directory / f"{auth.SERVER}{auth.SECRET_SUFFIX}").exists():
        auth.make_keys(directory)
    return str(directory)


def _client_key_args(config: RunConfig) -> list[str]:
    """The `--keys` option of the run's workers and evaluator (none without keys)."""
    return ["--keys", config.keys, "--key-name", auth.WORKER] if config.keys else []


def _start(
    cluster: _Cluster,
    config: RunConfig,
    out: Path,
    t0: float,
    eval_interval: float,
    startup_timeout: float,
    server_prefix: list[str] | None = None,
    announce: Callable[[str], None] | None = None,
) -> str:
    """Start the server, the evaluator, any browser slots, the NumPy workers; return the
    server's address.

    server_prefix (--netem: `ip netns exec NS`) runs the server, and the evaluator beside
    it, in the server's namespace: the evaluator's pulls then do not cross the shaped link,
    whose rate is the workers'.
    """
    base = [sys.executable, "-m", "minips"]
    cluster.server_prefix = server_prefix or []  # a restarted server runs behind it too
    start_server(cluster, config, out, t0, cluster.server_prefix)
    endpoint = cluster.wait_for_file(out / "endpoint", "server", startup_timeout)
    # The evaluator first: registered before any worker trains, it sees the first and
    # (the server waits for observers when stopping) the final parameters.
    cluster.start(
        "evaluator",
        (server_prefix or []) + base
        + ["evaluate", "--connect", endpoint, "--metrics", str(out / "eval.jsonl"),
           "--interval", repr(eval_interval), "--t0", repr(t0), *_client_key_args(config)],
    )  # fmt: skip
    cluster.wait_for_file(out / "eval.jsonl", "evaluator", startup_timeout)
    if config.browser:  # before the NumPy workers: the slots' tabs take longest to say hello
        _start_browser_slots(cluster, config, endpoint, out, startup_timeout, announce)
    for index in range(config.workers - config.browser):
        # The server gives ranks in the order hellos arrive, so a process is named by its
        # start order until its rank is known; the worker fills {rank} in its report path.
        trace = ["--trace", config.trace] if config.trace and index == 0 else []
        cluster.start(
            f"worker.{index}",
            base + ["worker", "--connect", endpoint, "--report", str(out / "worker-{rank}.json"),
                    "--quiet", *trace, *_client_key_args(config)],
        )  # fmt: skip
    return endpoint


def _start_browser_slots(
    cluster: _Cluster,
    config: RunConfig,
    endpoint: str,
    out: Path,
    startup_timeout: float,
    announce: Callable[[str], None] | None,
) -> None:
    """Start the gateway (`minips web`), announce its URL, open headless tabs if asked."""
    from minips.web.slots import gateway_argv, headless_argv, student_url

    url_file = out / "web-url"
    cluster.start("gateway", gateway_argv(endpoint, config.listen, url_file, config.data_dir))
    url = cluster.wait_for_file(url_file, "gateway", startup_timeout)
    if announce is not None:
        announce(f"{config.browser} browser slot(s): open {student_url(url)} in a browser")
    if config.browser_headless:
        profile = out / "logs" / "chromium-profile"
        cluster.start("chromium", headless_argv(url, config.browser, profile))


def start_server(
    cluster: _Cluster, config: RunConfig, out: Path, t0: float, prefix: list[str] | None = None
) -> None:
    """Start the run's server process (again, after a crash: `config` then resumes).

    prefix (--netem: `ip netns exec NS`) runs it behind the shaped link."""
    generation = len(cluster.restarts)
    name = "server" if generation == 0 else f"server-{generation}"
    cluster.start(
        "server",
        [*(prefix or []), sys.executable, "-m", "minips", "server", *config.server_args(),
         "--endpoint-file", str(out / "endpoint"),
         "--updates-log", str(recovery.updates_log(out, generation)), "--t0", repr(t0)],
        log_name=name,
    )  # fmt: skip


def restart_server(cluster: _Cluster, config: RunConfig, out: Path, t0: float) -> bool:
    """After the server died: start a new one on the same address from the last checkpoint
    (minips.run.recovery). False when that is not possible (no checkpoint, too many restarts)."""
    checkpoint = Path(config.checkpoint)
    if len(cluster.restarts) >= recovery.MAX_RESTARTS or not checkpoint.exists():
        return False
    dead_log = recovery.updates_log(out, len(cluster.restarts))
    restart = recovery.describe_restart(checkpoint, dead_log, cluster.code("server"))
    cluster.restarts.append(restart)
    endpoint = (out / "endpoint").read_text().strip()
    (out / "endpoint").unlink()
    resumed = replace(config, resume=str(checkpoint), bind=endpoint)
    start_server(cluster, resumed, out, t0, cluster.server_prefix)
    cluster.wait_for_file(out / "endpoint", "server", timeout=60)
    return True


def _watch(
    cluster: _Cluster,
    operator: PSClient,
    t0: float,
    total: int,
    eval_log: Path,
    progress: ProgressFn | None,
    config: RunConfig,
    out: Path,
) -> float:
    """Follow the run until the workers are done; stop the server; return the training time.

    Training time ends when the server starts stopping (its sample budget is spent) or when
    the last worker is done; shutdown is not training.
    """
    wall: float | None = None  # set once the run is over: the stop, or the last worker
    silent_since: float | None = None
    stats: dict[str, Any] | None = None
    while _training(cluster, stats, config.browser):
        if cluster.exited("server"):
            if cluster.code("server") != 0:
                if wall is None and restart_server(cluster, config, out, t0):
                    continue  # a crash mid-run: a new server from the last checkpoint
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
                latest = latest_eval(eval_log)
                latest["updates"] = stats.get("updates", 0)
                progress(int(stats.get("samples", 0)), total, latest)
        time.sleep(0.2 if wall is None else 0.1)
    if wall is None:
        wall = time.monotonic() - t0
        if not cluster.exited("server"):
            _stop_server(operator, cluster)  # the evaluator then tests the final model
    return wall


def _training(cluster: _Cluster, stats: dict[str, Any] | None, browser_slots: int) -> bool:
    """A NumPy worker runs, or a browser slot trains (as the server's latest stats say)."""
    from minips.web.slots import browsers_pending

    if cluster.running("worker"):
        return True
    return not cluster.exited("server") and browsers_pending(stats, browser_slots)


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


def _train_size(config: RunConfig) -> int:
    from minips.data import load_dataset

    return len(load_dataset(config.dataset, config.data_dir).y_train)


class _Cluster:
    """The child processes of a local run, each logging to logs/<name>.log."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs = logs
        self.env = env
        self.server_prefix: list[str] = []  # --netem: the command prefix of the server
        self.procs: dict[str, subprocess.Popen] = {}
        self.exit_codes: dict[str, int | None] = {}
        self._rank_names: dict[int, str] = {}  # pid -> "worker-<rank>"
        self.restarts: list[recovery.Restart] = []  # the server's, after crashes

    def start(self, name: str, argv: list[str], log_name: str | None = None) -> None:
        with open(self.logs / f"{log_name or name}.log", "w") as log:
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
            # Its last line is usually its own "error: ..." line: not "error: ... error:".
            last = self._last_line(name).removeprefix("error: ")
            raise MinipsError(f"{name} exited with code {code}: {last}")

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
