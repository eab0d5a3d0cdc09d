"""ParameterServer over real sockets: ops, versions, dedup, errors, checkpoints, stop."""

import threading
import time

import numpy as np
import pytest
from test_server_support import SHAPES, RawPeer, make_params, packb, running_server, snapshot

from minips.errors import ConfigError, ShapeError
from minips.ops.checkpoint_file import read_checkpoint
from minips.ops.ops_options import OpsOptions
from minips.ops.server_ops import ServerOps
from minips.protocol import wire
from minips.rules import make_rule
from minips.server.server import ParameterServer, ServerOptions
from minips.state.store import SGD
from minips.worker.client import PSClient, ServerError


def _grads(value=1.0):
    return {name: np.full(shape, value, np.float32) for name, shape in SHAPES.items()}


def test_hello_assigns_ranks_and_returns_config():
    with running_server(world_size=2) as server:
        with PSClient(server.endpoint, worker_id="a") as a, PSClient(server.endpoint) as b:
            first = a.hello({"host": "here"})
            assert first["rank"] == 0 and first["world_size"] == 2
            assert first["config"]["model"] == "test"
            assert first["config"]["rank"] == 0 and first["config"]["rule"] == {"name": "asgd"}
            assert b.hello()["rank"] == 1
            assert a.hello()["rank"] == 0  # same worker id, same rank
            with PSClient(server.endpoint) as c, pytest.raises(ServerError) as info:
                c.hello()
            assert info.value.code == "full"
            stats = a.stats()
            assert stats["live_workers"] == 2
            assert {w["worker"]: w["rank"] for w in stats["workers"]}["a"] == 0


def test_a_finished_workers_rank_is_not_given_again_but_a_dead_ones_is():
    # 1 s: the second worker, pinging every 0.1 s, stays alive through a loaded machine's
    # stalls while the silent third is declared dead.
    with running_server(world_size=3, heartbeat_timeout=1.0) as server:
        with PSClient(server.endpoint) as first:
            assert first.hello()["rank"] == 0
            first.bye()  # done with shard 0 before anyone else arrived
        with PSClient(server.endpoint) as second:
            assert second.hello()["rank"] == 1  # not 0: shard 0 must not be trained twice
            with PSClient(server.endpoint) as third:
                assert third.hello()["rank"] == 2
                third.close()  # dies silently: declared dead after the heartbeat timeout
                deadline = time.monotonic() + 60  # only catches a hang
                while second.stats()["live_workers"] != 1:
                    assert time.monotonic() < deadline, "the silent worker was never declared dead"
                    second.ping()
                    time.sleep(0.1)
                with PSClient(server.endpoint) as replacement:
                    assert replacement.hello()["rank"] == 2  # takes over the dead one's shard


def test_asgd_push_pull_versions():
    params = make_params()
    before = {k: v.copy() for k, v in params.items()}
    records = []
    with running_server("asgd", params=params, lr=0.5, on_update=records.append) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            full = ps.pull()
            assert full.version == 0 and set(full.params) == set(SHAPES)
            np.testing.assert_array_equal(full.params["fc.w"], before["fc.w"])
            reply = ps.push({"fc.b": np.ones(4, np.float32)}, base=0)
            assert (reply.version, reply.applied, reply.staleness, reply.stop) == (
                1,
                True,
                0,
                False,
            )
            np.testing.assert_array_equal(params["fc.b"], before["fc.b"] - 0.5)
            # Only the changed parameter comes back, all versions do.
            delta = ps.pull(since=0)
            assert list(delta.params) == ["fc.b"]
            assert delta.param_versions == {"fc.w": 0, "fc.b": 1}
            np.testing.assert_array_equal(delta.params["fc.b"], params["fc.b"])
            assert ps.pull(since=1).params == {}
            # A gradient computed at version 0 applied at version 1 is 1 stale.
            assert ps.push(_grads(), base=0).staleness == 1
    assert [r["version"] for r in records] == [1, 2]
    assert records[1]["staleness"] == [1] and records[1]["workers"] == [0]
    assert records[1]["params"] == ["fc.w", "fc.b"] and records[1]["scale"] == 1.0


