"""What a run records is true: its accuracy is the final model's, named by its version, or
the run says it is not; a run whose workers all failed is not a finished run."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from minips.errors import MinipsError
from minips.nn import build_model
from minips.ops.checkpoint_file import write_checkpoint
from minips.results.loading import load_run
from minips.results.metrics import MetricsLog, read_metrics
from minips.results.report import summarize
from minips.results.report_text import format_report
from minips.results.rundir import RunDir, write_results
from minips.results.versions import (
    UNTESTED,
    accuracy_fields,
    newer_version,
    run_version,
    same_version,
    untested_line,
)
from minips.run.config import RunConfig
from minips.run.final_test import ensure_final_tested
from minips.run.launch import run_local

FAST = {"model": "mlp", "dataset": "synthetic", "lr": 0.05, "momentum": 0.5, "rule": "asgd"}


# --- the version fields, by hand ---------------------------------------------------------


def test_versions_compare_shard_by_shard():
    assert run_version([{"version": 7}]) == 7
    assert run_version([{"version": 7}, {"version": 6}]) == [7, 6]
    assert run_version([{"version": 7}, {}]) is None  # a shard's last stats are missing
    assert same_version([3, 3], (3, 3)) and same_version(5, 5) and not same_version(5, [5, 4])
    assert not same_version(None, None)
    assert newer_version([4, 3], [3, 3]) and not newer_version([4, 2], [3, 3])
    assert newer_version(4, None) and not newer_version(None, 3)
    fields = accuracy_fields({"version": [3, 3]}, [9, 9], "the last checkpoint is of version 3/3")
    assert fields == {"accuracy_version": [3, 3], "final_version": [9, 9], "final_tested": False,
                      "untested_why": "the last checkpoint is of version 3/3"}  # fmt: skip
    line = untested_line({"accuracy": 0.5, **fields})
    assert line == ("the final model (version 9/9) was not tested (the last checkpoint is of "
                    "version 3/3): the accuracy 0.5000 is of version 3/3")  # fmt: skip
    assert untested_line({"accuracy": 0.5, **accuracy_fields({"version": 9}, 9)}) is None


def _run_dir(tmp_path: Path, evals: list[dict], final_version: int) -> RunDir:
    """A run directory as a server and an evaluator leave it: an update log ending with
    the server's last stats, and an eval log."""
    run_dir = RunDir(tmp_path)
    stats = {"version": final_version, "updates": final_version, "samples": 640}
    lines = [{"event": "server", "time": 9.0, "stats": stats}]
    run_dir.updates_log().write_text("".join(json.dumps(r) + "\n" for r in lines))
    records = [{"event": "eval", "time": 1.0 + i, **e} for i, e in enumerate(evals)]
    run_dir.eval_log.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "config.json").write_text(json.dumps({"rule": "asgd", "workers": 1}))
    return run_dir


def _results(run_dir: RunDir) -> dict:
    return write_results(run_dir, "asgd", 1, 10.0, {"server": 0})


def test_a_summary_whose_last_test_is_of_an_earlier_version_is_not_finished(tmp_path):
    run_dir = _run_dir(
        tmp_path, [{"version": 0, "accuracy": 0.1}, {"version": 4, "accuracy": 0.6}], 10
    )
    summary = _results(run_dir)
    assert summary["accuracy"] == 0.6
    assert (summary["accuracy_version"], summary["final_version"]) == (4, 10)
    assert summary["ended"] == UNTESTED and summary["final_tested"] is False
    assert json.loads(run_dir.summary.read_text())["ended"] == UNTESTED
    text = format_report(summarize(load_run(tmp_path)))
    assert "accuracy 0.6000 (version 4)" in text
    assert "NOT THE FINAL MODEL: the final model (version 10) was not tested" in text


