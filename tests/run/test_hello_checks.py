"""hello's reply checked before the public worker uses it (minips/run/hello_checks.py): a
hostile or foreign server's odd field is one line naming it, never a traceback."""

import subprocess
import sys
import threading

import pytest
import zmq

from minips.guard import wire_checks
from minips.protocol import wire
from minips.protocol.wire import ProtocolError
from minips.run.hello_checks import check_hello


def _hello(**config_changes):
    config = {
        "model": {"name": "lenet5"},
        "dataset": "sample",
        "epochs": 1,
        "batch_size": 64,
        "seed": 0,
        "rule": {"name": "asgd"},
        "hetero": [1, 2.5],
        "hetero_schedule": "fixed",
        "partition": "iid",
    }
    config.update(config_changes)
    return {"rank": 0, "world_size": 2, "config": config, "version": 0, "heartbeat_timeout": 10}


def test_a_hello_of_the_form_the_worker_reads_passes():
    check_hello(_hello())
    check_hello(_hello(hetero_schedule="pareto:1.5:0.1", partition="dirichlet:0.1"))
    check_hello({**_hello(), "rank": 2})  # an observer's rank is world_size


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"model": 42}, "config.model"),
        ({"model": "lenet5"}, "config.model"),
        ({"model": {"name": "lenet5", "kwargs": [1]}}, "config.model.kwargs"),
        ({"rule": "asgd"}, "config.rule"),
        ({"rule": 5}, "config.rule"),
        ({"hetero": "abc"}, "config.hetero"),
        ({"hetero": [1, -1]}, "config.hetero"),
        ({"hetero": [1, float("nan")]}, "config.hetero"),
        ({"hetero_schedule": "away:x:y:z"}, "config.hetero_schedule"),
        ({"hetero_schedule": 3}, "config.hetero_schedule"),
        ({"partition": 3}, "config.partition"),
        ({"partition": "dirichlet:-1"}, "config.partition"),
        ({"epochs": "ten"}, "config.epochs"),
        ({"epochs": -1}, "config.epochs"),
        ({"epochs": 0}, "config.epochs"),
        ({"batch_size": 0}, "config.batch_size"),
        ({"seed": "x"}, "config.seed"),
        ({"batch_size": 1.5}, "config.batch_size"),
        ({"batch_size": True}, "config.batch_size"),
    ],
)
def test_an_odd_field_is_one_line_naming_it(changes, field):
    with pytest.raises(ProtocolError) as info:
        check_hello(_hello(**changes))
    message = str(info.value)
    assert message.startswith(f"the server's hello: {field} must be ") and "\n" not in message


@pytest.mark.parametrize(
    "hello, field",
    [
        ({**_hello(), "config": [1]}, "config"),
        ({**_hello(), "rank": "0"}, "rank"),
        ({**_hello(), "rank": 3}, "rank"),
        ({**_hello(), "world_size": 0}, "world_size"),
    ],
)
def test_an_odd_reply_field_is_one_line_naming_it(hello, field):
    with pytest.raises(ProtocolError, match=f"^the server's hello: {field} must be "):
        check_hello(hello)


def _answer_hello_with(reply_fields, stop):
    """A ROUTER on a free port that answers every hello with `reply_fields`; the port."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def serve():
        while not stop.is_set():
            if not router.poll(50):
                continue
            routing, *frames = router.recv_multipart()
            header = wire_checks.decode_request(frames).header
            if header["op"] == "hello":
                reply = {"op": "hello", "rid": header["rid"], "worker": header["worker"]}
                router.send_multipart([routing, *wire.encode({**reply, **reply_fields})])
        router.close()
        context.term()

    threading.Thread(target=serve, daemon=True).start()
    return port


def test_minips_worker_given_a_hostile_hello_says_one_line_without_a_traceback():
    stop = threading.Event()
    port = _answer_hello_with(_hello(model=42), stop)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "minips", "worker", "--connect", f"tcp://127.0.0.1:{port}",
             "--timeout", "1", "--quiet"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        stop.set()
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "the server's hello: config.model must be a map with a name" in done.stderr