def test_pull_snapshot_is_not_changed_by_later_updates():
    with running_server() as server, PSClient(server.endpoint) as ps:
        ps.hello()
        first = ps.pull().params["fc.b"].copy()
        held = ps.pull().params["fc.b"]
        ps.push(_grads(), base=0)
        np.testing.assert_array_equal(held, first)


def test_fp16_push_is_widened():
    params = make_params()
    expected = params["fc.w"] - 0.5 * np.float32(0.25)
    with running_server(params=params) as server, PSClient(server.endpoint) as ps:
        ps.hello()
        grad = np.full((3, 4), 0.25, np.float32)
        ps.push({"fc.w": grad}, base=0, codecs={"fc.w": "fp16"})
        np.testing.assert_array_equal(params["fc.w"], expected)


def test_duplicate_push_applied_once_and_answered_the_same():
    params = make_params()
    with running_server(params=params) as server, RawPeer(server.endpoint) as peer:
        peer.request({"op": "hello", "worker": "w"})
        push = {"op": "push", "worker": "w", "seq": 5, "base": 0}
        first = peer.request({**push, "rid": 1}, _grads())
        after_first = snapshot(server)
        again = peer.request({**push, "rid": 2}, _grads())
        assert snapshot(server) == after_first
        assert server.store.version == 1
        assert again.header["rid"] == 2
        assert {k: v for k, v in again.header.items() if k != "rid"} == {
            k: v for k, v in first.header.items() if k != "rid"
        }
        stale = peer.request({**push, "seq": 4}, _grads())
        assert stale.header["code"] == "stale_seq"
        assert snapshot(server) == after_first


def _push_header(**fields):
    return packb({"v": 1, "op": "push", "rid": 9, "worker": "w", "seq": 1, "base": 0, **fields})


def _desc(name="fc.b", dtype="float32", shape=(4,), codec="dense"):
    return {"name": name, "dtype": dtype, "shape": list(shape), "codec": codec}


F4 = np.ones(4, np.float32).tobytes()
NAN = np.array([0, np.nan, 0, 0], np.float32).tobytes()
INF = np.array([0, 0, -np.inf, 0], np.float32).tobytes()
BAD_MESSAGES = {
    "garbage": ([b"\x00garbage\xff"], "malformed"),
    "empty header": ([b""], "malformed"),
    "truncated header": ([_push_header(arrays=[_desc()])[:-7], F4], "malformed"),
    "wrong version": ([packb({"v": 2, "op": "ping", "worker": "w"})], "version"),
    "unknown op": ([packb({"v": 1, "op": "explode", "worker": "w"})], "unknown_op"),
    "missing field": ([packb({"v": 1, "op": "push", "worker": "w", "seq": 0})], "bad_field"),
    "missing frame": ([_push_header(arrays=[_desc()])], "frame_count"),
    "extra frame": ([_push_header(arrays=[_desc()]), F4, F4], "frame_count"),
    "truncated frame": ([_push_header(arrays=[_desc()]), F4[:-1]], "shape"),
    "nine dimensions": ([_push_header(arrays=[_desc(shape=(1,) * 9)]), F4], "too_large"),
    "wrong shape": ([_push_header(arrays=[_desc(shape=(2, 2))]), F4], "shape"),
    "wrong dtype": ([_push_header(arrays=[_desc(dtype="int32")]), F4], "dtype"),
    "float64": ([_push_header(arrays=[_desc(dtype="float64")]), F4 + F4], "dtype"),
    "nan": ([_push_header(arrays=[_desc()]), NAN], "nonfinite"),
    "inf": ([_push_header(arrays=[_desc()]), INF], "nonfinite"),
    "unknown param": ([_push_header(arrays=[_desc(name="fc.x")]), F4], "unknown_param"),
    "no gradient": ([_push_header()], "unknown_param"),
    "future base": ([_push_header(base=7, arrays=[_desc()]), F4], "bad_base"),
    "unregistered": ([_push_header(worker="ghost", arrays=[_desc()]), F4], "unknown_worker"),
    "one bad of two": (
        [_push_header(arrays=[_desc(name="fc.b"), _desc(name="fc.w")]), F4, F4],
        "shape",
    ),
}