def test_results_interrupted_while_written_leave_no_run_that_reads_as_complete(
    tmp_path, monkeypatch
):
    """Ctrl-C (or a scheduler's SIGTERM) while metrics.jsonl is written: neither it nor
    summary.json is left half written; the run reads as interrupted, and writing the
    results again makes it whole."""
    evals = [{"version": v, "accuracy": 0.1 * v} for v in range(6)]
    run_dir = _run_dir(tmp_path, evals, 5)
    written = []

    def interrupted_at_the_third(self, record):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(record)
        return write_record(self, record)

    write_record = MetricsLog.write_record
    monkeypatch.setattr(MetricsLog, "write_record", interrupted_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        _results(run_dir)
    assert not run_dir.metrics.exists() and not run_dir.summary.exists()
    assert not load_run(tmp_path).complete
    monkeypatch.setattr(MetricsLog, "write_record", write_record)
    summary = _results(run_dir)
    assert load_run(tmp_path).complete and json.loads(run_dir.summary.read_text()) == summary
    assert sorted(p.name for p in tmp_path.glob("*partial*")) == []


def test_a_summary_of_the_final_version_is_finished(tmp_path):
    run_dir = _run_dir(
        tmp_path, [{"version": 0, "accuracy": 0.1}, {"version": 10, "accuracy": 0.8}], 10
    )
    summary = _results(run_dir)
    assert summary["ended"] == "finished" and summary["final_tested"] is True
    assert summary["accuracy_version"] == summary["final_version"] == 10
    assert "NOT THE FINAL MODEL" not in format_report(summarize(load_run(tmp_path)))


def test_a_groups_summary_row_is_each_shards_last_generation_and_its_own_restarts(tmp_path):
    """Shard 1 crashed once and was restarted (its second generation's log): its row has
    the counters of its last `server` record, and only its own restart; the root's row
    none of shard 1's."""
    run_dir = _run_dir(tmp_path, [{"version": 10, "accuracy": 0.8}], 10)
    generations = [(3.0, {"version": 4, "updates": 4, "bytes_in": 100}),
                   (9.0, {"version": 10, "updates": 10, "bytes_in": 300})]  # fmt: skip
    for generation, (when, stats) in enumerate(generations):
        record = {"event": "server", "time": when, "stats": stats}
        run_dir.updates_log(generation, shard=1).write_text(json.dumps(record) + "\n")
    restarts = [{"shard": 1, "updates_lost": 2}]
    summary = write_results(run_dir, "asgd", 1, 10.0, {"server": 0}, restarts=restarts,
                            servers=2)  # fmt: skip
    rows = {row["shard"]: row for row in summary["shards"]}
    assert (rows[1]["updates"], rows[1]["version"], rows[1]["bytes_up"]) == (10, 10, 300)
    assert (rows[1]["restarts"], rows[1]["updates_lost"]) == (1, 2)
    assert (rows[0]["restarts"], rows[0]["updates_lost"]) == (0, 0)
    assert summary["restarts"] == 1 and summary["bytes_up"] == 300


def test_a_round_lost_on_every_shard_counts_once_in_the_groups_updates_lost(tmp_path):
    """An ssgd group rolled back: every shard lost the same 44 rounds (one record each).
    The run lost 44 updates, not 88; each row keeps its own."""
    run_dir = _run_dir(tmp_path, [{"version": 10, "accuracy": 0.8}], 10)
    restarts = [{"shard": 0, "updates_lost": 44}, {"shard": 1, "updates_lost": 44},
                {"shard": 1, "updates_lost": 3}]  # fmt: skip
    summary = write_results(run_dir, "ssgd", 1, 10.0, {"server": 0}, restarts=restarts,
                            servers=2)  # fmt: skip
    assert [row["updates_lost"] for row in summary["shards"]] == [44, 47]
    assert summary["updates_lost"] == 47 and summary["restarts"] == 3


def _checkpoint(path: Path, version: int) -> None:
    """A checkpoint of the FAST model (untrained weights) at `version`."""
    spec = {"name": "mlp", "kwargs": {}}
    model = build_model("mlp", seed=0)
    arrays = {f"param/{n}": a for n, a in model.params.items()}
    arrays.update({f"param_version/{n}": np.array(version, np.int64) for n in model.params})
    arrays["version"] = np.array(version, np.int64)
    meta = {"format": 1, "rule": "asgd", "updates": version, "samples": 64 * version,
            "spec": spec, "arrays": sorted(arrays)}  # fmt: skip
    arrays["meta"] = np.array(json.dumps(meta))
    write_checkpoint(path, arrays)


@pytest.mark.parametrize("checkpoint_version", [10, 7], ids=["final", "older"])
def test_the_launcher_tests_the_checkpoint_when_the_evaluator_did_not(tmp_path, checkpoint_version):
    run_dir = _run_dir(tmp_path, [{"version": 4, "accuracy": 0.6}], 10)
    _checkpoint(run_dir.checkpoint, checkpoint_version)
    config = RunConfig(workers=1, checkpoint=str(run_dir.checkpoint), **FAST)
    why = ensure_final_tested(config, run_dir, time.monotonic() - 60)  # t0: the run began
    record = read_metrics(run_dir.eval_log)[-1]
    assert record["by"] == "launcher" and record["version"] == checkpoint_version
    assert record["final"] is (checkpoint_version == 10)
    assert why == (None if checkpoint_version == 10 else "the last checkpoint is of version 7")
    summary = write_results(run_dir, "asgd", 1, 10.0, {"server": 0}, untested_why=why)
    assert summary["accuracy"] == record["accuracy"] != 0.6
    assert summary["accuracy_version"] == checkpoint_version
    assert summary["ended"] == ("finished" if checkpoint_version == 10 else UNTESTED)
    assert summary["untested_why"] == why


def test_no_checkpoint_test_when_the_evaluator_tested_the_final_version(tmp_path):
    run_dir = _run_dir(tmp_path, [{"version": 10, "accuracy": 0.8}], 10)
    _checkpoint(run_dir.checkpoint, 10)
    config = RunConfig(workers=1, checkpoint=str(run_dir.checkpoint), **FAST)
    assert ensure_final_tested(config, run_dir, time.monotonic()) is None
    assert len(read_metrics(run_dir.eval_log)) == 1


def test_a_missing_checkpoint_is_said(tmp_path):
    run_dir = _run_dir(tmp_path, [{"version": 4, "accuracy": 0.6}], 10)
    config = RunConfig(workers=1, checkpoint=str(run_dir.checkpoint), **FAST)
    why = ensure_final_tested(config, run_dir, time.monotonic())
    assert why.startswith("the last checkpoint could not be tested (checkpoint ")
    assert "does not exist" in why


# --- real runs ---------------------------------------------------------------------------


def _evaluator_pid(out: Path) -> int | None:
    """The pid of the evaluator of the run writing to `out` (from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"evaluate" in argv and str(out / "eval.jsonl").encode() in argv:
            return int(entry.name)
    return None


def _signal_evaluator_after_its_first_test(out: Path, signum: int) -> threading.Thread:
    """Send `signum` to the run's evaluator once it wrote its first record (before any
    worker trained: the launcher starts the workers after it)."""

    def act() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            log = out / "eval.jsonl"
            if log.exists() and log.read_text().strip():
                pid = _evaluator_pid(out)
                if pid is not None:
                    os.kill(pid, signum)
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("servers", "signum"),
    [(1, signal.SIGKILL), (2, signal.SIGKILL), (1, signal.SIGSTOP)],
    ids=["killed", "killed-group", "frozen"],
)
def test_the_accuracy_is_the_final_models_when_the_evaluator_cannot_test_it(
    tmp_path, servers, signum
):
    # A frozen evaluator stands for one too slow to test the final model before the
    # server's stop grace runs out: the launcher does not wait for it, it tests itself.
    spec = RunConfig(epochs=3, workers=2, servers=servers, **FAST)
    thread = _signal_evaluator_after_its_first_test(tmp_path, signum)
    summary = run_local(spec, tmp_path, eval_interval=0.5)
    thread.join(1)
    assert summary["final_version"] is not None
    assert summary["accuracy_version"] == summary["final_version"]
    assert summary["final_tested"] and summary["ended"] == "finished"
    assert summary["accuracy"] >= 0.9  # the trained model's, not the untrained one's
    last = [r for r in read_metrics(tmp_path / "eval.jsonl") if r["event"] == "eval"][-1]
    assert last["by"] == "launcher" and last["final"] and last["accuracy"] == summary["accuracy"]
    assert summary["exit_codes"]["evaluator"] != 0


def test_a_run_whose_workers_all_fail_is_an_error(tmp_path, monkeypatch):
    # Every worker refuses its options (an environment variable the launcher's children
    # inherit) and exits 2 before training anything.
    monkeypatch.setenv("MINIPS_WORKER_BANDWIDTH", "not-a-rate")
    spec = RunConfig(epochs=2, workers=2, **FAST)
    with pytest.raises(MinipsError, match="every worker failed"):
        run_local(spec, tmp_path, eval_interval=0.5)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ended"].startswith("error: every worker failed")
    workers = {name: code for name, code in summary["exit_codes"].items() if "worker" in name}
    assert list(workers.values()) == [2, 2]


def test_minips_run_names_the_version_of_its_accuracy():
    from minips.results.versions import accuracy_line

    tested = {"accuracy": 0.865, **accuracy_fields({"version": [688, 672]}, [688, 672])}
    assert accuracy_line(tested) == "test accuracy: 0.8650 (version 688/672, the final model)"
    untested = {"accuracy": 0.713, **accuracy_fields({"version": [31, 31]}, [667, 688])}
    assert accuracy_line(untested) == "test accuracy: 0.7130 (version 31/31, NOT the final model)"
    assert untested_line(untested) == (
        "the final model (version 667/688) was not tested (no test of it was made): "
        "the accuracy 0.7130 is of version 31/31"
    )


class _Failed:
    """A worker child that exited 2 with an error line (what workers_failed reads)."""

    name = "worker.0"

    def code(self) -> int:
        return 2

    def last_line(self, _logs: Path) -> str:
        return "error: server refused the request (group): the server group is not complete"


@pytest.mark.parametrize(
    ("samples", "options", "failed"),
    [(640, {}, True), (2 * 2000, {}, False), (640, {"max_samples": 600}, False)],
    ids=["before-its-samples", "after-every-epoch", "after-the-budget"],
)
def test_workers_that_fail_before_their_samples_fail_the_run(tmp_path, samples, options, failed):
    from minips.run.outcome import workers_failed

    run_dir = _run_dir(tmp_path, [{"version": 10, "accuracy": 0.8}], 10)
    stats = {"version": 10, "samples": samples}
    run_dir.updates_log().write_text(json.dumps({"event": "server", "stats": stats}) + "\n")
    config = RunConfig(epochs=2, workers=2, **{**FAST, **options})  # synthetic: 2000 samples
    error = workers_failed([_Failed(), _Failed()], run_dir, config)
    assert (error is not None) is failed
    if failed:
        assert str(error) == (
            "every worker failed (640 samples trained): worker.0 exited with code 2: server "
            "refused the request (group): the server group is not complete"
        )
    assert workers_failed([], run_dir, config) is None  # a worker still ran, or ended well
