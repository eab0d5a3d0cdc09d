"""The run directory of `minips run`: one place for its files, written and read back.

RUN_DIR/config.json     the configuration as run (RunConfig.to_json): its endpoint,
                        checkpoint, key directory and resolved plan filled in; the server
                        process starts from this file
RUN_DIR/plan.json       the transmission plan, when it is not all dense
RUN_DIR/endpoint        the server's address, once it listens
RUN_DIR/updates.jsonl   the server's update records (then its final `server` stats);
                        updates-N.jsonl: those of the Nth server restarted after a crash
RUN_DIR/eval.jsonl      the evaluator's records (and the launcher's test of the final
                        checkpoint when the evaluator could not: minips.run.final_test)
RUN_DIR/worker-R.json   each worker's report (R: its rank; a browser slot's is made from
                        the server's final stats, as a browser writes no file)
RUN_DIR/web-url         the worker page's address (runs with browser slots)
RUN_DIR/metrics.jsonl   all of the above merged in time order, then a summary
RUN_DIR/summary.json    how it ended ("finished", "finished_untested_final", "collapsed",
                        "stopped" (its server stopped from outside: `stopped_why`), or
                        the error line of a run that could not go on), the accuracy and the
                        version it is of beside the final version (minips.results.versions),
                        wall time, samples, updates (`samples_from`: the last
                        evaluation's, lagging, when the server left no count; a
                        group's: what every slice of its model trained, `behind` the
                        shard behind), bytes,
                        staleness, the server's restarts and what each crash lost
                        (`updates_lost`; a group's: its worst shard's, each shard's in
                        its row, as a round lost on every shard is one update lost), and
                        `collapse` (the model collapsed, minips.ops.collapse; else null)
RUN_DIR/checkpoint.npz  the final parameters, versions and optimizer state (and the rule's
                        own); checkpoint.prev.npz the one before it, a damaged one set aside
                        after a crash as checkpoint.damaged-N.npz; a server started later
                        on this directory resumes from checkpoint.npz or writes beside it
                        (checkpoint.2.npz, ...: minips/ops/checkpoint_keep.py)
RUN_DIR/logs/           each process's output
RUN_DIR/run.lock        held (an OS file lock) by the live run that owns the directory
                        and its servers (minips.run.runlock); never removed
With --servers K (a server group), shard J >= 1 has its own endpoint-shardJ,
updates-shardJ.jsonl (-N for its restarts) and checkpoint-shardJ.npz (shard 0's:
checkpoint-shard0.npz); checkpoint.npz is then the group checkpoint assembled from them.

Each record file is a metrics log (minips.results.metrics). `write_results` merges them when
the run ends; `load_run` (minips.results.loading) reads a directory back, a finished one or
an interrupted one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minips.errors import MinipsError, RunDirError
from minips.results.group_counts import kept_counts
from minips.results.metrics import MetricsLog, merge_logs, read_metrics
from minips.results.versions import accuracy_fields, ending, run_version
from minips.results.whole_file import (
    partial_path,
    removed_on_error,
    results_written,
    write_whole,
)

# A run's `samples_from` when its server left no final count (the evaluation's lags).
LAST_EVALUATION = "the last evaluation"

# Files a previous run in the same directory leaves behind, removed before a new one starts.
RUN_OUTPUTS = (
    "endpoint",
    "web-url",
    "updates.jsonl",
    "eval.jsonl",
    "metrics.jsonl",
    "summary.json",
    "plan.json",
    "updates-*.jsonl",
    "endpoint-*",  # a shard's address, a replica's link and welcomed backup
    ".*.partial",  # a results file or worker report whose writing was interrupted
)

# Everything a run writes (RUN_OUTPUTS, config.json, checkpoints, reports, logs/): what
# reusing a run directory with `minips run --force` removes first.
RUN_FILES = (*RUN_OUTPUTS, "config.json", "checkpoint.npz", "checkpoint.prev.npz",
             "checkpoint.damaged-*.npz", "checkpoint-shard*.npz", "checkpoint.[0-9]*.npz",
             "checkpoint-v[0-9]*.npz", "checkpoint*.tmp", "worker-*.json",
             "logs/*.log")  # fmt: skip


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory's files (the table above)."""

    path: Path

    config = property(lambda self: self.path / "config.json")
    plan = property(lambda self: self.path / "plan.json")
    endpoint = property(lambda self: self.path / "endpoint")
    eval_log = property(lambda self: self.path / "eval.jsonl")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    summary = property(lambda self: self.path / "summary.json")
    checkpoint = property(lambda self: self.path / "checkpoint.npz")
    web_url = property(lambda self: self.path / "web-url")
    logs = property(lambda self: self.path / "logs")
    # Where ZeroMQ has ipc, a local run's server listens on this socket file.
    server_socket = property(lambda self: self.path / "server.sock")

    def worker_report(self, rank: int | str) -> Path:
        """The report of the worker of `rank` ("{rank}": the worker fills it in itself)."""
        return self.path / f"worker-{rank}.json"

    def updates_log(self, generation: int = 0, shard: int = 0) -> Path:
        """The update log of the `generation`-th server of the run (0: the first), or of
        shard `shard` of a server group (0: the root, the server's own files)."""
        stem = "updates" if shard == 0 else f"updates-shard{shard}"
        name = f"{stem}.jsonl" if generation == 0 else f"{stem}-{generation}.jsonl"
        return self.path / name

    def update_logs(self, shard: int = 0) -> list[Path]:
        """Every server generation's update log (of one shard of a group), in order."""
        logs = [self.updates_log(0, shard)]
        while self.updates_log(len(logs), shard).exists():
            logs.append(self.updates_log(len(logs), shard))
        return logs

    def shard_endpoint(self, shard: int) -> Path:
        """Where shard `shard` of a group writes its address (0: the root's `endpoint`)."""
        return self.endpoint if shard == 0 else self.path / f"endpoint-shard{shard}"

    def shard_socket(self, shard: int) -> Path:
        """The ipc socket file of shard `shard` of a local group (0: `server_socket`)."""
        return self.server_socket if shard == 0 else self.path / f"shard{shard}.sock"

    def clear_outputs(self, keep: Iterable[Path] = ()) -> None:
        """Remove what a previous run in this directory left that a new one writes again,
        but a file in `keep` or in a folder in it (what the new run was given to read)."""
        remove_files(self.path, RUN_OUTPUTS, keep)


