"""docs/protocol.md and the server agree on each point where a client written from the
document alone could go wrong, and on every limit and error code.

Each test reads the document's own words or numbers where it can, then asks a live server.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from test_server_support import RawPeer, running_server

from minips.guard.wire_checks import MAX_PUSH_SAMPLES
from minips.ops import request_checks as checks
from minips.protocol import wire
from minips.server.server import ServerOptions
from minips.state import registry

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
DOC = DOC_PATH.read_text()
SOURCES = Path(__file__).resolve().parents[2] / "minips"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_every_byte_count_before_a_hex_block_is_the_blocks_length():
    # "(91 bytes):" then `<!-- label -->` and a hex block: §11 said 93 for its 91 bytes.
    blocks = re.findall(r"\((\d+) bytes\):\s*\n\s*<!-- ([\w-]+) -->\s*```\s*\n(.*?)```", DOC, re.S)
    assert len(blocks) >= 3
    for count, label, hex_text in blocks:
        assert int(count) == len(bytes.fromhex(hex_text)), label


def _push(peer: RawPeer, descriptor: dict, frame: bytes = b"\0" * 8) -> wire.Message:
    header = {"v": 1, "op": "push", "rid": 7, "worker": "w", "seq": 0, "base": 0,
              "arrays": [descriptor]}  # fmt: skip
    peer.send([msgpack.packb(header), frame])
    return peer.recv()


FC_B = {"name": "fc.b", "dtype": "float32", "shape": [4], "codec": "dense"}


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"name": "x" * 257}, "too_large"),  # a 257-character array name
        ({"shape": [1] * 9}, "too_large"),  # 9 dimensions
        ({"shape": [0, 2**63]}, "too_large"),
        ({"codec": None}, "bad_field"),  # a descriptor without codec
        ({"shape": 4}, "bad_field"),  # a shape that is not a list
        ({"shape": "4"}, "bad_field"),
        ({"shape": [-1]}, "shape"),  # a list, of something other than uints
    ],
)
def test_descriptor_errors_are_the_documented_codes(change, code):
    descriptor = {**FC_B, **change}
    if change.get("codec", "") is None:
        del descriptor["codec"]
    with running_server() as server, RawPeer(server.endpoint) as peer:
        peer.request({"op": "hello", "worker": "w"})
        reply = _push(peer, descriptor)
        assert reply.op == "error" and reply.header["code"] == code, reply.header
    assert f"`{code}`" in DOC.split("## 4. Array descriptors")[1].split("## 5.")[0]


def test_a_257_character_worker_id_is_too_large():
    assert "`worker` is a string of 1..256 characters" in _one_line(DOC)
    with running_server() as server, RawPeer(server.endpoint) as peer:
        reply = peer.request({"op": "hello", "worker": "w" * 257})
        assert reply.header["code"] == "too_large"
        assert peer.request({"op": "hello", "worker": "w" * 256}).op == "hello"


def test_a_dropped_push_reports_tau_t_minus_base_and_its_samples_count():
    text = _one_line(DOC)
    assert "so `tau = t - base` as well" in text
    assert "a push the rule then drops included" in text
    options = {"schedule": "cutoff", "tau_max": 1}
    with running_server("dasgd", rule_options=options) as server, RawPeer(server.endpoint) as p:
        p.request({"op": "hello", "worker": "w"})
        grads = {"fc.b": np.ones(4, np.float32)}
        for seq in range(3):  # t = 3
            push = {"op": "push", "worker": "w", "seq": seq, "base": seq, "samples": 10}
            assert p.request(push, grads).header["applied"]
        stale = {"op": "push", "worker": "w", "seq": 3, "base": 0, "samples": 5}
        reply = p.request(stale, grads).header
        assert reply["applied"] is False and reply["version"] == 3
        assert reply["staleness"] == 3 - 0  # t - base, as for an applied push
        stats = p.request({"op": "stats"}).header["stats"]
        assert stats["dropped"] == 1 and stats["samples"] == 35  # the dropped push's 5 too


def _error_codes_in_sources() -> set[str]:
    pattern = re.compile(r'ProtocolError\((?:[^()]|\([^()]*\))*?,\s*"([a-z_]+)",?\s*\)', re.S)
    return {m for path in SOURCES.rglob("*.py") for m in pattern.findall(path.read_text())}


def test_every_error_code_the_server_raises_is_in_the_table_of_section_9():
    section = DOC.split("## 9. Errors")[1].split("## 10.")[0]
    table = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))
    raised = _error_codes_in_sources()
    assert {"not_owner", "operator", "too_large", "bad_field"} <= raised
    assert raised <= table, raised - table


def test_the_limits_of_section_10_are_the_servers():
    section = _one_line(DOC.split("## 10. Limits")[1].split("## 11.")[0])
    limits, options = wire.DEFAULT_LIMITS, ServerOptions()
    assert limits.max_frame_bytes == 64 << 20 and "| one array frame | 64 MiB |" in section
    assert limits.max_message_bytes == 256 << 20 and "| whole message | 256 MiB |" in section
    assert f"| array frames per message | {limits.max_arrays} |" in section
    assert f"| answered pushes remembered per worker | {registry.SEQ_WINDOW} " in section
    assert f"| observers registered at once | {registry.MAX_OBSERVERS};" in section
    assert f"silent for {registry.OBSERVER_EXPIRY} × `heartbeat_timeout`" in section
    assert f"| worker ids remembered (live or not) | {registry.MAX_REGISTERED:,} " in section
    assert checks.MAX_INFO_BYTES == 1024 and f"{checks.MAX_INFO_DEPTH} levels" in section
    assert f"| a push's `samples` | {MAX_PUSH_SAMPLES:,} " in section
    assert f"high-water mark is {options.send_hwm} messages" in section
    assert "`MAXMSGSIZE` is the frame limit" in section
    with running_server() as server:
        assert server.socket.getsockopt(zmq.MAXMSGSIZE) == limits.max_frame_bytes
        assert server.socket.getsockopt(zmq.SNDHWM) == options.send_hwm


def test_the_documented_timeouts_are_the_defaults():
    section = _one_line(DOC.split("## 7. Liveness")[1].split("## 8.")[0])
    heartbeat = ServerOptions().heartbeat_timeout
    assert f"default `heartbeat_timeout` is {heartbeat:g} s" in section
    from minips.cli.client_cmd import worker

    timeout = next(p.default for p in worker.params if p.name == "timeout")
    assert f"reply timeout {timeout:g} s" in section and timeout < heartbeat


def test_section_15_names_the_socket_options_the_code_sets():
    section = DOC.split("## 15. Keys and authentication")[1]
    auth_source = (SOURCES / "guard" / "curve.py").read_text()
    for option in ("curve_server", "curve_secretkey", "curve_publickey", "curve_serverkey"):
        assert option in auth_source and option.upper() in section
    for name in ("server.key", "server.key_secret", "allowed/", "operators/", "User-Id"):
        assert name in section
    server_source = (SOURCES / "server" / "router.py").read_text()
    assert "ROUTER_HANDOVER" in section and "ROUTER_HANDOVER" in server_source
