"""minips.run.netem (`--netem`): the tc-shaped link really runs at its rate, and nothing is left
behind."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minips.run import netem

TOOL = Path(__file__).resolve().parents[2] / "tools" / "netem.py"


def _why_not() -> str | None:
    try:
        netem.check_can_shape()
    except netem.NetemError as error:
        return str(error)
    return None


needs_root = pytest.mark.skipif(_why_not() is not None, reason=f"netem: {_why_not()}")


def test_not_root_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netem.main(["--rate", "100mbit", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs root" in err
    assert signal.getsignal(signal.SIGTERM) is not netem._raise_on_signal  # given back


def test_bad_rate_is_refused_before_anything_is_built(capsys):
    assert netem.main(["--rate", "fast", "--", "true"]) == 2
    assert "bad rate" in capsys.readouterr().err


@needs_root
@pytest.mark.parametrize("rate_mbit", [40])
def test_shaped_link_runs_at_its_rate_both_ways_and_is_removed(rate_mbit):
    target = rate_mbit * 1e6 / 8
    with netem.shaped_link(f"{rate_mbit}mbit") as link:
        netns, server_addr, client_addr = link  # unpacks as the launcher expects
        assert netns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                       text=True).stdout  # fmt: skip
        assert server_addr.startswith("169.254.") and client_addr.startswith("169.254.")
        # 4 MB each way: ~0.8 s at 40 Mbit/s. TCP/IP + Ethernet headers take ~4.4% of the
        # shaped rate (1448 payload bytes per 1514-byte frame), so the goodput is ~0.956 x.
        # A loaded machine can only stall a transfer (a descheduled receiver, a TCP
        # retransmission timeout), never speed it up: the best of 3 is the link's capacity.
        for direction in ("up", "down"):
            best = 0.0
            for _ in range(3):
                measured = netem.measure_throughput(link, 4_000_000, direction)
                assert measured <= 1.02 * target, f"{direction}: faster than the link"
                best = max(best, measured)
                if best >= 0.85 * target:
                    break
            assert best >= 0.85 * target, f"{direction}: {best * 8 / 1e6:.1f} Mbit/s"
    assert netem.leftovers(link) == []


@needs_root
def test_exception_inside_the_block_removes_everything_and_ends_its_processes():
    with pytest.raises(RuntimeError, match="boom"):
        with netem.shaped_link("100mbit") as link:
            sleeper = subprocess.Popen([*link.prefix, "sleep", "600"])
            time.sleep(0.2)
            raise RuntimeError("boom")
    assert sleeper.wait(timeout=5) != 0  # ended by the cleanup, not by itself
    assert netem.leftovers(link) == []
    assert link.host_dev not in subprocess.run(["ip", "link"], capture_output=True,
                                               text=True).stdout  # fmt: skip


@needs_root
def test_cli_runs_server_inside_and_command_outside_and_cleans_up_on_sigterm():
    # The server listens inside the namespace; the command (outside) connects through the
    # link, then waits to be interrupted: SIGTERM to the tool must still remove everything.
    server = (
        f"{sys.executable} -c 'import socket,time;"
        ' s=socket.create_server(("{server_addr}", 5611));'
        ' c,_=s.accept(); c.sendall(b"hi"); time.sleep(600)\''
    )
    client = (
        "import os,socket,time\n"
        "for _ in range(100):\n"
        "    try: s=socket.create_connection((os.environ['MINIPS_NETEM_SERVER_ADDR'], 5611))\n"
        "    except OSError: time.sleep(0.05)\n"
        "    else: break\n"
        "print('got', s.recv(2), flush=True); time.sleep(600)\n"
    )
    tool = subprocess.Popen(
        [sys.executable, str(TOOL), "--rate", "100mbit", "--server", server, "--",
         sys.executable, "-c", client],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert tool.stdout.readline().strip() == "got b'hi'"
        netns = re.search(r"netns (\S+)", tool.stderr.readline()).group(1)
        assert netns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                       text=True).stdout  # fmt: skip
        tool.send_signal(signal.SIGTERM)
        assert tool.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        if tool.poll() is None:
            tool.kill()
    assert netem.leftovers(netem.ShapedLink(netns, "", "")) == []


@pytest.mark.skipif(shutil.which("ip") is None, reason="netem: `ip` not found")
def test_prefix_runs_a_program_in_the_namespace():
    assert netem.netns_prefix("minips-ps-1-abcdef") == ["ip", "netns", "exec", "minips-ps-1-abcdef"]


@needs_root
def test_remove_stale_clears_what_a_killed_run_left_and_nothing_else():
    killed = (
        "import os, signal\n"
        "from minips.run import netem\n"
        "with netem.shaped_link('100mbit') as link:\n"
        "    print(link.netns, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", killed], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL
    stale = netem.ShapedLink(done.stdout.strip(), "", "")
    assert netem.leftovers(stale) != []  # SIGKILL skips every finally: it is left behind
    with netem.shaped_link("100mbit") as alive:
        assert stale.netns in netem.remove_stale()
        assert len(netem.leftovers(alive)) == 2  # a live run's link is not touched
    assert netem.leftovers(stale) == []
