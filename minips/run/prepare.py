"""A local run before its processes start: the run directory and the config as run.

`check_run_can_start` asks, before anything is removed, for what the run's processes will
need later; `claim_run_dir` then makes --out a run directory to write, locked for this run
(minips.run.runlock; with --force: a finished or dead run's files removed).
`prepare_run_dir` checks the config, clears a previous run's outputs and fixes what the
run's processes will be told: its local endpoint (`local_endpoint`), its key directory, and
its plan (`--plan auto`: `minips plan` in a subprocess, as the workers run).
`server_links` puts each server behind its shaped link under `--netem`. Both `minips run`
(minips.run.launch) and `minips launch`'s coordinator (minips.run.cluster) start from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import zmq

from minips.errors import ConfigError, MinipsError, RunDirError
from minips.provision import keyfiles
from minips.results.rundir import RUN_FILES, RunDir, kept_by, remove_files
from minips.run.build import resolve_plan
from minips.run.config import RunConfig
from minips.run.config_checks import check_can_shape, check_resume
from minips.run.processes import MINIPS, SINGLE_THREADED_BLAS
from minips.run.runlock import LOCK_NAME, RunLock, check_not_live


def prepare_run_dir(config: RunConfig, run_dir: RunDir) -> RunConfig:
    """Check the config (before anything is written), clear a previous run's outputs;
    return the config as run.

    As run: a local endpoint of its own unless a bind address was chosen (two runs side by
    side do not collide), the checkpoint in the run directory unless one was chosen, the
    key directory of an authenticated run, and a plan other than dense as the file
    RUN_DIR/plan.json.
    """
    config.validate()
    run_dir.logs.mkdir(parents=True, exist_ok=True)
    run_dir.clear_outputs(keep=run_inputs(config))
    config = replace(
        config,
        bind=local_endpoint(run_dir) if config.bind == RunConfig.bind else config.bind,
        checkpoint=config.checkpoint or str(run_dir.checkpoint),
        keys=_run_keys(config, run_dir),
    )
    if config.plan == "auto":
        # Measured as the workers will run (one BLAS thread); the run directory keeps the
        # choice, the predicted bytes and the planner's table (logs/planner.log).
        _plan_in_subprocess(config, run_dir)
    elif config.plan != "dense":
        plan = resolve_plan(config)
        run_dir.plan.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    return config if config.plan == "dense" else replace(config, plan=str(run_dir.plan))


def _plan_in_subprocess(config: RunConfig, run_dir: RunDir) -> None:
    """`minips plan ... --json RUN_DIR/plan.json` as workers run (one BLAS thread): the
    `--plan auto` of `minips run`. The link options go through as given: `--bandwidth` and
    `--netem` mean the same to both commands (minips.transmission.planning.planner.Network)."""
    argv = [*MINIPS, "plan", "--model", config.model, "--batch-size", str(config.batch_size),
            "--workers", str(config.workers), "--browser", str(config.browser),
            "--servers", str(config.servers), "--rule", config.rule,
            "--momentum", repr(config.momentum), "--json", str(run_dir.plan)]  # fmt: skip
    argv += ["--bandwidth", config.bandwidth] if config.bandwidth else []
    argv += ["--netem", config.netem] if config.netem else []
    env = {**os.environ, **SINGLE_THREADED_BLAS}
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise MinipsError(f"the planner failed: {done.stderr.strip().splitlines()[-1:]}")
    (run_dir.logs / "planner.log").write_text(done.stdout)


def check_run_can_start(config: RunConfig, dashboard_listen: str | None = None) -> None:
    """MinipsError (one line) for what would stop the run only once its processes start,
    said while --force has removed nothing yet: a --resume that is no checkpoint of the
    model, a --netem link this machine cannot build, a --keys directory whose keys do not
    load, an address the browser page (--listen) or the dashboard cannot listen on, and a
    --trace file that cannot be written (it is written when the run ends), and a dataset
    file that is missing, truncated or corrupt (named by its full path)."""
    from minips.provision.locations import check_dataset_files

    check_dataset_files(config.dataset, config.data_dir)
    check_resume(config.resume, config.servers, config.model)
    if config.trace:
        check_creatable(config.trace, "--trace")
    check_can_shape(config.netem)
    if config.keys and (Path(config.keys) / f"{keyfiles.SERVER}{keyfiles.SECRET_SUFFIX}").exists():
        keyfiles.load_server_keys(config.keys)  # no server key yet: the run makes the keys
        for client in (keyfiles.WORKER, keyfiles.OPERATOR):
            keyfiles.load_client_keys(config.keys, client)
    if config.browser:
        check_can_listen(config.listen, "--listen")
    if dashboard_listen:
        check_can_listen(dashboard_listen, "--dashboard-listen")


def check_creatable(path: str | Path, option: str) -> None:
    """RunDirError unless a file could be made at `path` later, creating nothing now (the
    path may lie in an --out that must stay empty until it is claimed): its nearest
    existing folder is a folder this process may write in."""
    existing = next(parent for parent in Path(path).absolute().parents if parent.exists())
    if not existing.is_dir():
        reason = f"{existing} is a file, not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        reason = f"{existing} is not writable"
    else:
        return
    raise RunDirError(f"{option} {path}: cannot write there ({reason})")


def check_can_listen(listen: str, option: str) -> None:
    """ConfigError unless HOST:PORT can be listened on now (a port of 0 always can): what
    the gateway's or the dashboard's socket will bind, with the same SO_REUSEADDR."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return  # a malformed address is the server's own check to word
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), int(port), type=socket.SOCK_STREAM
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        reason = exc.strerror or exc
        raise ConfigError(f"{option} {listen}: cannot listen there: {reason}") from None


