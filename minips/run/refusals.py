"""Workers that refused a run: what the teacher reads in `minips run`'s output.

A worker that cannot do what hello's config asks (a browser page without a codec of the
plan, a model it cannot build, the engine it was asked for) leaves at once with `bye` and
its reason in `refused` (docs/protocol.md 5.6); the server keeps the reason in the worker's
`stats` row. The launcher says each one once, in one line:

    refusals = Refusals()
    for line in refusals.update(stats):   # every stats reply the launcher reads
        announce(line)
"""

from __future__ import annotations

from typing import Any


class Refusals:
    """The refusals announced so far; `update` returns the lines of the new ones."""

    def __init__(self) -> None:
        self._said: set[tuple[str, str]] = set()

    def update(self, stats: dict[str, Any] | None) -> list[str]:
        """One line per worker row of `stats` with a `refused` reason not said before."""
        lines = []
        for row in (stats or {}).get("workers", []):
            reason = row.get("refused")
            if reason is None or (row["worker"], reason) in self._said:
                continue
            self._said.add((row["worker"], reason))
            agent = (row.get("info") or {}).get("agent", "worker")
            lines.append(f"{agent} {row['worker']} (rank {row['rank']}) refused this run: {reason}")
        return lines
