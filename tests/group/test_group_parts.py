"""The pieces of a server group on their own: addresses, VSGD samples per slice, the root's
table of joins, and the client's fan-out over real sockets (one shard silent at first)."""

import contextlib
import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import zmq
from test_server_support import (
    InterruptedAfterFirstFrame,
    InterruptedAfterFirstReplyFrame,
    running_server,
)

from minips.group.agreements import JOIN_RESERVE, JOIN_TAKEOVER, reach
from minips.group.connections import Connection, exchange
from minips.group.fanout import GroupClient, GroupVersion
from minips.group.partition import SliceSampler, partition, sample_rows
from minips.group.shard import RootTable
from minips.guard import wire_checks
from minips.ops.server_ops import ServerOps
from minips.protocol import wire
from minips.protocol.sampling import sample_indices
from minips.protocol.wire import Limits, ProtocolError
from minips.provision import keyfiles
from minips.worker.replies import ServerError
from minips.worker.session import NO_PULL


@pytest.mark.parametrize(
    ("advertised", "root", "reached"),
    [
        ("tcp://0.0.0.0:40123", "tcp://pc7:5555", "tcp://pc7:40123"),
        ("tcp://*:40123", "tcp://10.0.0.2:5555", "tcp://10.0.0.2:40123"),
        ("tcp://[::]:7", "tcp://[fd00::1]:5555", "tcp://[fd00::1]:7"),
        ("tcp://pc8:5556", "tcp://pc7:5555", "tcp://pc8:5556"),
        ("ipc:///tmp/shard1.sock", "tcp://pc7:5555", "ipc:///tmp/shard1.sock"),
    ],
)
def test_a_wildcard_host_is_reached_where_the_root_was(advertised, root, reached):
    assert reach(advertised, root) == reached


def test_vsgd_samples_split_by_the_coordinates_of_each_slice():
    part = partition({"fc1.w": (800, 500)}, 3)
    indices = sample_indices("fc1.w", 400_000, 0.01, 32)
    values = np.arange(indices.size, dtype=np.float32)
    got = []
    for piece in part.slices("fc1.w"):
        rows = sample_rows(indices, piece)
        local = indices[rows] - piece.offset
        assert local.min() >= 0 and local.max() < piece.size
        got.append(values[rows])
    np.testing.assert_array_equal(np.concatenate(got), values)  # each value exactly once


def test_a_slices_sample_keeps_its_first_and_last_entry():
    """16.6: S_P restricted to rows [start, stop) includes both ends of the slice."""
    part = partition({"fc1.w": (129, 128)}, 2)  # 66,048 bytes: split at row 64
    whole = np.arange(129 * 128, dtype=np.int64)  # rho 1: every entry sampled
    for piece in part.slices("fc1.w"):
        local = whole[sample_rows(whole, piece)] - piece.offset
        np.testing.assert_array_equal(local, np.arange(piece.size))
    sampler = SliceSampler(1.0, 32, {"fc1.w": part.slices("fc1.w")[1]})
    np.testing.assert_array_equal(sampler.indices("fc1.w", 65 * 128), np.arange(65 * 128))
    asked = part.shard_slices(1).sampler(1.0, 32)  # what VSGD asks a shard's store for
    np.testing.assert_array_equal(asked.indices("fc1.w", 65 * 128), np.arange(65 * 128))


def test_the_root_table_counts_a_shard_only_once_it_gave_an_address():
    table = RootTable(3, "tcp://root:5555")
    assert table.missing() == [1, 2]
    assert table.join({"servers": 3, "shard": 2, "address": None}, b"a", 0.0) == 2
    assert table.missing() == [1, 2]  # asked what to be: not joined yet
    table.join({"servers": 3, "shard": 2, "address": "tcp://b:1"}, b"a", 0.5)
    with pytest.raises(ProtocolError, match=r"shard\(s\) 1 of 3 have not joined") as err:
        table.check_complete()
    assert err.value.code == "group"
    assert table.join({"servers": 3, "shard": None, "address": "tcp://c:1"}, b"c", 0.6) == 1
    table.check_complete()
    assert table.addresses() == ["tcp://root:5555", "tcp://c:1", "tcp://b:1"]


