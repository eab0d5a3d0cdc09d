"""RetryingClient: the core PSClient as users and launchers get it says hello again when
the server forgot it, explains a first silence in one line, and warns of a reply timeout
not below the heartbeat; the bare core client does none of it."""

import inspect
import logging
import time

import numpy as np
import pytest
import zmq
from test_server_support import make_params, running_server

import minips
from minips.classroom.dashboard import collector
from minips.classroom.web import gateway, grouprelay
from minips.cli import client_cmd
from minips.ops.client_retries import RetryingClient
from minips.protocol import wire
from minips.protocol.wire import ProtocolError
from minips.run import launch
from minips.worker.client import PSClient, ServerError, ServerUnavailable


def _declared_dead(server, worker_id):
    deadline = time.monotonic() + 10
    while server.registry.by_id[worker_id].alive:  # silent past the timeout: declared dead
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_worker_declared_dead_registers_again_transparently():
    params = make_params()
    with running_server(params=params, heartbeat_timeout=0.2) as server:
        with (
            RetryingClient(server.endpoint, worker_id="w") as ps,
            RetryingClient(server.endpoint) as other,
        ):
            ps.hello({"role": "test"})
            other.hello()
            _declared_dead(server, "w")
            reply = ps.push({"fc.b": np.ones(4, np.float32)}, base=0)
            assert reply.applied
            worker = server.registry.by_id["w"]
            # Alive again, unless this thread was held up past the 0.2 s heartbeat since the
            # reply (a loaded machine): then it is rightly dead once more.
            assert worker.alive or worker.silent_for(time.monotonic()) > 0.2
            assert ps.rank == 0
            assert server.registry.by_id["w"].info == {"role": "test"}
            ps.bye()
            ps.bye()  # a second bye (a retry whose reply was lost) is harmless


def test_the_bare_core_client_declared_dead_is_told_so():
    with running_server(heartbeat_timeout=0.2) as server:
        with PSClient(server.endpoint, worker_id="w") as ps, PSClient(server.endpoint) as other:
            ps.hello()
            other.hello()
            _declared_dead(server, "w")
            with pytest.raises(ServerError) as info:
                ps.push({"fc.b": np.ones(4, np.float32)}, base=0)
            assert info.value.code == "unknown_worker"


def test_a_timeout_not_below_the_heartbeat_is_warned_of(caplog):
    with running_server(heartbeat_timeout=3.0) as server:
        with caplog.at_level(logging.WARNING, logger="minips.client"):
            with RetryingClient(server.endpoint, timeout=3.0) as ps:
                ps.hello()
                ps.bye()
    assert "reply timeout 3 s is not below the server's heartbeat timeout 3 s" in caplog.text


def test_a_first_request_nothing_answers_names_the_keys():
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)  # takes the request, never answers
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind("tcp://127.0.0.1:*")
    endpoint = silent.getsockopt_string(zmq.LAST_ENDPOINT)
    try:
        with RetryingClient(endpoint, first_wait=0.3) as ps:
            with pytest.raises(ServerUnavailable) as info:
                ps.hello()
        assert str(info.value).startswith(f"nothing answers at {endpoint} (no reply in 0.3 s)")
        assert "--keys DIR" in str(info.value)
    finally:
        silent.close()
        context.term()


def test_a_bad_first_wait_is_refused_as_before():
    with pytest.raises(ValueError, match="timeout and first_wait must be > 0"):
        RetryingClient("tcp://127.0.0.1:5555", first_wait=0)


def test_every_user_and_launcher_client_is_the_retrying_one():
    assert issubclass(minips.PSClient, RetryingClient)
    assert issubclass(grouprelay.RelayedClient, RetryingClient)
    for module in (launch, collector, gateway):
        assert "RetryingClient(" in inspect.getsource(module), module.__name__
    assert "from minips.run.assembly import PSClient" in inspect.getsource(client_cmd)


def test_the_assembled_client_checks_every_reply_the_core_one_only_reads_it():
    """minips.PSClient (a RetryingClient) reads replies through the guard's decode_reply,
    whose field checks the bare core client does without (wire.decode: well-formed only)."""
    assert issubclass(minips.PSClient, RetryingClient)
    lacking = wire.encode({"op": "ping", "rid": 1})  # a ping reply lacks version and stop
    with RetryingClient("tcp://127.0.0.1:9") as checked, PSClient("tcp://127.0.0.1:9") as bare:
        with pytest.raises(ProtocolError) as refused:
            checked._read_reply(lacking)
        assert refused.value.code == "bad_field"
        assert bare._read_reply(lacking).header == {"v": 1, "op": "ping", "rid": 1}


def test_a_server_that_keeps_forgetting_the_worker_gets_at_most_retries_hellos_again():
    with running_server() as server:
        hellos = []
        hello = server.handlers["hello"]

        def counted(envelope, request):
            hellos.append(request.header["worker"])
            return hello(envelope, request)

        def forgets(envelope, request):  # declared dead before every push arrives
            raise ProtocolError("unknown worker 'w'", "unknown_worker")

        server.handlers["hello"], server.handlers["push"] = counted, forgets
        with RetryingClient(server.endpoint, retries=2, worker_id="w") as ps:
            ps.hello()
            with pytest.raises(ServerError) as info:
                ps.push({"fc.b": np.ones(4, np.float32)}, base=0)
    assert info.value.code == "unknown_worker"
    assert len(hellos) == 1 + 2  # its hello, then one per retry


def test_a_push_after_bye_does_not_register_the_worker_again():
    with running_server() as server:
        with RetryingClient(server.endpoint, worker_id="w") as ps:
            ps.hello()
            ps.bye()
            hellos = []
            hello = server.handlers["hello"]
            server.handlers["hello"] = lambda e, r: (hellos.append(r), hello(e, r))[1]
            with pytest.raises(ServerError) as info:  # a sender thread's late push
                ps.push({"fc.b": np.ones(4, np.float32)}, base=0)
    assert info.value.code == "unknown_worker" and hellos == []


def test_first_wait_is_the_first_requests_only_a_later_lost_reply_is_retried():
    with running_server() as server:
        reply, lost = server.outbox.reply, []

        def loses_the_first_pull_reply(envelope, header, worker=None, parts=()):
            if header.get("op") == "pull" and not lost:
                lost.append(header)  # as a network would: answered, never delivered
                return
            reply(envelope, header, worker=worker, parts=parts)

        server.outbox.reply = loses_the_first_pull_reply
        with RetryingClient(server.endpoint, timeout=0.3, retries=3, first_wait=5) as ps:
            ps.hello()
            started = time.monotonic()
            assert ps.pull().version == 0  # its second attempt, 0.3 s later
            assert time.monotonic() - started < 4 and lost
            ps.bye()
