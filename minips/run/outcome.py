"""Whether a run's workers trained: a run whose workers all failed did not finish.

A NumPy worker process that exits non-zero by itself failed (a hello refused by a server
that restarted, a server lost for good, a bug). When every worker of a run failed so and
the servers counted fewer samples than the run was to train (`epochs` passes over the
training set, or the `--max-samples` budget), `workers_failed` is the run's error: its
summary says `error: ...` and `minips run` exits 2, whatever accuracy was measured. A run
whose workers failed only after training every sample (a goodbye a stopped server no longer
answered) did train; a run with browser slots is judged by its seats (minips.classroom.web.slots).
When only some workers failed before their shard was done, the run goes on without them
and says so in one `warning:` line (`lost_workers_line`): it trained fewer samples than it
was to. A server that restarted from an older checkpoint lost the updates after it; when
its final model then counts fewer samples than the run was to train, that is one
`warning:` line too (`short_of_samples_line`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from minips.errors import MinipsError
from minips.results.group_counts import behind_line, kept_counts
from minips.results.rundir import RunDir, final_stats
from minips.run.config import RunConfig
from minips.run.processes import Child, ProcessGroup

WORKER = "worker."  # a NumPy worker's child name: worker.<start order>


def failed_workers(processes: ProcessGroup) -> list[Child]:
    """Every NumPy worker, when each one exited non-zero by itself ([] when one is still
    running, ended well or was stopped by the launcher, or when there are none)."""
    workers = [child for name, child in processes.children.items() if name.startswith(WORKER)]
    return workers if workers and all(_failed(child) for child in workers) else []


def crashed_workers(processes: ProcessGroup) -> list[Child]:
    """The NumPy workers that exited non-zero by themselves so far (not the ones the
    launcher stopped: their exit code is its SIGTERM)."""
    return [c for name, c in processes.children.items() if name.startswith(WORKER) and _failed(c)]


def _failed(child: Child) -> bool:
    return child.crashed() and not child.stopped


def lost_workers_line(
    crashed: list[Child], run_dir: RunDir, name_of: Callable[[Child], str]
) -> str | None:
    """One `warning:` line naming (`name_of`: by rank, as the summary does) the workers of
    `crashed` (crashed_workers) that left no report saying their shard was trained; None
    when there are none."""
    finished = set()
    for path in run_dir.path.glob("worker-[0-9]*.json"):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(report, dict) and report.get("finished"):
            finished.add(report.get("pid"))
    lost = [child for child in crashed if child.proc is not None and child.proc.pid not in finished]
    if not lost:
        return None
    names = ", ".join(f"{name_of(child)} (exit code {child.code()})" for child in lost)
    return (
        f"warning: {names} stopped before its shard was trained; the run went on without "
        "it, so it trained fewer samples than it was to"
    )


def workers_failed(failed: list[Child], run_dir: RunDir, config: RunConfig) -> MinipsError | None:
    """The run's error when all its workers failed (`failed`, from failed_workers) before
    the servers counted the samples it was to train (the root's final count, less the one
    a --resume'd run started from); None otherwise."""
    if not failed or config.browser:
        return None
    samples = int(final_stats(run_dir)[0].get("samples") or 0)
    start_samples = resumed_samples(config)
    if config.max_samples and samples >= config.max_samples:
        return None  # the budget was spent
    if samples - start_samples >= config.epochs * _training_set_size(config):
        return None  # every shard trained its epochs
    first = failed[0]
    last = first.last_line(run_dir.logs).removeprefix("error: ")
    return MinipsError(
        f"every worker failed ({samples - start_samples} samples trained): "
        f"{first.name} exited with code {first.code()}: {last}"
    )


def short_of_samples_line(run_dir: RunDir, config: RunConfig, restarts: list[dict]) -> str | None:
    """One `warning:` line when a server restarted (`restarts`: the run's restart records)
    and the final model counts fewer samples than the run was to train: the updates the
    restart lost are not in it, although every worker trained its shard; a group's count is
    its shard furthest behind, which the line names (minips.results.group_counts). None
    otherwise."""
    if not restarts or config.browser:
        return None
    kept = kept_counts(final_stats(run_dir, config.servers), restarts)
    behind = behind_line(kept["behind"])  # a group's shard behind the others
    samples = int(kept["samples"] or 0) - resumed_samples(config)
    target = config.epochs * _training_set_size(config)
    if config.max_samples:
        target = min(target, config.max_samples)
    if samples >= target:
        return None if behind is None else f"warning: {behind}"
    why = behind or "the server's restart lost the updates after its last checkpoint"
    return (
        f"warning: the final model trained {samples} of the {target} samples the run was to: {why}"
    )


def _training_set_size(config: RunConfig) -> int:
    from minips.data import load_dataset
    from minips.provision.locations import find_data

    return len(load_dataset(config.dataset, config.data_dir, find=find_data).y_train)


def resumed_samples(config: RunConfig) -> int:
    """The sample count a --resume'd run starts from (0 without --resume)."""
    if not config.resume:
        return 0
    from minips.ops.checkpoint_file import load_checkpoint

    try:
        return int(load_checkpoint(config.resume).meta.get("samples", 0))
    except MinipsError:
        return 0