def remove_files(directory: Path, patterns: Iterable[str], keep: Iterable[Path] = ()) -> None:
    """Remove the files in `directory` that match one of `patterns` (glob), but those
    `kept_by` `keep`."""
    keep = list(keep)
    for pattern in patterns:
        for path in directory.glob(pattern):
            if path.is_file() and not kept_by(path, keep):
                path.unlink()


def kept_by(path: Path, keep: Iterable[Path]) -> bool:
    """Whether `path` is one of `keep` or lies in a folder in it, however either is spelled
    (what a run was given to read: never a previous run's file to remove)."""
    resolved = path.resolve()
    return any(kept.resolve() in (resolved, *resolved.parents) for kept in keep)


def check_writable(path: str | Path, option: str) -> None:
    """RunDirError unless a file can be written at `path` (its directory made if missing),
    tried with a temporary file there: said at the start, so no training is lost to a
    checkpoint or model file that cannot be written when it is due."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        in_the_way = next((parent for parent in path.parents if parent.is_file()), None)
        reason = f"{in_the_way} is a file, not a directory" if in_the_way else exc.strerror
        raise RunDirError(f"{option} {path}: cannot write there ({reason})") from None


# --- writing the results ---------------------------------------------------------------


def latest_eval(path: Path) -> dict[str, Any]:
    """The newest `eval` record of the evaluator's log ({} before the first)."""
    if not path.exists():
        return {}
    evals = [r for r in read_metrics(path) if r.get("event") == "eval"]
    return dict(evals[-1]) if evals else {}


def latest_collapse(path: Path) -> dict[str, Any] | None:
    """The evaluator's `collapse` record (minips.ops.collapse), None while it has none."""
    if not path.exists():
        return None
    found = next((r for r in read_metrics(path) if r.get("event") == "collapse"), None)
    return {k: v for k, v in found.items() if k not in ("event", "time")} if found else None


def run_collapse(run_dir: RunDir, stats: dict[str, Any]) -> dict[str, Any] | None:
    """The run's collapse (minips.ops.collapse): the server's finding in its last `stats`,
    else the evaluator's record; None when the model did not collapse."""
    return stats.get("collapse") or latest_collapse(run_dir.eval_log)


def final_stats(run_dir: RunDir, servers: int = 1) -> list[dict[str, Any]]:
    """Each server's last `stats` (a group's: each shard's, in shard order; {}: none)."""
    return [_final_stats(run_dir, shard) for shard in range(servers)]