def test_the_root_table_refuses_what_does_not_fit():
    table = RootTable(3, "tcp://root:5555")
    table.join({"servers": 3, "shard": 1, "address": "tcp://a:1"}, b"a", 0.0)
    for header, code in [
        ({"servers": 2, "shard": 1, "address": "tcp://x:1"}, "bad_field"),
        ({"servers": 3, "shard": 0, "address": "tcp://x:1"}, "bad_field"),
        ({"servers": 3, "shard": 3, "address": "tcp://x:1"}, "bad_field"),
        ({"servers": 3, "shard": True, "address": "tcp://x:1"}, "bad_field"),
        ({"servers": 3, "shard": 1, "address": 7}, "bad_field"),
        ({"servers": 3, "shard": 1, "address": "tcp://x:1"}, "full"),  # held, live
        ({"servers": 3, "shard": 1, "address": "tcp://a:1"}, "full"),  # its address too
        ({"servers": 3, "shard": 1, "address": None}, "full"),  # or asking for it
    ]:
        with pytest.raises(ProtocolError) as err:
            table.join(header, b"x", 1.0)
        assert err.value.code == code, header
    # a new client (a restarted shard) takes the index once its holder is silent
    later = 0.0 + JOIN_TAKEOVER + 0.1
    assert table.join({"servers": 3, "shard": 1, "address": "tcp://y:1"}, b"y", later) == 1
    table.join({"servers": 3, "shard": None, "address": "tcp://z:1"}, b"z", later)
    with pytest.raises(ProtocolError, match="all 3 shards"):
        table.join({"servers": 3, "shard": None, "address": "tcp://w:1"}, b"w", later)


def test_asking_what_to_be_changes_no_address():
    # A restarted shard (a new client) asks before it builds; its old self's address stays
    # the group's until it announces its own: the group stays complete meanwhile.
    table = RootTable(2, "tcp://root:5555")
    table.join({"servers": 2, "shard": 1, "address": "tcp://a:1"}, b"old", 0.0)
    later = JOIN_TAKEOVER + 0.1  # the old self is silent
    assert table.join({"servers": 2, "shard": None, "address": None}, b"new", later) == 1
    assert table.addresses() == ["tcp://root:5555", "tcp://a:1"] and table.missing() == []
    table.join({"servers": 2, "shard": 1, "address": "tcp://b:1"}, b"new", later + 1.0)
    assert table.addresses()[1] == "tcp://b:1"


def test_an_address_less_join_holds_its_index_for_join_reserve_seconds():
    table = RootTable(3, "tcp://root:5555")
    assert table.join({"servers": 3, "shard": None, "address": None}, b"s", 0.0) == 1
    assert table.join({"servers": 3, "shard": None, "address": None}, b"s", 1.0) == 1  # its own
    assert table.join({"servers": 3, "shard": None, "address": None}, b"t", 1.0) == 2
    with pytest.raises(ProtocolError, match="all 3 shards"):
        table.join({"servers": 3, "shard": None, "address": None}, b"u", 1.0)
    with pytest.raises(ProtocolError) as err:  # an explicit index waits for it too
        table.join({"servers": 3, "shard": 1, "address": "tcp://a:1"}, b"a", 1.0)
    assert err.value.code == "full"
    assert table.missing() == [1, 2]  # a reservation is no address
    held = 1.0 + JOIN_TAKEOVER + 0.5  # past an announced shard's hold, within the reserve
    with pytest.raises(ProtocolError) as err:
        table.join({"servers": 3, "shard": 1, "address": "tcp://a:1"}, b"a", held)
    assert err.value.code == "full"
    lapsed = 1.0 + JOIN_RESERVE + 0.1
    assert table.join({"servers": 3, "shard": None, "address": None}, b"u", lapsed) == 1
    assert table.join({"servers": 3, "shard": 2, "address": "tcp://b:1"}, b"b", lapsed) == 2