def claim_run_dir(out: Path, force: bool, keep: Path | Iterable[Path] | None = None) -> RunLock:
    """Make `out` a fresh run directory owned by this process (minips.run.runlock: hold the
    returned lock for the run's life): RunDirError if a live run holds it, or if it already
    holds files (besides `keep`), unless `force`, which removes a finished or dead run's
    files (RUN_FILES) so no earlier report or log is mixed into the new run. `keep`: what
    the new run reads (`run_inputs`: a checkpoint to resume from, a plan file, ...) stays.
    `force` refuses a folder holding files but no minips run (`holds_a_run`): another
    program's files of the same names are not a run's. Nothing is removed before the lock
    is held."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out}: a file, not a directory")
    keep = [keep] if isinstance(keep, Path) else list(keep or ())
    if out.exists() and any(p.name != LOCK_NAME and not kept_by(p, keep) for p in out.iterdir()):
        if not force:
            check_not_live(out, "--out")  # a live run is said so, not "holds files"
            raise RunDirError(
                f"--out {out} already holds files (a previous run?); "
                "choose a new directory or add --force to replace that run"
            )
        if not holds_a_run(out):
            raise RunDirError(
                f"--out {out} holds files but no minips run (no {LOCK_NAME}, no minips "
                "config.json): --force replaces only a run's files; choose a new directory"
            )
    lock = RunLock.claim(out, "--out")
    if force:
        remove_files(out, RUN_FILES, keep)
    return lock


def holds_a_run(directory: Path) -> bool:
    """Whether `directory` is a minips run's: every run claims it (its run.lock, never
    removed), and a run's config.json is a RunConfig naming its model and rule."""
    if (directory / LOCK_NAME).is_file():
        return True
    try:
        RunConfig.from_json(directory / "config.json")
    except ConfigError:
        return False
    return {"model", "rule"} <= set(json.loads((directory / "config.json").read_text()))


def run_inputs(config: RunConfig) -> list[Path]:
    """The files and folders a run reads that may lie in its --out: its --resume
    checkpoint, --plan file, --keys and --data-dir, which replacing a run there keeps."""
    named = (config.resume, config.keys, config.data_dir)
    plan = None if config.plan in ("dense", "auto") else config.plan
    return [Path(path) for path in (*named, plan) if path]


def local_endpoint(run_dir: RunDir) -> str:
    """The server's address for a run on this machine: an ipc:// socket in the run directory
    where ZeroMQ has ipc (a raw exchange of LeNet-5's 1.72 MB each way took 0.6-0.9x the
    time of tcp loopback: BENCHMARKS.md, "wire, after the reshaping"), else a free tcp port
    on loopback."""
    path = run_dir.server_socket.resolve()
    if zmq.has("ipc") and len(str(path)) < 100:  # sun_path holds 107 bytes
        return f"ipc://{path}"
    return "tcp://127.0.0.1:*"


def _run_keys(config: RunConfig, run_dir: RunDir) -> str | None:
    """The key directory of an authenticated run (`--auth` or `--keys`), made if it has no
    keys yet: the server's pair, a worker pair (workers and the evaluator) and an operator
    pair (the launcher's `stats` and `stop`). None: the run is not authenticated."""
    if not (config.auth or config.keys):
        return None
    directory = Path(config.keys or run_dir.path / "keys")
    if not (directory / f"{keyfiles.SERVER}{keyfiles.SECRET_SUFFIX}").exists():
        keyfiles.make_keys(directory)
    return str(directory)


@contextlib.contextmanager
def server_links(config: RunConfig) -> Iterator[list[tuple[list[str], str | None]]]:
    """--netem: for each server (each shard of a group: every one behind a link of its
    own), the command prefix that runs it behind its shaped link, and its address.

    Without --netem: ([], None) each, the servers on loopback. minips.run.netem builds the
    links (root only) and removes them when the run ends.
    """
    if not config.netem:
        yield [([], None)] * config.servers
        return
    from minips.run import netem  # only a run with --netem needs ip and tc

    try:
        with netem.shaped_links(config.servers, config.netem) as links:
            yield [(link.prefix, link.server_addr) for link in links]
    except netem.NetemError as exc:
        raise ConfigError(f"--netem {config.netem}: {exc}") from None