def test_bad_messages_get_errors_and_change_nothing():
    # Small decoder limits so an oversized frame is cheap to send (the transport limit is 2x).
    limits = wire.Limits(max_frame_bytes=1 << 16, max_header_bytes=1 << 12)
    with running_server(momentum=0.9, limits=limits) as server:
        with RawPeer(server.endpoint) as peer:
            peer.request({"op": "hello", "worker": "w"})
            peer.request({"op": "push", "worker": "w", "seq": 0, "base": 0}, _grads())
            before, velocity = snapshot(server), dict(server.store.optimizer.velocity)
            velocity = {k: v.tobytes() for k, v in velocity.items()}
            for label, (frames, code) in BAD_MESSAGES.items():
                peer.send(frames)
                reply = peer.recv()
                assert reply.op == "error", label
                assert reply.header["code"] == code, (label, reply.header["reason"])
                assert reply.header["reason"], label
                assert snapshot(server) == before, label
                assert server.store.version == 1, label
                got = {k: v.tobytes() for k, v in server.store.optimizer.velocity.items()}
                assert got == velocity, label
                # ...and the server still serves.
                assert peer.request({"op": "ping", "worker": "w"}).header["stop"] is False
            assert server.stats()["errors"] == len(BAD_MESSAGES)
            assert peer.request(
                {"op": "push", "worker": "w", "seq": 2, "base": 1}, _grads()
            ).header["applied"]


def test_error_reply_echoes_rid_when_readable():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        peer.send([packb({"v": 1, "op": "pull", "rid": 42})])  # no worker field
        reply = peer.recv()
        assert reply.header["code"] == "bad_field" and reply.header["rid"] == 42


def test_req_socket_envelope_is_echoed():
    with running_server() as server, RawPeer(server.endpoint, req=True) as peer:
        reply = peer.request({"op": "stats"})
        assert reply.op == "stats" and reply.header["stats"]["version"] == 0


def test_stats_counts_traffic_and_staleness():
    with running_server() as server, PSClient(server.endpoint) as ps:
        ps.hello({"pid": 1})
        ps.pull()
        ps.push(_grads(), base=0, samples=32)
        ps.push(_grads(), base=0, samples=8)
        stats = ps.stats()
        assert stats["version"] == 2 and stats["updates"] == 2 and stats["samples"] == 40
        assert stats["param_versions"] == {"fc.w": 2, "fc.b": 2}
        assert stats["staleness_max"] == 1 and stats["staleness_mean"] == 0.5
        assert stats["bytes_in"] > 2 * 16 * 4 and stats["bytes_out"] > 16 * 4
        (worker,) = stats["workers"]
        assert worker["info"] == {"pid": 1} and worker["pushes"] == 2 and worker["clock"] == 2
        assert worker["samples"] == 40 and worker["observer"] is False