def _echo_shard(router: zmq.Socket, stop: threading.Event, ignore_first: bool) -> None:
    """Answer each request with its rid and op; with ignore_first, drop the first one."""
    dropped = not ignore_first
    while not stop.is_set():
        if not router.poll(50):
            continue
        routing, *frames = router.recv_multipart()
        request = wire_checks.decode_request(frames)
        if not dropped:
            dropped = True
            continue
        header = {"op": "ping", "version": 7, "stop": False, "rid": request.header["rid"]}
        router.send_multipart([routing, *wire.encode_parts(header, [])])


def test_exchange_waits_for_all_and_retries_only_the_silent_shard():
    context = zmq.Context()
    routers, threads, stop = [], [], threading.Event()
    for ignore_first in (False, True):
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # as a server: a reconnection takes the id
        router.bind("tcp://127.0.0.1:*")
        routers.append(router)
        thread = threading.Thread(target=_echo_shard, args=(router, stop, ignore_first))
        thread.start()
        threads.append(thread)
    try:
        connections = [
            Connection(
                context, r.getsockopt_string(zmq.LAST_ENDPOINT), b"\x01me", wire.DEFAULT_LIMITS
            )
            for r in routers
        ]
        requests = {0: ({"op": "ping", "worker": "w"}, []), 1: ({"op": "ping", "worker": "w"}, [])}
        # 3 s: the answering shard's reply comes within it on a loaded machine too (else it
        # would be asked again), the silent one costs the test that once
        replies = exchange(connections, requests, timeout=3.0, retries=1)
        assert sorted(replies) == [0, 1]
        assert [connections[j].rid for j in (0, 1)] == [1, 2]  # shard 1 was asked twice
        assert all(m.header["version"] == 7 for m in replies.values())
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for connection in connections:
            connection.abandon()
        for router in routers:
            router.close(0)
        context.term()


def test_a_shard_that_never_answers_is_named():
    from minips.worker.client import ServerUnavailable

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:*")
    connection = Connection(context, router.getsockopt_string(zmq.LAST_ENDPOINT), b"\x01me",
                            wire.DEFAULT_LIMITS)  # fmt: skip
    try:
        with pytest.raises(ServerUnavailable, match="no reply from shard 3 of the server group"):
            exchange({3: connection}, {3: ({"op": "ping", "worker": "w"}, [])}, 0.2, 1)
    finally:
        connection.abandon()
        router.close(0)
        context.term()


def test_a_late_reply_to_an_earlier_request_is_dropped_not_taken_as_the_answer():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:*")
    connection = Connection(context, router.getsockopt_string(zmq.LAST_ENDPOINT), b"\x01me",
                            wire.DEFAULT_LIMITS)  # fmt: skip
    try:
        asked = []
        for _ in range(2):  # the first request's reply is late: the second is the current one
            connection.send({"op": "ping", "worker": "w"}, [])
            assert router.poll(5000)
            routing, *frames = router.recv_multipart()
            asked.append(wire_checks.decode_request(frames).header["rid"])
        assert asked == [1, 2] and connection.rid == 2

        def answer(rid, version):
            header = {"op": "ping", "version": version, "stop": False, "rid": rid}
            router.send_multipart([routing, *wire.encode_parts(header, [])])
            assert connection.socket.poll(5000)

        answer(1, 5)
        message, nbytes = connection.take()
        assert message is None and nbytes > 0  # read, counted, dropped
        answer(2, 6)
        message, _ = connection.take()
        assert message.header["rid"] == 2 and message.header["version"] == 6
    finally:
        connection.abandon()
        router.close(0)
        context.term()


