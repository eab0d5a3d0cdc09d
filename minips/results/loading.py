"""Reading a run directory back: `load_run` (a finished or an interrupted run, or a
`minips train --metrics` file) as a `Run`, for `minips report`, `minips plot` and tools.
The directory's layout is minips.results.rundir's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minips.errors import RunDirError
from minips.results.metrics import merge_logs, read_metrics
from minips.results.rundir import RunDir


@dataclass
class Run:
    """One loaded run directory: its options, its summary and its metrics records."""

    path: Path
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = True  # False: the run was interrupted, only the partial logs exist
    notes: list[str] = field(default_factory=list)  # what was skipped reading it (read_metrics)

    @property
    def name(self) -> str:
        """The directory's name: how a run is labelled in tables and legends."""
        return self.path.resolve().name

    def events(self, kind: str) -> list[dict[str, Any]]:
        """The records of one event kind (`eval`, `update`, `worker`), in log order."""
        return [r for r in self.records if r.get("event") == kind]


def load_run(path: str | Path) -> Run:
    """Load a run directory; RunDirError (one line) when it is missing or is not one.

    An interrupted run has no metrics.jsonl yet, only the servers' update logs and the
    evaluator's eval.jsonl: those are read instead, so a crashed run can still be looked at.
    A file is read as `minips train --metrics` output (load_train_metrics).
    """
    root = Path(path)
    if root.is_file():
        return load_train_metrics(root)
    if not root.is_dir():
        raise RunDirError(f"{root}: no such run directory")
    run_dir = RunDir(root)
    notes: list[str] = []  # a half-written last line skipped: said in the report
    try:
        config = _read_json(run_dir.config)
        if run_dir.metrics.exists():
            records = read_metrics(run_dir.metrics, notes)
            complete = True
        else:
            partial = [*run_dir.update_logs(), run_dir.eval_log]
            if not any(p.exists() for p in partial):
                raise RunDirError(
                    f"{root}: not a run directory (no metrics.jsonl; make one with "
                    "`minips run --out DIR`)"
                )
            records = merge_logs(partial, notes)
            complete = False
        summary = _read_json(run_dir.summary) or next(
            (r for r in reversed(records) if r.get("event") == "summary"), {}
        )
    except ValueError as exc:  # not JSON, or not what a run writes: names the file and line
        raise RunDirError(str(exc)) from None
    summary = {key: value for key, value in summary.items() if key != "event"}
    return Run(root, config, summary, records, complete, notes)


def load_train_metrics(path: Path) -> Run:
    """`minips train --metrics FILE` as a Run of one worker (rule "train"), so the
    single-process baseline is reported and plotted beside distributed runs.

    RunDirError for any other file (a run's own files are read through its directory).
    """
    try:
        records = read_metrics(path)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        records = []
    summary = next((r for r in reversed(records) if r.get("event") == "summary"), None)
    if summary is None or "config" not in summary:
        raise RunDirError(
            f"{path}: a file that is not `minips train --metrics` output; "
            "give a run directory (`minips run --out DIR`) or a train metrics file"
        )
    config = {**summary["config"], "rule": "train", "workers": 1}
    summary = {key: value for key, value in summary.items() if key not in ("event", "config")}
    return Run(path, config, {**summary, "rule": "train", "workers": 1}, records, True)


def _read_json(path: Path) -> dict[str, Any]:
    """A run's JSON object file ({} when absent); ValueError naming it when it holds no
    JSON object."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8")) if path.exists() else {}
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data
