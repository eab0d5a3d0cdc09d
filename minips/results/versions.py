"""Which model an accuracy is of: the version it tested, and the version the run ended with.

A plain server's version is an integer; a server group's is one integer per shard, in shard
order (docs/protocol.md 16.5), written as a JSON list. Every `eval` record carries the
version it tested; a run's summary carries four fields built here:

    accuracy_version  the version the summary's `accuracy` (and `loss`) were measured on
    final_version     the version the run ended with: each server's (each shard's) last
                      `stats`; null when a server's last stats are missing (it was killed)
    final_tested      accuracy_version == final_version: the accuracy is the final model's
    untested_why      null when final_tested, else why the final model was not tested

A summary whose final model was not tested never says `"ended": "finished"`: it says
"finished_untested_final", and `untested_line` is the one line `minips run` and `minips
launch` print (to stderr, beside `accuracy_line`) and `minips report` shows.
A run whose server was stopped before the run's end (a signal to it, a stop with an
operator key other than the launcher's) says `"ended": "stopped"`, and `stopped_why` why;
`stopped_line` is its one line. A run whose wrap-up a stop signal cut short once training
was over (minips.run.wrapup) says `"interrupted"`; `interrupted_line` is its one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

Version = int | list[int]
FINISHED = "finished"
UNTESTED = "finished_untested_final"  # trained to its end; the final model was not tested
STOPPED = "stopped"  # its server was stopped before the run's end (not by the launcher)


def run_version(finals: list[dict[str, Any]]) -> Version | None:
    """The version a run ended with, from each server's last `stats` (shard order): an
    integer for one server, a list for a group; None when one of them is unknown."""
    versions = [stats.get("version") for stats in finals]
    if not versions or any(not isinstance(v, int) for v in versions):
        return None
    return versions[0] if len(versions) == 1 else versions


def _parts(version: Any) -> tuple[int, ...] | None:
    """A version as a tuple of integers (one per shard); None when it is not a version."""
    if isinstance(version, bool):
        return None
    if isinstance(version, int):
        return (version,)
    if isinstance(version, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in version
    ):
        return tuple(version)
    return None


def same_version(a: Any, b: Any) -> bool:
    """Both are versions and equal (a group's shard by shard)."""
    parts = _parts(a)
    return parts is not None and parts == _parts(b)


def newer_version(a: Any, b: Any) -> bool:
    """`a` is a version past `b` (every shard at least as far, one further), or `b` is none."""
    pa, pb = _parts(a), _parts(b)
    if pa is None:
        return False
    if pb is None:
        return True
    return len(pa) == len(pb) and all(x >= y for x, y in zip(pa, pb, strict=True)) and pa != pb


def version_text(version: Any) -> str:
    """ "version 688"; a group's "version 688/686" (shard 0's first); "no version"."""
    parts = _parts(version)
    return "no version" if parts is None else "version " + "/".join(str(v) for v in parts)


def accuracy_fields(
    last_eval: dict[str, Any], final: Version | None, why: str | None = None
) -> dict[str, Any]:
    """The summary's accuracy_version, final_version, final_tested and untested_why
    (module docstring); why: the launcher's reason (minips.run.final_test)."""
    tested = last_eval.get("version")
    done = final is not None and same_version(tested, final)
    if not done and why is None:
        why = "no test of it was made" if final is not None else "the final version is unknown"
    return {
        "accuracy_version": tested,
        "final_version": final,
        "final_tested": done,
        "untested_why": None if done else why,
    }


def kept_fields(summary: dict[str, Any], kept: int | None) -> dict[str, Any]:
    """The accuracy fields as the checkpoint the run directory keeps (of version `kept`)
    says, for a report: {} when it agrees with `summary`'s final version (or is unknown).
    Else its final_version is `kept`, and final_tested whether the accuracy is of it: a run
    cut short (no final version: interrupted, or its server died) kept a model its last
    evaluation may not have seen (a later one, or an earlier one a frozen server wrote),
    and a server started later on the run's files may have replaced the checkpoint."""
    final = summary.get("final_version")
    if kept is None or same_version(final, kept):
        return {}
    tested = same_version(summary.get("accuracy_version"), kept)
    if tested:
        why = None
    elif final is None:
        why = "the run ended before testing the model it keeps"
    else:
        why = f"its checkpoint was replaced after the run ended at {version_text(final)}"
    return {"final_version": kept, "final_tested": tested, "untested_why": why}


def ending(collapsed: bool, final_tested: bool, stopped_why: str | None = None) -> str:
    """How a run without an error ended: "collapsed"; STOPPED when its server was stopped
    before the run's end (a signal, another's operator key: `stopped_why`); else
    "finished", or UNTESTED when the final model was not tested."""
    if collapsed:
        return "collapsed"
    if stopped_why is not None:
        return STOPPED
    return FINISHED if final_tested else UNTESTED


def stopped_line(summary: dict[str, Any]) -> str | None:
    """One line saying the run was cut short and by what (None when it ran to its end)."""
    if summary.get("stopped_why") is None:
        return None
    return (f"the run was stopped before its end ({summary['stopped_why']} to the server): "
            f"{summary.get('samples')} samples trained")  # fmt: skip


def interrupted_line(summary: dict[str, Any]) -> str | None:
    """One line saying a stop signal cut the run's wrap-up short once training was over
    (None when none did): what was trained is kept."""
    if summary.get("interrupted") is None:
        return None
    return (f"the run was interrupted {summary['interrupted']}: its model and summary are "
            f"kept ({summary.get('samples')} samples trained)")  # fmt: skip


def kept_after_interrupt(checkpoint: str | Path) -> str:
    """What a run stopped during training keeps: its checkpoint's version and samples (the
    server writes one as it stops), or that there is none."""
    from minips.errors import MinipsError
    from minips.ops.checkpoint_file import load_checkpoint

    try:
        kept = load_checkpoint(checkpoint)
    except (MinipsError, OSError):
        return f"training was cut short; no checkpoint of it is kept at {checkpoint}"
    samples = kept.meta.get("samples")
    return (f"training was cut short; the model at version {kept.version} ({samples} samples) "
            f"is kept in {checkpoint}")  # fmt: skip


def untested_line(summary: dict[str, Any]) -> str | None:
    """One line saying the summary's accuracy is not the final model's (None when it is, or
    when the summary predates these fields)."""
    if "final_tested" not in summary or summary["final_tested"]:
        return None
    final = summary.get("final_version")
    what = version_text(final) if final is not None else "of unknown version"
    why = f" ({summary['untested_why']})" if summary.get("untested_why") else ""
    if summary.get("accuracy") is None:
        return f"the final model ({what}) was not tested{why}, and no earlier one was"
    accuracy, of = summary["accuracy"], version_text(summary.get("accuracy_version"))
    return f"the final model ({what}) was not tested{why}: the accuracy {accuracy:.4f} is of {of}"


def accuracy_line(summary: dict[str, Any]) -> str:
    """ "test accuracy: 0.8670 (version 688, the final model)": a summary's accuracy and the
    version it is of (a group's: per shard)."""
    accuracy, version = summary.get("accuracy"), version_text(summary.get("accuracy_version"))
    if accuracy is None:
        return "test accuracy: none (no model was tested)"
    final = "the final model" if summary.get("final_tested") else "NOT the final model"
    return f"test accuracy: {accuracy:.4f} ({version}, {final})"