def test_a_group_version_reads_as_the_roots():
    version = GroupVersion((12, 11, 12))
    assert int(version) == 12 and version == (12, 11, 12) and list(version) == [12, 11, 12]


SPLIT = {"w": (200, 100), "b": (100,)}  # w: rows 0-99 on shard 0, 100-199 on shard 1


def _group_of_two() -> GroupClient:
    """A GroupClient over SPLIT (no socket is opened until a request is sent)."""
    client = SimpleNamespace(address="tcp://127.0.0.1:1", _context=None, routing_id=b"\x01me",
                             limits=wire.DEFAULT_LIMITS, keys=None, worker_id="w",
                             next_seq=iter(range(1, 100)).__next__)  # fmt: skip
    group = GroupClient(client, {"servers": 2, "addresses": ["", ""]})
    group.partition = partition(SPLIT, 2)
    return group


def _pulled(version: int, param_versions: dict, **fields) -> wire.Message:
    header = {"op": "pull", "version": version, "param_versions": param_versions, "stop": False}
    return wire.Message(header, **fields)


@pytest.mark.parametrize("arrival", [(0, 1), (1, 0)])
def test_a_split_parameters_version_is_its_newest_shards_whatever_answers_last(arrival):
    group = _group_of_two()
    w = np.zeros(SPLIT["w"], np.float32)
    replies = {
        0: _pulled(7, {"w": 7, "b": 2}, arrays={"w": w[:100], "b": np.zeros(100, np.float32)}),
        1: _pulled(4, {"w": 3}, arrays={"w": w[100:]}),
    }
    reply = group._merge_pulls({j: replies[j] for j in arrival})
    assert reply.param_versions == {"w": 7, "b": 2}
    assert reply.version == (7, 4)
    replies[1] = _pulled(9, {"w": 9}, arrays={"w": w[100:]})
    assert group._merge_pulls({j: replies[j] for j in arrival}).param_versions["w"] == 9


