"""The run directory of `minips run`: where each process writes, and the merged results.

RUN_DIR/config.json     the run's configuration (RunConfig.to_json)
RUN_DIR/updates.jsonl   the server's update records (then its final `server` stats);
                        updates-N.jsonl: those of the Nth server restarted after a crash
RUN_DIR/eval.jsonl      the evaluator's records
RUN_DIR/worker-R.json   each worker's report (R: its rank; a browser slot's is made from
                        the server's final stats, as a browser writes no file)
RUN_DIR/web-url         the worker page's address (runs with browser slots)
RUN_DIR/metrics.jsonl   all of the above merged in time order, then a summary
RUN_DIR/summary.json    final accuracy, wall time, samples, updates, bytes, staleness
RUN_DIR/checkpoint.npz  the final parameters, versions and optimizer state
RUN_DIR/logs/           each process's output
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from minips.errors import MinipsError, RunDirError
from minips.run.metrics import MetricsLog, merge_logs, read_metrics

# Files a previous run in the same directory leaves behind, removed before a new one starts.
RUN_OUTPUTS = (
    "endpoint",
    "web-url",
    "updates.jsonl",
    "eval.jsonl",
    "metrics.jsonl",
    "summary.json",
)


# Everything a run writes (RUN_OUTPUTS, config.json, checkpoints, reports, logs/): what
# reusing a run directory with `minips run --force` removes first.
RUN_FILES = (*RUN_OUTPUTS, "config.json", "checkpoint.npz", "worker-*.json", "logs/*.log")


def claim_run_dir(out: Path, force: bool, keep: Path | None = None) -> None:
    """Make `out` a fresh run directory: RunDirError if it already holds files, unless
    `force`, which removes a previous run's files (RUN_FILES; `keep`, a checkpoint to resume
    from, stays) so no old report or log is mixed into the new run."""
    if not out.exists():
        return
    if not out.is_dir():
        raise RunDirError(f"--out {out}: a file, not a directory")
    if not force:
        if any(out.iterdir()):
            raise RunDirError(
                f"--out {out} already holds files (a previous run?); "
                "choose a new directory or add --force to replace that run"
            )
        return
    kept = keep.resolve() if keep is not None else None
    for pattern in RUN_FILES:
        for path in out.glob(pattern):
            if path.is_file() and path.resolve() != kept:
                path.unlink()


def latest_eval(path: Path) -> dict[str, Any]:
    """The newest `eval` record of the evaluator's log ({} before the first)."""
    if not path.exists():
        return {}
    evals = [r for r in read_metrics(path) if r.get("event") == "eval"]
    return dict(evals[-1]) if evals else {}


def bytes_by_layer(by_param: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """{"fc1.w": {"up", "down"}, "fc1.b": ...} -> {"fc1": {"up": sum, "down": sum}}."""
    layers: dict[str, dict[str, int]] = {}
    for name, counts in by_param.items():
        layer = layers.setdefault(name.rsplit(".", 1)[0], {"up": 0, "down": 0})
        layer["up"] += counts.get("up", 0)
        layer["down"] += counts.get("down", 0)
    return layers


def report_from_stats(stats: dict[str, Any], rank: int) -> dict[str, Any] | None:
    """A worker report for `rank` from the server's final stats (None: it never came).

    For workers that write no report of their own (browser slots, or a worker that
    failed): steps are the pushes the server accepted from that rank (a push that arrived
    after the run stopped counts, though not applied), over every worker that held it (a
    closed tab's and its replacement's); the agent is the one named in its hello.
    """
    rows = [w for w in stats.get("workers", []) if w.get("rank") == rank and not w.get("observer")]
    if not rows:
        return None
    return {
        "rank": rank,
        "agent": (rows[-1].get("info") or {}).get("agent", "numpy"),
        "steps": sum(w["pushes"] for w in rows),
        "samples": sum(w["samples"] for w in rows),
        "from_server_stats": True,
    }


def write_results(
    out: Path,
    rule: str,
    workers: int,
    wall: float,
    exit_codes: dict[str, int | None],
    restarts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Merge the processes' records into metrics.jsonl, write summary.json; return it.

    restarts: the server's restarts after crashes (minips.run.recovery.Restart records).
    """
    from minips.run.recovery import update_logs

    records = merge_logs([*update_logs(out), out / "eval.jsonl"])
    server_final = next((r for r in records if r.get("event") == "server"), {})
    records = [r for r in records if r.get("event") != "server"]
    reports = []
    stats = server_final.get("stats", {})
    for rank in range(workers):
        path = out / f"worker-{rank}.json"
        if path.exists():
            reports.append(json.loads(path.read_text()))
        elif report := report_from_stats(stats, rank):
            path.write_text(json.dumps(report) + "\n")
            reports.append(report)
        else:
            continue
        records.append({"event": "worker", "time": round(wall, 4), **reports[-1]})
    records.sort(key=lambda record: record.get("time", 0.0))
    evals = [r for r in records if r["event"] == "eval"]
    if not evals:
        raise MinipsError(f"the run produced no evaluation; see {out / 'logs'}")
    summary = {
        "accuracy": evals[-1]["accuracy"],
        "loss": evals[-1]["loss"],
        "wall_s": round(wall, 3),
        # The server's count is authoritative (a worker killed mid-run wrote no report).
        "samples": stats.get("samples", sum(report["samples"] for report in reports)),
        "updates": stats.get("updates", evals[-1].get("updates")),
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
        "restarts": len(restarts or []),
        "updates_lost": sum(restart["updates_lost"] for restart in restarts or []),
        "restart_log": restarts or [],
    }
    with MetricsLog(out / "metrics.jsonl") as metrics:
        for record in records:
            metrics.write_record(record)  # already timed by the process that wrote it
        metrics.write("summary", **summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
