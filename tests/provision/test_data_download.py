"""`download`: fetched over a real loopback HTTP server, checksum-verified, atomic."""

from __future__ import annotations

import hashlib
import http.server
import socket
import string
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from minips.cli import cli
from minips.data import IDX_FILES, load_dataset
from minips.data.synthetic import make_synthetic
from minips.errors import ConfigError, DataError
from minips.provision import fetch
from minips.provision.fetch import download, write_idx
from minips.provision.locations import find_data

FILENAMES = [f"{stem}.gz" for stem in IDX_FILES.values()]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # keep test output clean
        pass


@pytest.fixture
def server(tmp_path):
    """A loopback HTTP server over a folder of small valid IDX .gz files; yields (url, dir)."""
    served = tmp_path / "served"
    served.mkdir()
    for name, array in zip(FILENAMES, make_synthetic(0, 30, 10), strict=True):
        write_idx(served / name, array)
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(QuietHandler, directory=str(served))
    )
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def md5s(directory: Path) -> dict[str, tuple[str, ...]]:
    return {n: (hashlib.md5((directory / n).read_bytes()).hexdigest(),) for n in FILENAMES}


def test_good_download_lands_in_cache_and_loads(server, tmp_path):
    url, served = server
    cache = tmp_path / "cache"
    target = download("mnist", cache, url, progress=False, checksums=md5s(served))
    assert target == cache / "mnist"
    assert sorted(p.name for p in target.iterdir()) == sorted(FILENAMES)  # no .part left
    for name in FILENAMES:
        assert (target / name).read_bytes() == (served / name).read_bytes()
    ds = load_dataset(
        "mnist", find=lambda n, d: find_data(n, d, system_dir=tmp_path / "none", cache_dir=cache)
    )
    assert ds.source == str(target) and len(ds.y_train) == 30 and len(ds.y_test) == 10


def test_valid_cached_files_are_not_fetched_again(server, tmp_path):
    url, served = server
    checksums = md5s(served)
    download("fashion-mnist", tmp_path / "c", url, progress=False, checksums=checksums)
    for name in FILENAMES:
        (served / name).unlink()  # the mirror is gone: only the cache can satisfy this
    target = download("fashion-mnist", tmp_path / "c", url, progress=False, checksums=checksums)
    assert sorted(p.name for p in target.iterdir()) == sorted(FILENAMES)


def test_corrupt_download_is_rejected_and_not_kept(server, tmp_path):
    url, served = server
    checksums = md5s(served)
    bad = served / "t10k-images-idx3-ubyte.gz"
    write_idx(bad, np.ones((10, 28, 28), np.uint8))  # valid IDX, wrong content
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as exc:
        download("mnist", cache, url, progress=False, checksums=checksums)
    message = str(exc.value)
    assert "\n" not in message
    assert "t10k-images-idx3-ubyte.gz: checksum mismatch" in message
    assert checksums["t10k-images-idx3-ubyte.gz"][0] in message
    left = sorted(p.name for p in (cache / "mnist").iterdir())
    assert "t10k-images-idx3-ubyte.gz" not in left
    assert not [n for n in left if n.endswith(".part")]


def test_checksum_of_decompressed_content_is_accepted(server, tmp_path):
    # A mirror that re-gzipped the same data (as Debian did) still verifies by content.
    url, served = server
    from minips.data.idx import read_idx_bytes

    checksums = {
        n: ("0" * 32, hashlib.md5(read_idx_bytes(served / n)).hexdigest()) for n in FILENAMES
    }
    target = download("mnist", tmp_path / "c", url, progress=False, checksums=checksums)
    assert len(list(target.iterdir())) == 4


def test_http_error_is_one_line(server, tmp_path):
    url, served = server
    checksums = md5s(served)
    (served / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as exc:
        download("mnist", tmp_path / "c", url, progress=False, checksums=checksums)
    assert "could not download" in str(exc.value) and "HTTP 404" in str(exc.value)
    assert "\n" not in str(exc.value)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_is_one_line(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/"
    checksums = {n: ("0" * 32,) for n in FILENAMES}
    with pytest.raises(DataError) as exc:
        download("mnist", tmp_path / "c", url, progress=False, checksums=checksums)
    assert str(exc.value).startswith(f"could not download {url}train-images-idx3-ubyte.gz: ")
    assert "\n" not in str(exc.value)
    assert not list((tmp_path / "c" / "mnist").iterdir())


@pytest.mark.parametrize("base_url", ["nonsense://127.0.0.1/", "no-scheme-at-all"])
def test_malformed_url_is_one_line(tmp_path, base_url):
    checksums = {n: ("0" * 32,) for n in FILENAMES}
    with pytest.raises(DataError, match="could not download") as exc:
        download("mnist", tmp_path, base_url, progress=False, checksums=checksums)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("name", ["sample", "synthetic"])
def test_nothing_to_download(name, tmp_path):
    with pytest.raises(ConfigError, match="nothing to download"):
        download(name, tmp_path)


def test_official_checksums_cover_every_file():
    from minips.provision.fetch import BASE_URLS, CHECKSUMS

    for name in ("fashion-mnist", "mnist"):
        assert BASE_URLS[name].startswith("http")
        assert sorted(CHECKSUMS[name]) == sorted(FILENAMES)
        for digests in CHECKSUMS[name].values():
            assert all(len(d) == 32 and set(d) <= set(string.hexdigits) for d in digests)


def test_download_through_the_cli(server, tmp_path, monkeypatch):
    url, served = server
    # The CLI always verifies against the built-in table: swap in the test files' MD5s.
    monkeypatch.setitem(fetch.CHECKSUMS, "mnist", md5s(served))
    cache = tmp_path / "cache"
    result = CliRunner().invoke(
        cli, ["data", "download", "mnist", "--cache-dir", str(cache), "--base-url", url]
    )
    assert result.exit_code == 0, result.output
    assert f"mnist: saved to {cache / 'mnist'}" in result.output
    assert "train-images-idx3-ubyte.gz" in result.output  # the progress bar's label
    assert sorted(p.name for p in (cache / "mnist").iterdir()) == sorted(FILENAMES)