def test_a_delta_pulled_from_a_later_shard_lands_on_that_shards_rows():
    """docs/protocol.md 13.7: a shard's delta indices count in its slice; merged, they
    count in the whole parameter (shard 1's slice of w begins at 100 rows x 100)."""
    group = _group_of_two()
    whole = np.zeros(SPLIT["w"], np.float32)
    group._merge_pulls({0: _pulled(1, {"w": 1}, arrays={"w": whole[:100]}),
                        1: _pulled(1, {"w": 1}, arrays={"w": whole[100:]})})  # fmt: skip

    def delta(indices, values):
        return {"parts": {"w": {"indices": np.array(indices, np.uint32),
                                "values": np.array(values, np.float32)}},
                "codecs": {"w": "delta"}}  # fmt: skip

    first, second = delta([5], [1.0]), delta([0, 9_999], [2.0, 3.0])
    reply = group._merge_pulls(
        {0: _pulled(2, {"w": 2}, **first), 1: _pulled(2, {"w": 2}, **second)}
    )
    np.testing.assert_array_equal(reply.deltas["w"]["indices"], [5, 10_000, 19_999])
    np.testing.assert_array_equal(reply.deltas["w"]["values"], [1.0, 2.0, 3.0])
    expected = whole.copy().reshape(-1)
    expected[[5, 10_000, 19_999]] = [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(group.latest["w"].reshape(-1), expected)


def _answering(group: GroupClient, staleness: dict[int, int]) -> list[dict]:
    """Answer the group's requests as shards would (each shard's staleness); the headers."""
    sent = []

    def exchange(requests, behind_ok=False):
        sent.extend(header for header, _ in requests.values())
        return {j: wire.Message({"op": "push", "version": 1, "applied": True,
                                 "staleness": staleness[j], "stop": False})
                for j in requests}  # fmt: skip

    group._worker_exchange = exchange
    return sent


def test_a_group_push_reports_its_stalest_shards_staleness():
    group = _group_of_two()
    _answering(group, {0: 0, 1: 3})
    grads = {"w": np.ones(SPLIT["w"], np.float32)}
    push = group.push(grads, 0, None, True, None, None, NO_PULL)
    assert push.staleness == 3 and push.applied
    _answering(group, {0: 2, 1: 0})
    assert group.push(grads, 0, None, True, None, None, NO_PULL).staleness == 2


def test_a_push_no_shard_applied_with_a_shard_behind_sends_the_worker_back_to_pull():
    """docs/protocol.md 16.9: shard 1 restarted from an older checkpoint answers `bad_base`;
    shard 0 held the push (a step's first layer, not applied yet). Pulling shard 1 in its
    place would lose that slice of the gradient: the worker is told, pulls and computes
    again."""
    group = _group_of_two()

    def exchange(requests, behind_ok=False):
        replies = {}
        for j, (header, _) in requests.items():
            if header["op"] == "pull":
                replies[j] = _pulled(3, {"w": 3})
            elif j == 0:
                replies[j] = wire.Message({"op": "push", "version": 5, "applied": False,
                                           "staleness": 0, "stop": False})  # fmt: skip
            else:
                replies[j] = wire.Message({"op": "error", "code": "bad_base",
                                           "reason": "base 5 is past version 3"})  # fmt: skip
        return replies

    group._worker_exchange = exchange
    grads = {"w": np.ones(SPLIT["w"], np.float32)}
    with pytest.raises(ServerError) as err:
        group.push(grads, 5, None, False, None, None, NO_PULL)
    assert err.value.code == "bad_base"


def test_a_restarted_root_that_never_completes_its_group_is_given_up_on():
    """A shard forgot the worker and its root answers `group` (its shards not joined
    again): hello is asked again for the client's assemble_timeout, then the error."""
    group = _group_of_two()
    group.client.assemble_timeout = 1.0
    group._exchange = lambda requests: {
        j: wire.Message({"op": "error", "code": "group", "reason": "shard(s) 1 missing"})
        for j in requests
    }
    outcome: dict = {}

    def hello_again() -> None:
        try:
            group._hello_again([0])
        except ServerError as exc:
            outcome["code"] = exc.code

    thread = threading.Thread(target=hello_again, daemon=True)
    thread.start()
    thread.join(15)
    assert not thread.is_alive(), "the worker asks a root that never completes forever"
    assert outcome == {"code": "group"}


def test_a_step_pushed_layer_by_layer_reports_its_samples_once_with_the_last_push():
    group = _group_of_two()
    sent = _answering(group, {0: 0, 1: 0})
    group.push({"w": np.ones(SPLIT["w"], np.float32)}, 0, None, False, None, 8, NO_PULL)
    assert [h["last"] for h in sent] == [False, False]
    assert all("samples" not in h for h in sent)  # the step's samples are not counted yet
    sent.clear()
    group.push({"b": np.ones(100, np.float32)}, 0, None, True, None, 8, NO_PULL)
    assert [(h["last"], h["samples"]) for h in sent] == [(True, 8), (True, 8)]  # closes both


def _shard_file(tmp_path, shard: int, version: int, keep_previous: bool) -> None:
    """Shard `shard` of a 2-group of the mlp at `version`, saved by its Checkpointer."""
    from minips.group.partition import partition_of_model
    from minips.group.shard import shard_params
    from minips.nn import build_model
    from minips.ops.checkpoints import Checkpointer
    from minips.ops.telemetry import Counters
    from minips.state.store import SGD, ParameterStore

    model = build_model("mlp")
    params = shard_params(model.params, partition_of_model(model.params, 2), shard)
    params = {n: a + np.float32(version) for n, a in params.items()}
    store = ParameterStore(params, SGD(params, lr=0.1))
    store.version = version
    checkpoints = Checkpointer(store, Counters(), tmp_path / "run.npz", rule="ssgd",
                               spec=model.spec, shard=(shard, 2))  # fmt: skip
    checkpoints.keep_previous = keep_previous
    checkpoints.save()


def test_an_ssgd_group_checkpoint_is_the_last_version_every_shard_saved(tmp_path):
    """Shard 0 saved rounds 50 and 100, shard 1 only 50 so far (it was one round behind):
    the group checkpoint is round 50, from both shards, and says it is consistent."""
    from minips.ops.checkpoints import assemble

    for version in (50, 100):
        _shard_file(tmp_path, 0, version, keep_previous=True)
    _shard_file(tmp_path, 1, 50, keep_previous=True)
    assemble(tmp_path / "run.npz")
    with np.load(tmp_path / "run.npz") as data:
        meta = json.loads(str(data["meta"]))
        assert int(data["version"]) == 50 and float(data["param/fc1.w"][0, 0]) > 49
    assert meta["group"] == {"servers": 2, "versions": [50, 50], "consistent": True}


def test_an_async_group_checkpoint_is_each_shards_latest_and_says_so(tmp_path):
    from minips.ops.checkpoints import assemble

    _shard_file(tmp_path, 0, 70, keep_previous=False)
    _shard_file(tmp_path, 1, 68, keep_previous=False)
    assemble(tmp_path / "run.npz")
    with np.load(tmp_path / "run.npz") as data:
        meta = json.loads(str(data["meta"]))
    assert meta["group"] == {"servers": 2, "versions": [70, 68], "consistent": False}


def test_a_shards_hello_may_count_another_world_size_but_not_give_another_rank():
    """Without a fixed world size each shard counts the workers it has seen so far, and
    workers saying hello at once reach the shards in different orders (protocol.md 16.4)."""
    from minips.group.agreements import check_shard_hello

    root = {"rank": 1, "world_size": 2, "group": {"shard": 0, "servers": 2}}
    reply = {"rank": 1, "world_size": 3, "group": {"shard": 1, "servers": 2}}
    assert check_shard_hello(reply, root, 1) is None
    assert "rank" in check_shard_hello({**reply, "rank": 0}, root, 1)
    assert "shard" in check_shard_hello(reply, root, 2)
    # a shard 1 of another group (3 servers: another partition) at the address given
    other = {**reply, "group": {"shard": 1, "servers": 3}}
    assert check_shard_hello(other, root, 1) == "answered as shard 1 of 3"


@contextlib.contextmanager
def _root_of_two(keys=None, stop_grace: float = 0.3):
    """The root (shard 0) of a group of 2 serving from a thread, shard 1 not started."""
    from minips.group.shard import ShardRole, shard_params
    from minips.rules import make_rule
    from minips.server.server import ParameterServer, ServerOptions
    from minips.state.store import SGD

    model = {"fc.w": np.zeros((3, 4), np.float32), "fc.b": np.zeros(4, np.float32)}
    part = partition({name: a.shape for name, a in model.items()}, 2)
    params = shard_params(model, part, 0)
    options = ServerOptions(keys=keys, stop_grace=stop_grace, poll_interval=0.02)
    root = ParameterServer(params, make_rule("asgd"), SGD(params, lr=0.1), options,
                           group=ShardRole(0, 2, part), operations=ServerOps)  # fmt: skip
    thread = threading.Thread(target=root.run, daemon=True)
    thread.start()
    try:
        yield root
    finally:
        root.request_stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the root did not stop"
        root.close()


def test_under_curve_only_an_operator_key_joins_a_groups_root(tmp_path):
    from minips.group.root import GROUPS
    from minips.provision import keyfiles
    from minips.worker.client import PSClient, ServerError

    keyfiles.make_keys(tmp_path / "k")
    join = {"op": "join", "shard": 1, "servers": 2, "address": "tcp://127.0.0.1:9"}
    with _root_of_two(keys=keyfiles.load_server_keys(tmp_path / "k")) as root:
        worker = keyfiles.load_client_keys(tmp_path / "k", keyfiles.WORKER)
        with PSClient(root.endpoint, groups=GROUPS, timeout=10, retries=0, keys=worker) as client:
            with pytest.raises(ServerError) as refused:
                client._request(join)
            assert refused.value.code == "operator"
        assert root.group.table.missing() == [1]  # the worker key's join changed nothing
        operator = keyfiles.load_client_keys(tmp_path / "k", keyfiles.OPERATOR)
        with PSClient(root.endpoint, groups=GROUPS, timeout=10, retries=0, keys=operator) as client:
            assert client._request(join).header["shard"] == 1
        assert root.group.table.addresses()[1] == "tcp://127.0.0.1:9"


def test_a_shard_learns_from_the_roots_join_reply_that_the_root_stops():
    from test_server_support import RawPeer, raw_hello

    from minips.group.shard import Joiner, ShardRole
    from minips.server.stop import Stop

    with _root_of_two(stop_grace=30.0) as root:
        joiner = Joiner(root.endpoint, None, 2)
        try:
            assert joiner.ask(timeout=30)["shard"] == 1 and not joiner.root_stopping
            now = time.monotonic()
            joiner.tick(now, "tcp://127.0.0.1:9")  # its address: the group is complete
            assert joiner.socket.poll(30_000)
            joiner.tick(now + 0.5, "tcp://127.0.0.1:9")  # reads the reply, sends nothing
            assert not joiner.root_stopping and root.group.table.missing() == []
            with RawPeer(root.endpoint) as peer:
                raw_hello(peer, "w")  # live: the stopping root waits for it
                assert peer.request({"op": "stop"}).op == "stop"
                reply = joiner.ask(timeout=30)
                assert peer.request({"op": "bye", "worker": "w"}).op == "bye"
            assert reply["stop"] is True and joiner.root_stopping
            # and the shard it serves stops as on `stop`, not root_timeout s later
            part = partition({"fc.w": (3, 4), "fc.b": (4,)}, 2)
            role = ShardRole(1, 2, part, joiner=joiner)
            role.stop, role.endpoint = Stop(), "tcp://127.0.0.1:9"
            role.tick(time.monotonic())
            assert role.stop.requested and role.stop.why == "the group's root is stopping"
        finally:
            joiner.close()


def test_a_shard_waiting_for_a_silent_root_says_so_once():
    from minips.errors import MinipsError
    from minips.group.shard import Joiner

    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)  # the root's socket, never read: no reply ever
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind("tcp://127.0.0.1:*")
    root = silent.getsockopt_string(zmq.LAST_ENDPOINT)
    joiner, lines = Joiner(root, None, 2), []
    try:
        with pytest.raises(MinipsError, match="no answer from the group's root"):
            joiner.ask(timeout=2.5, on_wait=lines.append)  # three 1 s waits for a reply
        assert lines == [f"waiting for the group's root at {root} (up to 2.5 s)"]
    finally:
        joiner.close()
        silent.close()
        context.term()


