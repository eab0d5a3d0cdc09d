"""The server's push path asks its operations at named points (minips/server/seams.py), in
the order of the idea: a request received, the push checked, accepted, the rule's update
refused or written, the pull counted. A server takes the operations it is given
(`operations=`); a run's are the usual ones (minips/ops/server_ops.py). Each named
point's own checks (who pushes, a retried seq, the sample budget) are tested here at the
point."""

from __future__ import annotations

import pytest
import zmq
from test_server_support import filled, make_params

import minips
from minips.guard import wire_checks
from minips.ops.inflow import LISTEN_BACKLOG, RECEIVE_HWM
from minips.ops.operator_requests import OperatorRequests, refuse_join
from minips.ops.ops_options import OpsOptions
from minips.ops.retries import check_retry
from minips.ops.server_ops import ServerOps
from minips.protocol import wire
from minips.protocol.wire import ProtocolError
from minips.rules import make_rule
from minips.run.build import make_server
from minips.run.config import RunConfig
from minips.server.server import ParameterServer
from minips.state.registry import WorkerRegistry
from minips.state.requests import Origin
from minips.state.store import SGD

POINTS = ("received", "decode_request", "check_push", "accepted", "carrying_out",
          "refuse_update", "updated", "dropped", "pulled")  # fmt: skip


class Recorded(ServerOps):
    """The usual operations, each named point noted in `calls` as it is asked."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls: list[str] = []
        for name in POINTS:
            setattr(self, name, self._noting(name, getattr(self, name)))

    def _noting(self, name, method):
        def noted(*args, **kwargs):
            self.calls.append(name)
            return method(*args, **kwargs)

        return noted


def _frames(header, arrays=None):
    body = wire.encode(header, arrays)
    return [zmq.Frame(b"\x00abcd")] + [zmq.Frame(bytes(frame)) for frame in body]


def _server(options=None, rule="asgd"):
    params = make_params()
    ops: list[Recorded] = []

    def operations(*args):
        ops.append(Recorded(*args))
        return ops[0]

    server = ParameterServer(params, make_rule(rule), SGD(params, lr=0.1), options,
                             operations=operations)  # fmt: skip
    return server, ops[0]


def test_one_fused_push_asks_each_named_point_in_the_order_of_the_idea():
    server, ops = _server()
    try:
        server.serve(_frames({"op": "hello", "worker": "w", "rid": 1}))
        ops.calls.clear()
        header = {"op": "push", "worker": "w", "seq": 0, "base": 0, "pull_since": 0, "rid": 2}
        server.serve(_frames(header, filled(0.5)))
        assert ops.calls == ["received", "decode_request", "check_push", "accepted",
                             "carrying_out", "refuse_update", "updated", "pulled"]  # fmt: skip
        assert server.store.version == 1 and ops.counters.updates == 1
    finally:
        server.close()


def test_a_refused_push_passes_no_point_after_its_check():
    server, ops = _server()
    try:
        server.serve(_frames({"op": "hello", "worker": "w", "rid": 1}))
        ops.calls.clear()
        header = {"op": "push", "worker": "w", "seq": 0, "base": 5, "rid": 2}  # base > t
        server.serve(_frames(header, filled(0.5)))
        assert ops.calls == ["received", "decode_request", "check_push"]
        assert server.store.version == 0 and ops.counters.errors == 1
    finally:
        server.close()


def test_the_sample_budget_asks_a_planned_stop_once_reached():
    server, ops = _server(OpsOptions(max_samples=64))
    try:
        server.serve(_frames({"op": "hello", "worker": "w", "rid": 1}))
        for seq in range(2):
            header = {"op": "push", "worker": "w", "seq": seq, "base": seq, "samples": 32,
                      "rid": 2 + seq}  # fmt: skip
            assert not server.stopping
            server.serve(_frames(header, filled(0.5)))
        assert server.stopping and server.stop.planned and "sample budget" in server.stop.why
        assert ops.counters.samples == 64
    finally:
        server.close()


def test_pusher_refuses_an_observer_and_check_retry_a_failed_or_stale_seq():
    registry = WorkerRegistry(None, grace=1.0)
    origin = Origin(b"\x01a")
    registry.register("eval", {"role": "observer"}, origin)
    request = wire.Message(header={"worker": "eval"}, nbytes=0)
    with pytest.raises(ProtocolError) as refused:
        registry.pusher(request, origin)
    assert refused.value.code == "observer"
    worker = registry.register("w", {}, origin)
    worker.highest_seq = 5
    worker.remember_answer(
        4, {"op": "error", "reason": "internal server error", "code": "internal"}
    )
    worker.remember_answer(5, {"op": "push", "applied": True})
    assert check_retry(worker, 5) == "answered"
    with pytest.raises(ProtocolError) as failed:
        check_retry(worker, 4)
    assert failed.value.code == "internal"
    with pytest.raises(ProtocolError) as stale:
        check_retry(worker, 1)
    assert stale.value.code == "stale_seq"


def test_the_core_names_no_operations_a_run_builds_the_usual_ones():
    """The server imports no operation: it is built with the operations it is given, and
    a run's server (minips/run/build.py) is given the usual ones."""
    params = make_params()
    with pytest.raises(TypeError, match="operations"):
        ParameterServer(params, make_rule("asgd"), SGD(params, lr=0.1))  # type: ignore[call-arg]
    server = make_server(RunConfig(model="lenet5", bind="tcp://127.0.0.1:*"))
    try:
        assert isinstance(server.ops, ServerOps) and server.ops.inflow is not None
    finally:
        server.close()


