"""`minips train` stopped by Ctrl-C or SIGTERM keeps what it trained, as `minips run` does:
the model so far saved to --save, the metrics file's summary says `"interrupted": true`,
one line says what is kept, exit status 130. --save refuses an existing file without
--force, as `minips run --out` refuses a previous run. Real processes for the signals."""

import signal
import subprocess
import sys
import time

import pytest

from minips.ops.checkpoint_file import load_checkpoint
from minips.results.metrics import read_metrics

TRAIN = [sys.executable, "-m", "minips", "train", "--model", "mlp", "--dataset", "synthetic"]


def _eval_records(path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"event": "eval"' in line)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_saves_the_model_trained_so_far_and_says_so(tmp_path, signum):
    save, metrics = tmp_path / "trs.npz", tmp_path / "trs.jsonl"
    argv = [*TRAIN, "--epochs", "500", "--quiet", "--save", str(save), "--metrics", str(metrics)]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _eval_records(metrics) < 2:  # an epoch or two trained
            assert time.monotonic() < deadline and run.poll() is None, run.stderr.read()
            time.sleep(0.05)
        run.send_signal(signum)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    assert run.returncode == 130, stderr
    summary = read_metrics(metrics)[-1]
    assert summary["event"] == "summary" and summary["interrupted"] is True, summary
    samples = summary["samples"]
    assert samples >= 2 * 2000  # synthetic: 2000 training samples an epoch
    assert stderr.strip().splitlines() == [
        f"interrupted: training was cut short; the model after {samples} samples is kept in {save}"
    ]
    kept = load_checkpoint(save)
    assert kept.version == summary["steps"] == kept.meta["updates"]
    assert "test accuracy" not in stdout


def test_save_refuses_an_existing_file_without_force(tmp_path):
    save = tmp_path / "model.npz"
    save.write_bytes(b"a model of another kind")
    argv = [*TRAIN, "--epochs", "1", "--quiet", "--save", str(save)]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"error: --save {save} already exists (a model saved earlier?); "
        "choose another file or add --force to replace it"
    )
    assert save.read_bytes() == b"a model of another kind"
    replaced = subprocess.run([*argv, "--force"], capture_output=True, text=True, timeout=120)
    assert replaced.returncode == 0, replaced.stderr
    assert load_checkpoint(save).meta["trainer"] == "minips train"