def test_a_connection_refused_at_the_handshake_never_blocks_in_send(tmp_path):
    """A CURVE shard drops a keyless connection at its handshake; the DEALER then has no
    pipe to send on: send gives up within SEND_TIMEOUT_MS (the request counts as lost and
    its reply's deadline retries it) instead of blocking the group's exchange for ever."""
    keyfiles.make_keys(tmp_path / "run", clients=("worker", "operator"))
    sent: list[int] = []

    def send_many(address: str) -> None:
        context = zmq.Context()
        connection = Connection(context, address, b"\x01" + bytes(15), Limits())
        for _ in range(10):  # the second send after the handshake was refused
            sent.append(connection.send({"op": "stats"}, []))
            time.sleep(0.3)
            sent.append(connection.send({"op": "stats"}, []))
            connection.abandon()
        context.term()

    keys = keyfiles.load_server_keys(tmp_path / "run")
    with running_server(bind="tcp://127.0.0.1:*", keys=keys) as server:
        sending = threading.Thread(target=send_many, args=(server.endpoint,), daemon=True)
        sending.start()
        sending.join(timeout=60)  # 10 x (at most 2 x 1 s to send + 0.3 s)
        assert not sending.is_alive(), f"send blocked after {len(sent)} of 20"
    assert len(sent) == 20