def test_every_server_checks_a_request_with_the_guards_checks():
    """A request is decoded by the guard's checks (minips/guard/wire_checks.py) with the
    server's limits, in a run's server and the public one: a builder that dropped them, or
    a refactor that replaced them, fails here (the core's `wire.decode` checks no field)."""
    params = make_params()
    for built in (make_server(RunConfig(model="lenet5", bind="tcp://127.0.0.1:*")),
                  minips.ParameterServer(params, make_rule("asgd"), SGD(params))):  # fmt: skip
        try:
            assert built.ops.decode_request.func is wire_checks.decode_request
            assert built.ops.decode_request.keywords == {"limits": built.options.limits}
        finally:
            built.close()


def test_the_requests_beside_training_are_the_operations_own():
    """`stats`, `stop`, `checkpoint` and `join` are not the core's: its operations add them
    (ops/operator_requests.py), the operator's key checked by the operations' own check;
    a run's server and the public one both have them."""
    server, ops = _server()
    try:
        assert server.handlers["join"] is refuse_join
        for op in ("stats", "stop", "checkpoint"):
            requests = server.handlers[op].__self__
            assert isinstance(requests, OperatorRequests) and requests.server is server
            assert requests.check_operator == ops.check_operator
    finally:
        server.close()
    params = make_params()
    for built in (make_server(RunConfig(model="lenet5", bind="tcp://127.0.0.1:*")),
                  minips.ParameterServer(params, make_rule("asgd"), SGD(params))):  # fmt: skip
        try:
            assert set(built.handlers) >= {"stats", "stop", "checkpoint", "join"}
        finally:
            built.close()


def test_the_socket_caps_are_set_by_the_operations_before_the_server_binds():
    """ZeroMQ's caps on the ROUTER socket are the operations' (ops/inflow.py's
    `cap_router`, from ServerOps.attach, which runs before the bind): a run's server and
    the public one have them all."""
    params = make_params()
    for built in (make_server(RunConfig(model="lenet5", bind="tcp://127.0.0.1:*")),
                  minips.ParameterServer(params, make_rule("asgd"), SGD(params))):  # fmt: skip
        try:
            limits, socket = built.options.limits, built.socket
            assert socket.getsockopt(zmq.MAXMSGSIZE) == max(limits.max_frame_bytes,
                                                            limits.max_header_bytes)  # fmt: skip
            assert socket.getsockopt(zmq.SNDHWM) == built.options.send_hwm
            assert socket.getsockopt(zmq.RCVHWM) == RECEIVE_HWM
            assert socket.getsockopt(zmq.BACKLOG) == LISTEN_BACKLOG
        finally:
            built.close()
