"""The web gateway without a browser: framing, HTTP endpoints, and the relay to a real server."""

import json
import re
import struct
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import pytest
from test_server_support import running_server

from minips.classroom.web.framing import FramingError, pack_frames, unpack_frames
from minips.classroom.web.shards import to_pixels
from minips.data import load_dataset, normalize, parse_idx
from minips.errors import ConfigError

websockets = pytest.importorskip(
    "websockets", reason="websockets not installed: pip install '.[web]'"
)
from minips.classroom.web import start_gateway  # noqa: E402
from minips.classroom.web.gateway import parse_listen  # noqa: E402

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_framing_round_trip_and_the_documented_example():
    frames = [b"header", b"", b"\x00" * 10]
    packed = pack_frames(frames)
    assert packed[:16] == struct.pack("<4I", 3, 6, 0, 10)
    assert [bytes(f) for f in unpack_frames(packed)] == frames
    hello = msgpack.packb({"v": 1, "op": "hello", "rid": 1, "worker": "w0"})
    assert pack_frames([hello])[:8].hex(" ") == "01 00 00 00 1c 00 00 00"
    assert "`01 00 00 00 1c 00 00 00`" in PROTOCOL.read_text()


@pytest.mark.parametrize(
    "message, reason",
    [
        (b"\x01\x00", "no frame count"),
        (struct.pack("<I", 0), "outside"),
        (struct.pack("<I", 5000), "outside"),
        (struct.pack("<2I", 2, 3), "shorter than its 2 lengths"),
        (struct.pack("<2I", 1, 3) + b"ab", "add up to 3 bytes but 2 follow"),
        (struct.pack("<2I", 1, 3) + b"abcd", "add up to 3 bytes but 4 follow"),
    ],
)
def test_bad_framing_is_a_one_line_error(message, reason):
    with pytest.raises(FramingError, match=reason):
        unpack_frames(message)


def test_served_pixels_normalise_back_to_numpys_inputs_bit_for_bit():
    data = load_dataset("sample")
    pixels = to_pixels(data.x_train, "sample")
    assert pixels.dtype == np.uint8 and pixels.shape == (len(data.y_train), 28, 28)
    np.testing.assert_array_equal(normalize(pixels, "sample"), data.x_train)


def test_listen_addresses():
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("8080", "host:", "host:http", "h:70000"):
        with pytest.raises(ConfigError):
            parse_listen(bad)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_http_serves_page_scripts_shards_and_clear_errors():
    with running_server() as server, start_gateway(server.endpoint) as gateway:
        status, page = _get(gateway.url)
        assert status == 200 and b"minips browser worker" in page
        scripts = re.findall(rb'src="/static/([\w.]+)"', page)
        assert scripts == [b"page.js"]
        for name in ("page.js", "worker.js", "nn.js", "gemm.js", "wire.js", "msgpack.js"):
            assert _get(f"{gateway.url}static/{name}")[0] == 200, name
        # WebAssembly.instantiateStreaming accepts only this type
        for name in ("gemm.wasm", "kernels.wasm"):
            with urllib.request.urlopen(f"{gateway.url}static/{name}", timeout=10) as response:
                assert response.headers["Content-Type"] == "application/wasm"
                assert response.read()[:4] == b"\0asm"
        info = json.loads(_get(gateway.url + "data/synthetic/info")[1])
        assert info["train"] == 2000 and info["mean"] == pytest.approx(0.4949)

        data = load_dataset("synthetic")
        shards = []
        for rank in range(3):
            images = parse_idx(_get(f"{gateway.url}data/synthetic/train/{rank}/3/images")[1])
            labels = parse_idx(_get(f"{gateway.url}data/synthetic/train/{rank}/3/labels")[1])
            expected = data.shard(rank, 3)
            np.testing.assert_array_equal(normalize(images, "synthetic"), expected.x_train)
            np.testing.assert_array_equal(labels, expected.y_train)
            shards.append(len(labels))
        assert sum(shards) == 2000
        test_labels = parse_idx(_get(gateway.url + "data/synthetic/test/labels")[1])
        np.testing.assert_array_equal(test_labels, data.y_test)

        assert _get(gateway.url + "nothing/here")[0] == 404
        assert _get(gateway.url + "static/../gateway.py")[0] == 404
        status, body = _get(gateway.url + "data/imagenet/info")
        assert status == 400 and body.startswith(b"error: unknown dataset")
        status, body = _get(gateway.url + "data/synthetic/train/3/3/images")
        assert status == 400 and b"bad shard" in body


def test_websocket_relays_to_the_server_as_an_ordinary_worker():
    from websockets.sync.client import connect

    with running_server(world_size=1) as server, start_gateway(server.endpoint) as gateway:
        url = gateway.url.replace("http", "ws") + "ws"
        with connect(url) as ws:
            hello = {"v": 1, "op": "hello", "rid": 7, "worker": "tab-1", "info": {"a": 1}}
            ws.send(pack_frames([msgpack.packb(hello)]))
            (frame,) = unpack_frames(ws.recv(timeout=10))
            reply = msgpack.unpackb(frame)
            assert reply["op"] == "hello" and reply["rid"] == 7 and reply["rank"] == 0
            ws.send(
                pack_frames([msgpack.packb({"v": 1, "op": "pull", "rid": 8, "worker": "tab-1"})])
            )
            frames = unpack_frames(ws.recv(timeout=10))
            header = msgpack.unpackb(frames[0])
            assert header["rid"] == 8 and len(frames) == 1 + len(header["arrays"]) > 1
            # An error reply is relayed like any other (the gateway does not judge).
            ws.send(pack_frames([msgpack.packb({"v": 1, "op": "fly", "rid": 9})]))
            error = msgpack.unpackb(unpack_frames(ws.recv(timeout=10))[0])
            assert error["op"] == "error" and error["code"] == "unknown_op"
        assert server.stats()["workers"][0]["info"] == {"a": 1}


def test_bad_framing_closes_only_that_websocket():
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with running_server() as server, start_gateway(server.endpoint) as gateway:
        url = gateway.url.replace("http", "ws") + "ws"
        with connect(url) as good, connect(url) as bad:
            bad.send(struct.pack("<2I", 1, 99) + b"short")
            with pytest.raises(ConnectionClosed) as info:
                bad.recv(timeout=10)
            assert info.value.rcvd.code == 1007 and "bad framing" in info.value.rcvd.reason
            good.send(pack_frames([msgpack.packb({"v": 1, "op": "stats", "rid": 1})]))
            assert msgpack.unpackb(unpack_frames(good.recv(timeout=10))[0])["op"] == "stats"
        with connect(url) as text:
            text.send("hello")
            with pytest.raises(ConnectionClosed) as info:
                text.recv(timeout=10)
            assert info.value.rcvd.code == 1003
        assert gateway.gateway.stats.connections == 3 and len(gateway.gateway.stats.refused) == 2


def test_minips_web_cli_refuses_a_bad_listen_address():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "minips", "web", "--connect", "tcp://127.0.0.1:1", "--listen", "x"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and result.stderr.startswith("error: --listen wants HOST:PORT")