def bytes_by_layer(*by_params: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """{"fc1.w": {"up", "down"}, "fc1.b": ...} -> {"fc1": {"up": sum, "down": sum}}, summed
    over every map given (a group's shards name their slices like the parameter)."""
    layers: dict[str, dict[str, int]] = {}
    for by_param in by_params:
        for name, counts in by_param.items():
            layer = layers.setdefault(name.rsplit(".", 1)[0], {"up": 0, "down": 0})
            layer["up"] += counts.get("up", 0)
            layer["down"] += counts.get("down", 0)
    return layers


def report_from_stats(stats: dict[str, Any], rank: int) -> dict[str, Any] | None:
    """A worker report for `rank` from the server's final stats (None: it never came).

    For workers that write no report of their own (browser slots, or a worker that
    failed): steps are the steps the server accepted from that rank (a push that arrived
    after the run stopped counts, though not applied), over every worker that held it (a
    closed tab's and its replacement's); the agent, user agent and host are those of its
    last hello.
    """
    rows = [w for w in stats.get("workers", []) if w.get("rank") == rank and not w.get("observer")]
    if not rows:
        return None
    info = rows[-1].get("info") or {}
    return {
        "rank": rank,
        "agent": info.get("agent", "numpy"),
        "ua": info.get("ua"),  # a browser's user agent: the report names the browser
        "host": info.get("host"),
        "steps": sum(w.get("steps", w["pushes"]) for w in rows),
        "samples": sum(w["samples"] for w in rows),
        "from_server_stats": True,
    }


def _worker_reports(run_dir: RunDir, workers: int, stats: dict[str, Any]) -> list[dict]:
    """Each rank's report: its own file, else one made from the server's final stats."""
    reports = []
    for rank in range(workers):
        path = run_dir.worker_report(rank)
        if path.exists():
            reports.append(json.loads(path.read_text()))
        elif report := report_from_stats(stats, rank):
            with results_written(run_dir.checkpoint, path):
                write_whole(path, json.dumps(report) + "\n")
            reports.append(report)
    return reports


def write_results(
    run_dir: RunDir,
    rule: str,
    workers: int,
    wall: float,
    exit_codes: dict[str, int | None],
    restarts: list[dict[str, Any]] | None = None,
    ended: str | None = None,
    final_crash: dict[str, Any] | None = None,
    servers: int = 1,
    group: dict[str, Any] | None = None,
    untested_why: str | None = None,
    stopped_why: str | None = None,
    replication: dict[str, Any] | None = None,
    interrupted: str | None = None,
) -> dict[str, Any]:
    """Merge the processes' records into metrics.jsonl, write summary.json; return it.

    restarts: the servers' restarts after crashes (minips.run.recovery.Restart records).
    ended: why a run that failed once started ended (its `error: ...` line; None: it
    finished), with final_crash, the server's crash that no restart followed (a Restart
    record: what it lost). A failed run's summary holds what is known (accuracy None
    without any evaluation). servers: a server group's size; its summary has one `shards`
    row per shard (the root's update records are the run's, every shard's counters its
    row), and `group`: its checkpoint's versions per shard, whether they agree, and the
    line that says they do not (GroupCheckpoint.record); a shard a restart left behind
    makes the run's samples and updates the fewest, which the kept model trained, and
    `behind` says which (minips.results.group_counts). untested_why: why the launcher
    could not test the final model (minips.run.final_test), for the summary's accuracy
    fields (minips.results.versions). stopped_why: what stopped the server before the
    run's end (a signal; None: the run ran to its end). replication: a replicated
    server's failovers, lost backups and replacements (minips.run.replicas), under
    `replication` (a failover loses no update: `updates_lost` counts restarts only).
    interrupted: when a stop signal cut the run's wrap-up short once training was over
    (minips.run.wrapup), under `interrupted`.
    """
    records = merge_logs([*run_dir.update_logs(), run_dir.eval_log])
    records = [r for r in records if r.get("event") != "server"]
    finals = final_stats(run_dir, servers)
    stats = finals[0]  # the root's (the one server's) last: the run's counters
    reports = _worker_reports(run_dir, workers, stats)
    records += [{"event": "worker", "time": round(wall, 4), **report} for report in reports]
    records.sort(key=lambda record: record.get("time", 0.0))
    evals = [r for r in records if r["event"] == "eval"]
    if not evals and ended is None:
        raise MinipsError(f"the run produced no evaluation; see {run_dir.logs}")
    last_eval = evals[-1] if evals else {}
    restarts = restarts or []
    collapse = run_collapse(run_dir, stats)
    versions = accuracy_fields(last_eval, run_version(finals), untested_why)
    summary = {
        "ended": ended or ending(bool(collapse), versions["final_tested"], stopped_why),
        "stopped_why": stopped_why,  # what stopped the server before the run's end, if any
        "accuracy": last_eval.get("accuracy"),  # of the model at versions' accuracy_version
        "loss": last_eval.get("loss"),
        **versions,
        "wall_s": round(wall, 3),
        **run_counts(stats, last_eval, reports),
        "bytes_up": stats.get("bytes_in"),
        "bytes_down": stats.get("bytes_out"),
        "worker_steps": stats.get("worker_steps"),
        # array bytes per layer and direction, workers only (the evaluator's pulls are not)
        "bytes_by_layer": bytes_by_layer(stats.get("bytes_by_param") or {}),
        "staleness_mean": stats.get("staleness_mean"),
        "staleness_max": stats.get("staleness_max"),
        "rule": rule,
        "workers": workers,
        "exit_codes": exit_codes,
        "restarts": len(restarts),
        "updates_lost": sum(restart["updates_lost"] for restart in restarts),
        "restart_log": restarts,
        # the model collapsed (minips.ops.collapse): the server's finding, else the
        # evaluator's; None when training went on to its end
        "collapse": collapse,
        "final_crash": final_crash,
    }
    if servers > 1:  # the bytes of every shard, each shard's own row
        summary["servers"] = servers
        summary["shards"] = [shard_row(shard, finals[shard], restarts) for shard in range(servers)]
        summary["bytes_up"] = sum(row["bytes_up"] or 0 for row in summary["shards"])
        summary["bytes_down"] = sum(row["bytes_down"] or 0 for row in summary["shards"])
        by_params = (final.get("bytes_by_param") or {} for final in finals)
        summary["bytes_by_layer"] = bytes_by_layer(*by_params)
        summary["group"] = group
        kept = kept_counts(finals, restarts)  # a shard a restart left behind: the model's
        summary["behind"] = kept["behind"]
        if kept["behind"] is not None:
            summary["samples"], summary["updates"] = kept["samples"], kept["updates"]
        # A round lost on several shards is one update lost, not one per shard: the run
        # lost at least what its worst shard lost (each shard's row says its own).
        summary["updates_lost"] = max(row["updates_lost"] for row in summary["shards"])
    if replication is not None:
        summary["replication"] = replication
    if interrupted is not None:
        summary["interrupted"] = interrupted
    _write_files(run_dir, records, summary)
    return summary


def _write_files(run_dir: RunDir, records: list[dict[str, Any]], summary: dict) -> None:
    """metrics.jsonl then summary.json, each whole or not at all (written beside its place,
    then renamed), the summary last: a run interrupted while writing them never reads as a
    complete run."""
    partial = partial_path(run_dir.metrics)
    with results_written(run_dir.checkpoint, run_dir.metrics), removed_on_error(partial):
        with MetricsLog(partial) as metrics:
            for record in records:
                metrics.write_record(record)  # already timed by the process that wrote it
            metrics.write("summary", **summary)
        os.replace(partial, run_dir.metrics)
    with results_written(run_dir.checkpoint, run_dir.summary):
        write_whole(run_dir.summary, json.dumps(summary, indent=2) + "\n")


def run_counts(
    stats: dict[str, Any], last_eval: dict[str, Any], reports: list[dict[str, Any]]
) -> dict[str, Any]:
    """A run's samples and updates from the best source there is: the server's last
    `stats` (authoritative: a worker killed mid-run wrote no report); else (the server
    died without them) the last evaluation's counts, which lag the training, and
    `samples_from` says so (the workers' reports are no better: a worker the dead server
    failed reports none); else the workers' reports."""
    if stats.get("samples") is not None:
        return {
            "samples": stats["samples"],
            "updates": stats.get("updates", last_eval.get("updates")),
        }
    if last_eval.get("samples") is not None:
        return {"samples": last_eval["samples"], "updates": last_eval.get("updates"),
                "samples_from": LAST_EVALUATION}  # fmt: skip
    samples = sum(report.get("samples") or 0 for report in reports)
    return {"samples": samples, "updates": stats.get("updates", last_eval.get("updates"))}


def _final_stats(run_dir: RunDir, shard: int) -> dict[str, Any]:
    """A shard's last `stats` (from its last generation's update log; {}: none). A log
    another process damaged is passed over with one line: the summary is still written."""
    logs = [log for log in run_dir.update_logs(shard) if log.exists()]
    try:
        finals = [r for r in merge_logs(logs) if r.get("event") == "server"] if logs else []
    except ValueError as exc:  # not JSON (UnicodeDecodeError, JSONDecodeError) or not a record
        names = ", ".join(log.name for log in logs)
        print(f"warning: shard {shard}'s update log ({names}) is damaged ({str(exc)[:120]}): "
              "its row of the summary is left empty", file=sys.stderr)  # fmt: skip
        return {}
    return finals[-1].get("stats", {}) if finals else {}


def shard_row(shard: int, stats: dict[str, Any], restarts: list[dict[str, Any]]) -> dict:
    """A shard's row in a group's summary: its final counters, its restarts and the updates
    they lost."""
    own = [r for r in restarts if r.get("shard", 0) == shard]
    return {
        "shard": shard,
        "samples": stats.get("samples"),
        "updates": stats.get("updates"),
        "version": stats.get("version"),
        "bytes_up": stats.get("bytes_in"),
        "bytes_down": stats.get("bytes_out"),
        "params": len(stats.get("param_versions") or {}),
        "restarts": len(own),
        "updates_lost": sum(r["updates_lost"] for r in own),
    }
