"""trace: the Chrome trace file is valid and nested sanely; the step summary's arithmetic."""

import json
import threading
import time

import pytest

from minips.results.trace import NullTrace, Trace, load_events, main, open_trace, summarize


def _spans(path):
    return [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]


def test_trace_file_is_valid_chrome_json_with_nested_spans(tmp_path):
    path = tmp_path / "t.json"
    with Trace(path) as trace:
        with trace.span("step", "step", tid="main", args={"step": 0}):
            with trace.span("conv1", "compute", tid="main"):
                time.sleep(0.002)
            with trace.span("fc1", "compute", tid="main"):
                time.sleep(0.002)
    document = json.load(open(path))  # valid JSON, object form
    assert document["displayTimeUnit"] == "ms"
    spans = _spans(path)
    assert [e["name"] for e in spans] == ["conv1", "fc1", "step"]  # recorded when they end
    for event in spans:
        assert {"ph", "ts", "dur", "pid", "tid", "name", "cat"} <= event.keys()
        assert event["dur"] >= 1500  # microseconds
    step, (conv1, fc1) = spans[2], spans[:2]
    for child in (conv1, fc1):  # children lie inside their parent
        assert step["ts"] <= child["ts"]
        assert child["ts"] + child["dur"] <= step["ts"] + step["dur"]
    assert conv1["ts"] + conv1["dur"] <= fc1["ts"]  # siblings in order, not overlapping
    assert step["args"] == {"step": 0}
    names = [e for e in document["traceEvents"] if e["ph"] == "M"]
    assert names == [
        {"ph": "M", "name": "thread_name", "pid": step["pid"], "tid": step["tid"], "ts": 0,
         "args": {"name": "main"}}
    ]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # nothing left beside it


def test_threads_record_on_their_own_rows_without_losing_events(tmp_path):
    path = tmp_path / "t.json"
    trace = Trace(path)

    def sender():
        for i in range(500):
            with trace.span(f"layer{i % 4}", "send"):
                pass

    threads = [threading.Thread(target=sender, name=f"sender{k}") for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    trace.close()
    spans = _spans(path)
    assert len(spans) == 2000
    rows = {e["tid"] for e in spans}
    assert len(rows) == 4  # default row = the calling thread
    labels = {e["args"]["name"] for e in json.load(open(path))["traceEvents"] if e["ph"] == "M"}
    assert labels == {"sender0", "sender1", "sender2", "sender3"}


def test_complete_takes_explicit_times(tmp_path):
    trace = Trace(tmp_path / "t.json")
    start = trace.now()
    trace.complete("fc1", "send", start, start + 0.25, tid="sender", args={"bytes": 1600000})
    trace.close()
    (event,) = _spans(tmp_path / "t.json")
    assert event["dur"] == pytest.approx(250_000)
    assert event["args"] == {"bytes": 1600000}


def test_null_trace_does_nothing_and_costs_little(tmp_path):
    trace = open_trace(None)
    assert isinstance(trace, NullTrace) and not trace.enabled
    start = time.thread_time()  # this thread's CPU time: waiting for a busy core is not counted
    for _ in range(10_000):
        with trace.span("conv1", "compute"):
            pass
    per_span = (time.thread_time() - start) / 10_000
    assert per_span < 20e-6  # ~0.2 us on a quiet machine
    trace.complete("x", "send", 0.0, 1.0)
    trace.close()
    assert trace.events() == []
    assert list(tmp_path.iterdir()) == []
    assert isinstance(open_trace(tmp_path / "t.json"), Trace)


def _x(name, cat, start_ms, end_ms, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": start_ms * 1e3,
            "dur": (end_ms - start_ms) * 1e3, "pid": 1, "tid": 1, "args": args}  # fmt: skip


def test_summary_overlap_of_sending_and_compute():
    # Step 0: compute 0-10 and 12-20 ms; fc1 sent 5-15 ms, fc2 8-9 (inside fc1's send).
    # Step 1: serial: compute 20-30, send 30-40.
    events = [
        _x("step", "step", 0, 20, step=0),
        _x("fc2", "compute", 0, 5),
        _x("conv", "compute", 5, 10),
        _x("conv", "compute", 12, 20),
        _x("fc1", "send", 5, 15),
        _x("fc2", "send", 8, 9),
        _x("step", "step", 20, 40, step=1),
        _x("all", "compute", 20, 30),
        _x("all", "send", 30, 40),
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
    ]
    summary = summarize(events)
    first, second = summary["steps"]
    assert first == pytest.approx(
        {
            "step": 0,
            "wall_ms": 20,
            "compute_ms": 18,
            "comm_ms": 10,
            "overlap_ms": 8,
            "exposed_comm_ms": 2,
        }  # fmt: skip
    )
    assert second == pytest.approx(
        {
            "step": 1,
            "wall_ms": 20,
            "compute_ms": 10,
            "comm_ms": 10,
            "overlap_ms": 0,
            "exposed_comm_ms": 10,
        }  # fmt: skip
    )
    assert summary["mean"]["overlap_ms"] == pytest.approx(4)


def test_summary_clips_spans_to_their_step_and_counts_pulls_as_comm():
    events = [
        _x("step", "step", 0, 10, step=3),
        _x("fc1", "recv", -5, 4),  # started before the step: only 0-4 counts
        _x("conv1", "compute", 2, 12),  # runs past the step: only 2-10 counts
    ]
    (row,) = summarize(events)["steps"]
    assert row["step"] == 3
    assert row["comm_ms"] == pytest.approx(4)
    assert row["compute_ms"] == pytest.approx(8)
    assert row["overlap_ms"] == pytest.approx(2)


def test_summary_without_steps_treats_the_trace_as_one(tmp_path, capsys):
    path = tmp_path / "t.json"
    with Trace(path) as trace:
        base = trace.now()
        trace.complete("c", "compute", base, base + 0.010)
        trace.complete("s", "send", base + 0.005, base + 0.020, tid="sender")
    (row,) = summarize(load_events(path))["steps"]
    assert row["wall_ms"] == pytest.approx(20)
    assert row["overlap_ms"] == pytest.approx(5)
    assert main([str(path)]) == 0
    assert "5.00" in capsys.readouterr().out


def test_a_worker_interrupted_while_its_sender_closes_still_writes_its_trace(tmp_path, monkeypatch):
    """Ctrl-C then the launcher's SIGTERM: the second interrupt may land while the worker
    waits for its sender thread; the --trace file is written all the same."""
    from minips.run.build import make_server
    from minips.run.config import RunConfig
    from minips.worker.client import PSClient
    from minips.worker.transmit import StepSender
    from minips.worker.worker import Worker

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(StepSender, "close", interrupted)
    path = tmp_path / "worker.json"
    server = make_server(RunConfig(model="mlp", dataset="synthetic", workers=1, epochs=1))
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    try:
        with PSClient(server.endpoint, timeout=30) as client:
            with pytest.raises(KeyboardInterrupt):
                Worker(client, max_steps=2, trace=Trace(path)).run()
    finally:
        server.request_stop()
        loop.join(timeout=10)
        server.close()
    steps = [e for e in json.loads(path.read_text())["traceEvents"] if e["name"] == "step"]
    assert len(steps) == 2