def test_a_request_after_one_interrupted_between_its_frames_reaches_the_shard():
    """Ctrl-C or SIGTERM between two of pyzmq's per-frame sends leaves half a message on
    the socket: the next request (the bye on the way out) goes on a new socket, whole."""
    with running_server(rule="asgd", heartbeat_timeout=60.0) as server:
        with _said_hello(server.endpoint) as connection:
            connection.socket = InterruptedAfterFirstFrame(connection.socket)
            parts = [wire.WirePart(name, np.zeros(a.shape, np.float32))
                     for name, a in server.store.params.items()]  # fmt: skip
            with pytest.raises(KeyboardInterrupt):
                connection.send({"op": "push", "worker": "w", "seq": 0, "base": 0}, parts)
            connection.send({"op": "bye", "worker": "w", "finished": False}, [])
            assert _reply_within(connection, 5).op == "bye"
        assert server.store.version == 0  # the half push applied nothing


def test_a_request_after_a_reply_interrupted_between_its_frames_gets_its_own_reply():
    """An interrupt that lost a reply's first frame (pyzmq checks for signals after each
    frame it took) leaves the rest unread: the socket is closed, so the next request (the
    bye) is answered on a new one, not met by the remains read as a reply."""
    with running_server(rule="asgd", heartbeat_timeout=60.0) as server:
        with _said_hello(server.endpoint) as connection:
            connection.send({"op": "pull", "worker": "w"}, [])  # a header and the arrays
            assert connection.socket.poll(5000)
            connection.socket = InterruptedAfterFirstReplyFrame(connection.socket)
            with pytest.raises(KeyboardInterrupt):
                connection.take()
            connection.send({"op": "bye", "worker": "w", "finished": False}, [])
            assert _reply_within(connection, 5).op == "bye"


