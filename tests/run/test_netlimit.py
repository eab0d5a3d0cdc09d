"""netlimit: tc-style rate parsing and the token bucket's measured rate, alone and shared."""

import os
import signal
import threading
import time

import numpy as np
import pytest
import zmq

from minips.errors import ConfigError
from minips.protocol.wire import frames_nbytes
from minips.run import netlimit
from minips.run.netlimit import Link, TokenBucket
from minips.run.plan_measure import parse_rate


@pytest.mark.parametrize(
    "text, bytes_per_s",
    [
        ("100mbit", 12.5e6),
        ("1gbit", 125e6),
        ("20Mbit", 2.5e6),
        ("500kbit", 62_500),
        ("8bit", 1),
        ("1.5gbit", 187.5e6),
        ("10mbps", 10e6),  # tc's "mbps" is megaBYTES per second
        ("3kbps", 3000),
        ("7bps", 7),
        ("1mibit", 2**20 / 8),
        (" 100 mbit ", 12.5e6),
    ],
)
def test_parse_rate_units_like_tc(text, bytes_per_s):
    assert parse_rate(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize(
    "text", ["", "100", "fast", "100mb", "-5mbit", "0mbit", "mbit", "1e999gbit"]
)
def test_parse_rate_refuses_bad_input_in_one_line(text):
    with pytest.raises(ConfigError) as info:
        parse_rate(text)
    assert "\n" not in str(info.value)
    assert "rate" in str(info.value)


def test_link_from_option():
    assert Link.from_option(None) is None
    link = Link.from_option("100mbit")
    assert link.up.rate == link.down.rate == 12.5e6
    assert link.up is not link.down


class FakeClock:
    """netlimit's `time`: monotonic() reads this clock, sleep(s) advances it by s plus
    `late` (a scheduler's oversleep). Rates measured on it are exact on any machine."""

    def __init__(self, late: float = 0.0) -> None:
        self.now, self.late = 1000.0, late

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + self.late


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(netlimit, "time", fake)
    return fake


def _pace(bucket, chunks, chunk_bytes):
    for _ in range(chunks):
        bucket.wait(chunk_bytes)


def _assert_never_faster(nbytes, elapsed, bucket):
    """What the bucket guarantees on any machine: over any interval it lets through at
    most its rate's bytes plus one bucketful (the level it may have at the start). A loaded
    machine can only make the caller late (slower), never faster, so no bound from below."""
    assert nbytes <= bucket.rate * elapsed + bucket.burst, (nbytes, elapsed, bucket.rate)


def test_bucket_rate_is_exact_on_its_clock(clock):
    # 4 MB/s in 64 KB chunks after the full bucket is spent: the last byte crosses at
    # exactly bytes / rate.
    rate, chunk, chunks = 4e6, 65_536, 31
    bucket = TokenBucket(rate, burst_bytes=0.05 * rate)
    bucket.wait(int(bucket.burst))
    start = clock.now
    _pace(bucket, chunks, chunk)
    assert clock.now - start == pytest.approx(chunks * chunk / rate, rel=1e-9)


def test_oversleeps_within_the_burst_are_made_up(clock):
    # Each sleep 10 ms late (the 64 KB chunk's own time is 16 ms, the burst 50 ms): the
    # tokens that flowed in meanwhile shorten the next wait, so the rate stays exact up to
    # the last call's lateness.
    rate, chunk, chunks = 4e6, 65_536, 31
    bucket = TokenBucket(rate, burst_bytes=0.05 * rate)
    bucket.wait(int(bucket.burst))
    clock.late = 0.010
    start = clock.now
    _pace(bucket, chunks, chunk)
    ideal = chunks * chunk / rate
    assert ideal <= clock.now - start <= ideal + clock.late + 1e-9


def test_bucket_rate_is_never_above_its_rate_on_the_real_clock():
    # 4 MB/s for ~0.5 s in 64 KB chunks; the 50 ms burst lets the caller make up late wakes.
    rate, chunk, chunks = 4e6, 65_536, 31
    bucket = TokenBucket(rate, burst_bytes=0.05 * rate)
    bucket.wait(int(bucket.burst))
    start = time.monotonic()
    _pace(bucket, chunks, chunk)
    _assert_never_faster(chunks * chunk, time.monotonic() - start, bucket)
    # It asked for no more sleep than the bytes need (it is not slow by itself).
    assert bucket.total_wait <= (chunks * chunk + bucket.burst) / rate


def test_message_larger_than_the_burst_is_paced_not_refused():
    bucket = TokenBucket(10e6, burst_bytes=1500)
    start = time.monotonic()
    slept = bucket.wait(2_000_000)  # 0.2 s at 10 MB/s, less the bucketful it held
    elapsed = time.monotonic() - start
    assert slept == pytest.approx((2_000_000 - 1500) / 10e6, rel=1e-3)
    assert elapsed >= slept


def test_idle_bucket_allows_only_its_burst(clock):
    bucket = TokenBucket(1e6, burst_bytes=50_000)
    clock.sleep(0.1)  # 100 KB of tokens would flow in, but the bucket holds 50 KB
    assert bucket.reserve(50_000) == 0.0
    assert bucket.reserve(100_000) == pytest.approx(0.1, rel=1e-9)


def test_threads_sharing_a_bucket_share_its_rate():
    # A sender thread and the main thread on one link: together they get the rate, not
    # twice (at twice the rate these 2 MB would take 0.25 s; the bound asks for >= 0.45 s).
    rate, chunk, chunks = 4e6, 50_000, 20
    bucket = TokenBucket(rate, burst_bytes=0.05 * rate)
    bucket.wait(int(bucket.burst))
    start = time.monotonic()
    threads = [threading.Thread(target=_pace, args=(bucket, chunks, chunk)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _assert_never_faster(2 * chunks * chunk, time.monotonic() - start, bucket)
    assert bucket.total_bytes == 2 * chunks * chunk + int(bucket.burst)


def test_up_and_down_are_independent(clock):
    link = Link("80mbit", burst_bytes=0)  # 10 MB/s each way
    # full duplex: a 1 MB transfer each way at once is told to wait 0.1 s each, not 0.2 s
    assert link.up.reserve(1_000_000) == pytest.approx(0.1, rel=1e-9)
    assert link.down.reserve(1_000_000) == pytest.approx(0.1, rel=1e-9)
    assert link.up.reserve(1_000_000) == pytest.approx(0.2, rel=1e-9)  # up alone queues


def test_bucket_paces_real_zmq_traffic():
    # What the client will do: wait on the bytes of each multipart message it sends.
    context = zmq.Context.instance()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    link = Link("160mbit", burst_bytes=200_000)  # 20 MB/s; the burst absorbs send time
    frames = [b"header", np.zeros(250_000, np.float32)]  # 1 MB + 6 bytes
    link.up.wait(200_000)  # spend the initial burst before timing
    start = time.monotonic()
    received = 0
    try:
        for _ in range(8):
            link.up.wait(frames_nbytes(frames))
            dealer.send_multipart(frames, copy=False)
            _, *got = router.recv_multipart(copy=False)
            received += frames_nbytes(got)
    finally:
        router.close()
        dealer.close()
    elapsed = time.monotonic() - start
    assert received == 8 * 1_000_006
    _assert_never_faster(received, elapsed, link.up)


def test_frames_nbytes_counts_bytes_not_items():
    array = np.ones((10, 3), np.float32)
    assert (
        frames_nbytes([b"abc", memoryview(array), array, zmq.Frame(b"12345")]) == 3 + 120 + 120 + 5
    )


def test_a_wait_cut_by_ctrl_c_gives_its_tokens_back():
    """A push interrupted while it waits for the link never left: the goodbye sent next
    does not wait out its debt."""
    bucket = TokenBucket(1000, burst_bytes=0)  # 1 kB/s: 10,000 bytes take 10 s

    def ctrl_c_while_it_sleeps() -> None:
        while bucket.total_wait == 0:  # the tokens are taken: the 10 s sleep begins
            time.sleep(0.01)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    # Ctrl-C as a terminal's: a suite started in the background (`&`) inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter = threading.Thread(target=ctrl_c_while_it_sleeps)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            bucket.wait(10_000)
    finally:
        interrupter.join()
        signal.signal(signal.SIGINT, previous)
    assert bucket.reserve(100) < 0.5  # 100 bytes' own 0.1 s, not the 10 s of the push
    assert bucket.total_bytes == 100
