"""Resuming from slices of different versions is said in one `warning:` line
(minips/ops/mixed_resume.py): a group started on shard files left at different versions
(one shard SIGKILLed), and a server resuming a group checkpoint whose shards ended apart."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np

from minips.ops.checkpoint_file import read_checkpoint
from minips.ops.group_checkpoints import assemble, shard_path
from minips.ops.mixed_resume import mixed_checkpoint_line, mixed_shards_line
from tests.group.test_group_checkpoints import save

SERVE = ["--workers", "1", "--model", "mlp", "--dataset", "synthetic", "--rule", "asgd",
         "--bind", "tcp://127.0.0.1:*"]  # fmt: skip


def served(tmp_path, *options: str) -> str:
    """What `minips server OPTIONS` says from its start to its stop by SIGTERM once it serves."""
    log = tmp_path / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "minips", "server", *SERVE, *options],
                                  stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "minips server on" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return log.read_text()


def warnings(said: str) -> list[str]:
    return [line for line in said.splitlines() if line.startswith("warning:")]


def test_a_group_resumed_from_its_shards_files_at_different_versions_says_the_mix(tmp_path):
    save(tmp_path, 0, 112)  # run-shard0.npz: the root stopped at 112
    save(tmp_path, 1, 92)  # run-shard1.npz: shard 1 SIGKILLed at 92, no group checkpoint
    said = served(tmp_path, "--servers", "2", "--checkpoint", str(tmp_path / "run.npz"))
    assert "resumed each shard from the model already at" in said, said
    mixed = [line for line in warnings(said) if "a mix of versions" in line]
    assert len(mixed) == 1, said  # at its start (its stop says the shards' versions again)
    assert "a mix of versions 112 and 92 (shard 0 at 112, shard 1 at 92)" in mixed[0], said


def test_a_group_resumed_from_shards_files_at_one_version_says_no_mix(tmp_path):
    save(tmp_path, 0, 40)
    save(tmp_path, 1, 40)
    said = served(tmp_path, "--servers", "2", "--checkpoint", str(tmp_path / "run.npz"))
    assert "resumed each shard" in said and warnings(said) == [], said


def test_a_server_resuming_a_torn_group_checkpoint_says_the_mix(tmp_path):
    save(tmp_path, 0, 70)
    save(tmp_path, 1, 68)
    group = assemble(tmp_path / "run.npz", final=True)
    assert group is not None and not group.consistent
    said = served(tmp_path, "--resume", str(tmp_path / "run.npz"),
                  "--checkpoint", str(tmp_path / "next.npz"))  # fmt: skip
    (line,) = warnings(said)
    assert f"{tmp_path / 'run.npz'} is a mix of versions 70 and 68" in line, said


def test_a_shard_resuming_from_the_start_beside_one_from_a_file_is_a_mix(tmp_path):
    # shard 1's file lost (no group checkpoint either): it starts afresh at 0
    save(tmp_path, 0, 40)
    line = mixed_shards_line([str(shard_path(tmp_path / "run.npz", 0)), None])
    assert line is not None and "a mix of versions 40 and 0 (shard 0 at 40, shard 1 at 0)" in line


def test_a_shard_file_whose_version_cannot_be_read_counts_as_version_0(tmp_path):
    # its own load refuses it and says why; the mix is said, not a traceback
    save(tmp_path, 0, 40)
    damaged = tmp_path / "run-shard1.npz"
    damaged.write_bytes(b"PK\x03\x04 not a whole archive")
    line = mixed_shards_line([str(shard_path(tmp_path / "run.npz", 0)), str(damaged)])
    assert line is not None and "(shard 0 at 40, shard 1 at 0)" in line


def _with_group(source, target, group) -> str:
    """`source`'s arrays with its meta's `group` replaced (a file minips did not write)."""
    arrays = read_checkpoint(source)
    meta = json.loads(str(arrays["meta"]))
    arrays["meta"] = np.array(json.dumps({**meta, "group": group}))
    np.savez(target, **arrays)
    return str(target)


def test_a_checkpoint_whose_group_meta_is_not_minips_own_is_resumed_without_a_word(tmp_path):
    # Its load checks no `group`: the warning must not be what ends the server.
    save(tmp_path, 0, 70)
    save(tmp_path, 1, 68)
    assemble(tmp_path / "run.npz", final=True)
    torn = {"consistent": False}
    odd = [[70, 68], {**torn, "versions": ["70", 68]}, {**torn, "versions": [None, 68]},
           {**torn, "versions": 7}]  # fmt: skip
    for j, group in enumerate(odd):
        assert (
            mixed_checkpoint_line(_with_group(tmp_path / "run.npz", tmp_path / f"{j}.npz", group))
            is None
        )
    said = served(tmp_path, "--resume", str(tmp_path / "0.npz"),
                  "--checkpoint", str(tmp_path / "next.npz"))  # fmt: skip
    assert "Traceback" not in said and warnings(said) == [], said