def test_a_request_after_an_interrupt_while_the_socket_was_set_up_is_sent_connected():
    """An interrupt while a connection's new socket is set up (before its connect) leaves
    no half-made socket behind: the next request (the bye) goes on a whole one."""
    with running_server(rule="asgd", heartbeat_timeout=60.0) as server:
        with _said_hello(server.endpoint) as connection:
            connection.abandon()  # the next request makes a new socket
            real_socket = connection.context.socket

            def interrupted_before_connect(kind):
                socket = real_socket(kind)
                socket.connect = _raise_keyboard_interrupt
                return socket

            connection.context.socket = interrupted_before_connect
            with pytest.raises(KeyboardInterrupt):
                connection.send({"op": "ping", "worker": "w"}, [])
            assert connection.socket is None
            connection.context.socket = real_socket
            connection.send({"op": "bye", "worker": "w", "finished": False}, [])
            assert _reply_within(connection, 5).op == "bye"


def _raise_keyboard_interrupt(*args):
    raise KeyboardInterrupt


@contextlib.contextmanager
def _said_hello(endpoint: str):
    """A shard connection to `endpoint` whose worker "w" said hello; closed at exit."""
    context = zmq.Context()
    connection = Connection(context, endpoint, b"\x01" + bytes(15), Limits())
    try:
        connection.send({"op": "hello", "worker": "w"}, [])
        assert _reply_within(connection, 5).op == "hello"
        yield connection
    finally:
        connection.abandon()
        context.term()


def _reply_within(connection: Connection, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reply, _ = connection.take()
        if reply is not None:
            return reply
        connection.socket.poll(100)
    raise AssertionError(f"no reply within {seconds} s")