def test_checkpoint_and_resume(tmp_path):
    path = tmp_path / "ckpt" / "server.npz"
    params = make_params()
    with running_server(params=params, momentum=0.9, checkpoint_path=path) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            for step in range(3):
                ps.push(_grads(step + 1.0), base=step)
            assert ps.checkpoint() == str(path)
    saved = {k: v.copy() for k, v in params.items()}
    velocity = {k: v.copy() for k, v in server.store.optimizer.velocity.items()}
    fresh = make_params(seed=1)
    optimizer = SGD(fresh, lr=0.5, momentum=0.9)
    resumed = ParameterServer(fresh, make_rule("asgd"), optimizer, OpsOptions(resume=path),
                              operations=ServerOps)  # fmt: skip
    try:
        assert resumed.store.version == 3
        assert resumed.store.param_versions == {"fc.w": 3, "fc.b": 3}
        for name in saved:
            np.testing.assert_array_equal(fresh[name], saved[name])
            np.testing.assert_array_equal(optimizer.velocity[name], velocity[name])
    finally:
        resumed.close()
    # No temp files left; the checkpoint before the last is kept beside it.
    assert sorted(p.name for p in path.parent.iterdir()) == ["server.npz", "server.prev.npz"]


def test_resume_rejects_a_different_model(tmp_path):
    path = tmp_path / "c.npz"
    params = make_params()
    with running_server(params=params, checkpoint_path=path):
        pass  # the shutdown checkpoint
    assert path.exists()
    other = {"fc.w": np.zeros((4, 3), np.float32), "fc.b": np.zeros(4, np.float32)}
    with pytest.raises(ShapeError):
        ParameterServer(other, make_rule("asgd"), SGD(other), OpsOptions(resume=path),
                        operations=ServerOps)  # fmt: skip


def test_periodic_checkpoints(tmp_path):
    path = tmp_path / "c.npz"
    with running_server(checkpoint_path=path, checkpoint_every=2) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            ps.push(_grads(), base=0)
            assert not path.exists()
            ps.push(_grads(), base=1)
            assert path.exists()


def test_kept_checkpoints_hold_the_model_at_each_versions_own_point(tmp_path):
    path = tmp_path / "c.npz"
    with running_server(checkpoint_path=path, checkpoint_every=2, keep_checkpoints=True,
                        lr=1.0) as server:  # fmt: skip
        with PSClient(server.endpoint) as ps:
            ps.hello()
            at_version = {}
            for base in range(4):
                ps.push(_grads(), base=base)
                at_version[base + 1] = {name: a.copy() for name, a in server.store.params.items()}
    kept = sorted(p.name for p in tmp_path.glob("c-v*.npz"))
    assert kept == ["c-v000002.npz", "c-v000004.npz"]  # the shutdown's (version 4) not twice
    for version in (2, 4):
        saved = read_checkpoint(tmp_path / f"c-v{version:06d}.npz")
        assert int(saved["version"]) == version
        for name, expected in at_version[version].items():
            np.testing.assert_array_equal(saved[f"param/{name}"], expected)
    assert not np.array_equal(at_version[2]["fc.w"], at_version[4]["fc.w"])


def test_checkpoint_without_path_is_an_error():
    with (
        running_server() as server,
        PSClient(server.endpoint) as ps,
        pytest.raises(ServerError) as info,
    ):
        ps.checkpoint()
    assert info.value.code == "no_checkpoint"


