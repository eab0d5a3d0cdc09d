"""Metrics logs: JSONL files of records, one JSON object per line, each with an `event` key.

Every process that measures writes one: the trainer (`minips train --metrics`), a run's
server (updates.jsonl) and evaluator (eval.jsonl); `minips run` merges them into its
metrics.jsonl (minips.results.rundir). The events:

- `eval`    {time, samples, updates, version,        a test evaluation of the model at
             accuracy, loss, final}                   `version` (a group's: one per shard)
- `update`  {time, worker, staleness, scale, ...}    one applied server update (minips run)
- `worker`  {time, worker, steps, samples, ...}       a worker's end-of-run report (minips run)
- `summary` {accuracy, wall_s, samples, ...}          always the last line

`time` is seconds since the log was opened (or since the clock origin it was given, so
the processes of one run share an axis).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from minips.worker.hooks import ProgressFn  # noqa: F401 - the progress callback's type


def _clean(value: Any) -> Any:
    """Make numpy scalars and non-finite floats JSON-safe (NaN is not valid JSON)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(item) for item in value]
    return value


class MetricsLog:
    """Append-only JSONL writer; `None` path makes it a no-op so callers need no branches.
    A new log replaces the file, unless `append` (another process's log, added to)."""

    def __init__(
        self, path: str | Path | None, start_time: float | None = None, append: bool = False
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.start_time = time.monotonic() if start_time is None else start_time
        self._file: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            mode = "a" if append else "w"
            self._file = open(self.path, mode, encoding="utf-8")  # noqa: SIM115 - closed in close()

    def elapsed(self) -> float:
        """Seconds since the log was opened (monotonic clock)."""
        return time.monotonic() - self.start_time

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one record; `time` is filled in unless given. Returns the record."""
        record: dict[str, Any] = {"event": event}
        if event != "summary":
            record["time"] = round(self.elapsed(), 4)
        record.update(_clean(fields))
        self.write_record(record)
        return record

    def write_record(self, record: dict[str, Any]) -> None:
        """Write a record as it is: one already timed by the log it comes from (merging)."""
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()  # a crash or Ctrl-C still leaves every line written so far

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """Read a metrics.jsonl file back into a list of records (blank lines skipped).

    A last line that is not whole JSON and lacks its newline (every record is written with
    its newline: its writer was killed mid-write) is skipped, and `notes` (when given) told
    so. ValueError naming the file and the line for any other line that is not JSON, not a
    JSON object, or whose `time` is not a number: what readers rely on.
    """
    with open(path, "rb") as handle:
        lines = [(number, line) for number, line in enumerate(handle, 1) if line.strip()]
    records = []
    for number, line in lines:
        try:
            record = json.loads(line.decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError
            if number == lines[-1][0] and not line.endswith(b"\n"):  # its writer was cut
                if notes is not None:
                    notes.append(f"{path} line {number} is half-written (a process killed "
                                 "mid-write?): skipped")  # fmt: skip
                break
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else exc.reason
            raise ValueError(f"{path} line {number} is not valid JSON ({reason})") from None
        records.append(_checked_record(record, path, number))
    return records


def _checked_record(record: Any, path: str | Path, number: int) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError(f"{path} line {number} is not a JSON object")
    time = record.get("time", 0.0)
    if not isinstance(time, (int, float)) or isinstance(time, bool):
        raise ValueError(f"{path} line {number}: time {time!r} is not a number")
    return record


def merge_logs(paths: Iterable[str | Path], notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The records of several logs (missing files skipped), in order of `time`; `notes` as
    read_metrics's.

    The sort is stable: records of equal time keep the order of `paths`, then of their file.
    """
    records = [
        record for path in paths if Path(path).exists() for record in read_metrics(path, notes)
    ]
    records.sort(key=lambda record: record.get("time", 0.0))
    return records
