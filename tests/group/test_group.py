"""A server group on real sockets (docs/protocol.md 16): discovery at hello, what each shard
holds and answers, the same arithmetic as one server, and everything a client does with
a group through the unchanged PSClient calls (minips.group.fanout; the first hello and an
operator's requests to every shard: minips.group.root)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from group_support import running_group

from minips.group.fanout import GroupVersion
from minips.group.partition import partition_of_model
from minips.group.root import GROUPS
from minips.nn import build_model
from minips.transmission.codecs import Factors
from minips.worker.client import PSClient, ServerError
from minips.worker.worker import Worker

MLP = build_model("mlp").params  # the seeded model every test group serves


def _grads(value: float = 1e-3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        name: (rng.standard_normal(a.shape) * value).astype(np.float32) for name, a in MLP.items()
    }


def test_hello_finds_the_group_and_each_shard_holds_its_slices():
    with running_group(3, workers=1) as group:
        with PSClient(group.root.endpoint, groups=GROUPS) as ps:
            hello = ps.hello()
            assert hello["rank"] == 0 and hello["world_size"] == 1
            assert ps.group is not None and ps.group.servers == 3
            part = partition_of_model(MLP, 3)
            for shard, server in enumerate(group.servers):
                assert {n: a.shape for n, a in server.store.params.items()} == part.shard_shapes(
                    shard
                )
                assert server.registry.by_id[ps.worker_id].rank == 0
            reply = ps.pull()
            assert isinstance(reply.version, GroupVersion) and reply.version == (0, 0, 0)
            for name, array in MLP.items():  # the whole seeded model, put back together
                np.testing.assert_array_equal(reply.params[name], array)


def test_a_client_given_a_shards_address_is_sent_on_to_the_root():
    with running_group(2, workers=1) as group:
        with PSClient(group.servers[1].endpoint, groups=GROUPS) as ps:
            assert ps.hello()["rank"] == 0
            assert ps.address == group.root.endpoint


def test_a_push_is_one_push_per_shard_and_the_same_update_as_one_server():
    grads = _grads()
    with running_group(1, workers=1) as one, running_group(2, workers=1) as two:
        results = []
        for group in (one, two):
            with PSClient(group.root.endpoint, groups=GROUPS) as ps:
                ps.hello()
                version = ps.pull().version
                for _ in range(3):
                    version = ps.push(grads, base=version, pull_since=version).pull.version
                results.append(ps.pull(since=None).params)
        for name in MLP:
            np.testing.assert_array_equal(results[0][name], results[1][name])
        assert [s.store.version for s in two.servers] == [3, 3]
        assert two.servers[1].ops.telemetry.counters.updates == 3


def test_a_pull_since_sends_only_what_changed_and_fills_in_the_rest():
    """A split parameter whose slices did not all change comes back whole: the rows of the
    shards that sent nothing are those of the whole array the client last handed out."""
    with running_group(2, workers=1) as group, PSClient(group.root.endpoint, groups=GROUPS) as ps:
        ps.hello()
        first = ps.pull()
        assert ps.pull(since=first.version).params == {}  # nothing changed anywhere
        pushed = ps.push({"fc2.w": np.full(MLP["fc2.w"].shape, 1.0, np.float32)}, base=0)
        assert pushed.version == (1, 1)  # fc2.w is split: both shards changed
        reply = ps.pull(since=GroupVersion((0, 1)))  # as if shard 1's change were known
        assert set(reply.params) == {"fc2.w"} and reply.version == (1, 1)
        rows = partition_of_model(MLP, 2).slices("fc2.w")[1].start
        assert not np.array_equal(reply.params["fc2.w"][:rows], MLP["fc2.w"][:rows])
        np.testing.assert_array_equal(reply.params["fc2.w"][rows:], MLP["fc2.w"][rows:])


def test_a_rank_the_root_gave_is_the_workers_rank_on_every_shard():
    """The root's rank goes with the hello to the other shards (docs/protocol.md 16.4): a
    worker asking the root for rank 1 holds rank 1 everywhere, though a shard left to
    choose would give it the lowest free one, 0."""
    with running_group(2, workers=2) as group, PSClient(group.root.endpoint, groups=GROUPS) as ps:
        assert ps.hello({"rank": 1})["rank"] == 1
        assert [s.registry.by_id[ps.worker_id].rank for s in group.servers] == [1, 1]


def test_hello_waits_for_a_group_still_assembling_and_names_who_is_missing():
    with running_group(2, workers=1, started=1) as group:  # only the root started
        with PSClient(group.root.endpoint, groups=GROUPS, assemble_timeout=1.0) as ps:
            with pytest.raises(ServerError, match=r"shard\(s\) 1 of 2 have not joined") as err:
                ps.hello()
            assert err.value.code == "group"
        done = {}

        def late_hello() -> None:
            with PSClient(group.root.endpoint, groups=GROUPS, assemble_timeout=20) as late:
                done["rank"] = late.hello()["rank"]

        waiting = threading.Thread(target=late_hello)
        waiting.start()
        group.start(1)  # the missing shard joins: the waiting hello goes through
        waiting.join(timeout=30)
        assert done == {"rank": 0}


def test_join_is_answered_only_by_a_groups_root():
    with running_group(2, workers=1) as group:
        header = {"op": "join", "shard": 1, "servers": 3, "address": "tcp://x:1"}
        for server, code in ((group.root, "bad_field"), (group.servers[1], "unknown_op")):
            with PSClient(server.endpoint, groups=GROUPS) as ps, pytest.raises(ServerError) as err:
                ps._request(header)
            assert err.value.code == code
    with running_group(1, workers=1) as plain, PSClient(plain.root.endpoint, groups=GROUPS) as ps:
        with pytest.raises(ServerError) as err:
            ps._request({"op": "join", "servers": 2})
        assert err.value.code == "unknown_op"


def test_plain_replies_have_no_group_key():
    with running_group(1, workers=1) as plain, PSClient(plain.root.endpoint, groups=GROUPS) as ps:
        ps.hello()
        assert ps.group is None and "group" not in ps.stats() and "shards" not in ps.stats()


def test_operators_see_every_shard_and_stop_them_all():
    with running_group(3, workers=1) as group:
        with PSClient(group.root.endpoint, groups=GROUPS, timeout=30) as operator:
            stats = operator.stats()
            assert [s["group"]["shard"] for s in stats["shards"]] == [0, 1, 2]
            addresses = stats["group"]["addresses"]
            assert addresses == [server.endpoint for server in group.servers]
            operator.stop()
        for thread in group.threads:
            thread.join(timeout=15)
            assert not thread.is_alive()


def test_an_observer_registers_with_every_shard_and_reads_the_whole_model():
    with (
        running_group(2, workers=1) as group,
        PSClient(group.root.endpoint, groups=GROUPS) as observer,
    ):
        hello = observer.hello({"role": "observer"})
        assert hello["rank"] == hello["world_size"] == 1
        assert all(s.registry.by_id[observer.worker_id].observer for s in group.servers)
        assert set(observer.pull().params) == set(MLP)
        with pytest.raises(ServerError) as err:
            observer.push(_grads(), base=0)
        assert err.value.code == "observer"


@pytest.mark.parametrize(
    ("codec", "exact"),
    [
        ("fp16", True),
        ({"codec": "topk", "ratio": 0.1}, False),
        ({"codec": "lowrank", "rank": 2}, False),
    ],
)
def test_codecs_travel_per_slice(codec, exact):
    grads = _grads()
    with running_group(1, workers=1) as one, running_group(3, workers=1) as three:
        got = []
        for group in (one, three):
            with PSClient(group.root.endpoint, groups=GROUPS) as ps:
                ps.hello()
                version = ps.pull().version
                reply = ps.push(grads, base=version, codecs={"fc1.w": codec}, pull_since=version)
                got.append(reply.pull.params["fc1.w"])
        if exact:
            np.testing.assert_array_equal(got[0], got[1])
        assert np.isfinite(got[1]).all() and not np.array_equal(got[1], MLP["fc1.w"])


def test_sufficient_factors_per_slice_are_the_rows_of_the_whole_product():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 784)).astype(np.float32)
    dy = rng.standard_normal((8, 256)).astype(np.float32) * 1e-3
    with running_group(1, workers=1) as one, running_group(2, workers=1) as two:
        got = []
        for group in (one, two):
            with PSClient(group.root.endpoint, groups=GROUPS) as ps:
                ps.hello()
                ps.pull()
                reply = ps.push({"fc1.w": Factors(x, dy)}, base=0, codecs={"fc1.w": "sf"},
                                pull_since=0)  # fmt: skip
                got.append(reply.pull.params["fc1.w"])
        np.testing.assert_allclose(got[0], got[1], rtol=1e-6, atol=1e-9)


def test_a_step_sent_layer_by_layer_is_closed_on_every_shard():
    """fc3 (shard 0 only) goes first with last false, fc1 (both shards) last: shard 0
    assembles its step, shard 1 gets fc1 alone; both advance once."""
    grads = _grads()
    with running_group(2, workers=1) as group, PSClient(group.root.endpoint, groups=GROUPS) as ps:
        ps.hello()
        ps.pull()
        early = {n: g for n, g in grads.items() if n.startswith("fc2")}  # on both shards
        ps.push(early, base=0, last=False)
        assert [s.registry.by_id[ps.worker_id].partial_step is not None for s in group.servers] == [
            True,
            True,
        ]
        late = {"fc1.b": grads["fc1.b"]}  # on one shard only: the other gets an empty push
        reply = ps.push(late, base=0, last=True, pull_since=0)
        assert reply.version == (1, 1)
        assert all(s.registry.by_id[ps.worker_id].partial_step is None for s in group.servers)


def test_vsgd_samples_are_split_by_coordinates_and_checked_per_shard():
    with (
        running_group(2, workers=1, rule="vsgd") as group,
        PSClient(group.root.endpoint, groups=GROUPS) as ps,
    ):
        hello = ps.hello()
        model = build_model("mlp")
        from minips.rules import worker_side

        side = worker_side(hello["config"]["rule"])
        params = ps.pull().params
        model.set_params(params)
        extra = side.extras(model.params, _grads())
        assert ps.push(_grads(), base=0, extra=extra).applied
        extra.pop("sample/fc2.b")  # only shard 1 holds fc2.b
        with pytest.raises(ServerError, match="extra/sample/fc2.b.*shard 1 of 2") as err:
            ps.push(_grads(), base=1, extra=extra)
        assert err.value.code == "rule"


def test_workers_train_a_group_through_the_unchanged_worker_loop():
    with running_group(2, workers=2, rule="ssgd", epochs=1) as group:
        reports = {}

        def train(index: int) -> None:
            with PSClient(group.root.endpoint, groups=GROUPS, timeout=4) as ps:
                reports[index] = Worker(ps, max_steps=6).run()

        threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(r.rank for r in reports.values()) == [0, 1]
        assert all(r.steps == 6 for r in reports.values())
        assert [s.store.version for s in group.servers] == [6, 6]  # one barrier per round


def test_a_restarted_shard_is_rejoined_by_its_workers():
    """Shard 1 goes away and comes back on its address at version 0: the worker says hello
    to it again (same rank); shard 0 applies its part of the push based on a future, shard
    1 answers it `bad_base`, and the push is not sent again (shard 0 would apply it
    twice): shard 1 is pulled whole in its place, and the next push is based on it."""
    with (
        running_group(2, workers=1) as group,
        PSClient(group.root.endpoint, groups=GROUPS, timeout=4) as ps,
    ):
        ps.hello()
        version = ps.pull().version
        for _ in range(2):
            version = ps.push(_grads(), base=version, pull_since=version).pull.version
        address = group.kill(1)
        group.start(1, bind=address)
        pushed = ps.push(_grads(), base=version, pull_since=version)  # based at 2, past 0
        assert pushed.applied and pushed.pull.version == (3, 0)  # shard 0's part only
        assert group.servers[1].registry.by_id[ps.worker_id].rank == 0
        assert group.servers[0].store.version == 3 and group.servers[1].store.version == 0
        assert ps.push(_grads(), base=pushed.pull.version).version == (4, 1)


def test_bad_input_to_a_shard_is_refused_and_changes_nothing():
    with running_group(2, workers=1) as group, PSClient(group.root.endpoint, groups=GROUPS) as ps:
        ps.hello()
        before = {n: a.copy() for n, a in group.servers[1].store.params.items()}
        bad = _grads()
        bad["fc1.w"] = bad["fc1.w"].copy()
        bad["fc1.w"][-1, 0] = np.nan  # in shard 1's rows
        with pytest.raises(ServerError, match="shard 1 of 2") as err:
            ps.push(bad, base=0)
        assert err.value.code == "nonfinite"
        for name, array in group.servers[1].store.params.items():
            np.testing.assert_array_equal(array, before[name])