def test_stop_flags_replies_and_ends_the_loop():
    params = make_params()
    optimizer = SGD(params, lr=0.1)
    server = ParameterServer(
        params,
        make_rule("asgd"),
        optimizer,
        ServerOptions(stop_grace=10.0, poll_interval=0.02),
        operations=ServerOps,
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with PSClient(server.endpoint) as worker, PSClient(server.endpoint) as operator:
            worker.hello()
            operator.stop()
            before = snapshot(server)
            reply = worker.push(_grads(), base=0)
            assert reply.stop and not reply.applied
            assert snapshot(server) == before
            assert worker.pull().stop
            with pytest.raises(ServerError) as info, PSClient(server.endpoint) as late:
                late.hello()
            assert info.value.code == "stopping"
            worker.bye()  # the last live worker leaves: the loop ends without the grace
            thread.join(timeout=5)
            assert not thread.is_alive()
    finally:
        server.close()


def test_constructor_validates():
    params = make_params()
    with pytest.raises(ConfigError):
        ParameterServer(params, make_rule("asgd"), SGD(dict(params)), operations=ServerOps)
    with pytest.raises(ConfigError):
        ParameterServer(params, make_rule("asgd"), SGD(params), config={"bad": object()},
                        operations=ServerOps)  # fmt: skip
    with pytest.raises(ConfigError):
        make_rule("nope")
    with pytest.raises(ConfigError):
        make_rule("ssp", staleness=-1)


def test_corrupted_pushes_never_cause_an_internal_error():
    rng = np.random.default_rng(0)
    good = [
        bytes(f)
        for f in wire.encode(
            {"op": "push", "worker": "w", "seq": 1, "base": 0, "rid": 5},
            {"fc.b": np.ones(4, np.float32)},
        )
    ]
    with running_server() as server, RawPeer(server.endpoint) as peer:
        peer.request({"op": "hello", "worker": "w"})
        codes = set()
        for _ in range(300):
            header = bytearray(good[0])  # corrupt 1-3 bytes of the header
            for _ in range(rng.integers(1, 4)):
                header[rng.integers(len(header))] = rng.integers(256)
            before = snapshot(server)
            peer.send([bytes(header), good[1]])
            reply = peer.recv()
            if reply.op == "error":
                codes.add(reply.header["code"])
                assert snapshot(server) == before
        assert "internal" not in codes
        assert len(codes) > 3  # many different rules were exercised
        assert peer.request({"op": "ping", "worker": "w"}).op == "ping"


def test_sample_budget_stops_at_once_and_counts_nothing_after():
    with running_server(max_samples=10, stop_grace=5.0) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello()
            b.hello()
            before_b = snapshot(server)
            spent = a.push(_grads(1.0), base=0, samples=10)  # spends the whole budget
            assert spent.applied  # it counted (its reply was sent before the budget check)
            assert a.ping()  # and from then on every reply says stop
            before = snapshot(server)
            late = b.push(_grads(1.0), base=0, samples=64)
            assert late.stop and not late.applied
            assert snapshot(server) == before != before_b  # the late push changed nothing
            assert a.stats()["samples"] == 10
            with PSClient(server.endpoint) as newcomer, pytest.raises(ServerError) as info:
                newcomer.hello()
            assert info.value.code == "stopping"


def test_a_worker_whose_pull_was_held_is_not_silent_for_the_time_it_waited():
    """Silence counts from the server's reply: a pull held while the cluster assembles
    (longer than the heartbeat timeout) leaves the worker a whole timeout after it."""
    timeout = 2.0
    with running_server(world_size=2, heartbeat_timeout=timeout) as server:
        with PSClient(server.endpoint, timeout=10, worker_id="early") as early:
            early.hello()
            pulled = threading.Thread(target=early.pull)
            pulled.start()
            time.sleep(0.9 * timeout)  # the early worker's pull is held all this while
            with PSClient(server.endpoint, timeout=10, worker_id="late") as late:
                # The server answers the held pull after this instant (on the late hello).
                before_reply = time.monotonic()
                late.hello()  # the cluster is whole: the held pull is answered now
                pulled.join(timeout=10)
                time.sleep(0.6 * timeout)  # 1.5 timeouts after its request, 0.6 after the reply
                late.ping()
                alive = server.registry.by_id["early"].alive
                # Alive while less than a timeout passed since the reply; a loaded machine
                # may have slept this thread past that, and then it is rightly dead.
                assert alive or time.monotonic() - before_reply > timeout
                deadline = before_reply + 10 * timeout  # only catches a hang
                while server.registry.by_id["early"].alive:  # silent since the reply: dead
                    assert time.monotonic() < deadline, "never declared dead"
                    late.ping()
                    time.sleep(0.05)
                assert time.monotonic() - before_reply > timeout  # not counted from its pull
