"""Who may join a server group's root (minips/group/shard.py, docs/protocol.md 16.3): an
index a live shard holds is refused to every other client whatever address it names, an
address-less join holds an index only for a while, and under CURVE only an operator key
joins, stops or checkpoints a shard. Real sockets: the group's shards serve from threads
of this process."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from group_support import running_group

from minips.group.root import GROUPS
from minips.provision.keyfiles import OPERATOR, load_client_keys, make_keys
from minips.run.build import join_root, make_server
from minips.worker.client import PSClient, ServerError


def _join(endpoint: str, shard: int | None, address: str | None, servers: int = 2, **kw):
    """One `join` from a new client (a stranger: its own routing id); the reply's header."""
    header = {"op": "join", "shard": shard, "servers": servers, "address": address}
    with PSClient(endpoint, groups=GROUPS, timeout=2.0, retries=0, **kw) as stranger:
        return stranger._request(header).header


def test_a_stranger_cannot_take_a_live_shards_index_whatever_address_it_names():
    with running_group(2, workers=1) as group:
        real = group.servers[1].endpoint
        for address in (real, "tcp://127.0.0.1:1", None):
            with pytest.raises(ServerError) as err:
                _join(group.root.endpoint, 1, address)
            assert err.value.code == "full", address
        with pytest.raises(ServerError) as err:  # nor is it given one by asking for any
            _join(group.root.endpoint, None, None)
        assert err.value.code == "full"
        time.sleep(2.5)  # the real shard's joins go on being answered
        assert group.root.group.table.addresses()[1] == real
        assert not group.servers[1].stop.requested and group.threads[1].is_alive()
        with PSClient(group.root.endpoint, groups=GROUPS) as client:
            client.hello()  # the clients are sent to the real shard
            assert client.group.addresses == [group.root.endpoint, real]


def _start_unindexed_shard(group, box: dict) -> None:
    """A shard without an index (DMLC's server processes): the root gives it one."""
    own = replace(group.config, shard=-1, root=group.root.endpoint, checkpoint=None)
    try:
        config, joiner = join_root(own)
        box["server"] = server = make_server(config, joiner=joiner)
        server.options = replace(server.options, stop_grace=0.3)
        server.run()
    except Exception as exc:  # the test reads it
        box["error"] = exc


def test_an_address_less_join_holds_an_index_only_for_a_while():
    with running_group(2, started=1, workers=1) as group:
        table = group.root.group.table
        table.reserve = 1.5  # JOIN_RESERVE's 10 s, shortened for the test
        assert _join(group.root.endpoint, None, None)["shard"] == 1  # a stranger's ask
        with pytest.raises(ServerError) as err:  # reserved for its asker meanwhile ...
            _join(group.root.endpoint, None, None)
        assert err.value.code == "full"
        box: dict = {}
        started = time.monotonic()
        thread = threading.Thread(target=_start_unindexed_shard, args=(group, box), daemon=True)
        thread.start()
        while table.addresses()[1] is None and "error" not in box:
            assert time.monotonic() - started < 20, "the real shard never joined"
            time.sleep(0.05)
        assert "error" not in box, box  # ... then the real shard has it
        assert time.monotonic() - started >= 0.5  # after the reservation lapsed
        box["server"].request_stop()
        thread.join(timeout=15)
        box["server"].close()


def test_a_restarted_shard_takes_its_index_back_once_its_old_self_is_silent():
    with running_group(2, workers=1) as group:
        group.kill(1)
        started = time.monotonic()
        group.start(1)  # a new process's client: refused `full` until the old one is silent
        while group.root.group.table.addresses()[1] != group.servers[1].endpoint:
            assert time.monotonic() - started < 15, "the restarted shard never joined"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys"
    make_keys(path)
    return str(path)


@pytest.mark.parametrize(
    "op, shard",
    [("join", 0), ("stop", 0), ("stop", 1), ("checkpoint", 0), ("checkpoint", 1)],
)
def test_under_curve_a_worker_key_may_not_join_stop_or_checkpoint(keys, op, shard):
    with running_group(2, workers=1, keys=keys) as group:
        endpoint = group.servers[shard].endpoint
        worker = load_client_keys(keys, "worker")
        header = {"op": op}
        if op == "join":
            header.update(shard=1, servers=2, address=group.servers[1].endpoint)
        with PSClient(endpoint, groups=GROUPS, timeout=2.0, retries=0, keys=worker) as client:
            with pytest.raises(ServerError) as err:
                client._request(header)
        assert err.value.code == "operator"
        assert not group.servers[shard].stop.requested
        assert group.root.group.table.addresses()[1] == group.servers[1].endpoint
        if op == "join":  # an operator key's join is judged on its merits: a live index
            with pytest.raises(ServerError) as err:
                _join(endpoint, 1, "tcp://127.0.0.1:1", keys=load_client_keys(keys, OPERATOR))
            assert err.value.code == "full"
