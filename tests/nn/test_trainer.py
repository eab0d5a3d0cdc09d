"""The single-process trainer and `minips train`: convergence, metrics schema, user errors."""

import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from minips.cli import cli
from minips.data import load_dataset
from minips.errors import ConfigError
from minips.nn import build_model
from minips.nn.losses import softmax_cross_entropy
from minips.ops.model_file import load
from minips.results.metrics import MetricsLog, read_metrics
from minips.trainer import TrainConfig, evaluate, train


def test_mlp_learns_synthetic_data_and_logs_the_schema(tmp_path):
    config = TrainConfig(model="mlp", dataset="synthetic", epochs=2, lr=0.05, eval_every=1000)
    with MetricsLog(tmp_path / "m.jsonl") as log:
        model, result = train(config, log)
    assert result.accuracy >= 0.9  # floor: synthetic classes are well separated
    assert result.samples == 2 * 2000 and result.steps == 2 * 32
    records = read_metrics(tmp_path / "m.jsonl")
    evals = [r for r in records if r["event"] == "eval"]
    # every 1000 samples (4 times in 4000) and none duplicated at the epoch ends
    assert [r["samples"] for r in evals] == [1024, 2000, 3024, 4000]
    for record in evals:
        assert set(record) == {"event", "time", "samples", "accuracy", "loss"}
    summary = records[-1]
    assert summary["event"] == "summary" and summary["accuracy"] == result.accuracy
    assert {"accuracy", "wall_s", "samples"} <= set(summary)
    data = load_dataset("synthetic")
    assert evaluate(model, data.x_test, data.y_test)[0] == result.accuracy


def test_same_seed_same_result():
    config = TrainConfig(model="mlp", dataset="synthetic", epochs=1, lr=0.05)
    first, second = train(config)[1], train(config)[1]
    assert (first.accuracy, first.loss) == (second.accuracy, second.loss)


@pytest.mark.parametrize(
    "field, value", [("epochs", 0), ("batch_size", 0), ("lr", 0.0), ("momentum", 1.0)]
)
def test_invalid_config_is_a_config_error(field, value):
    config = TrainConfig(dataset="synthetic", **{field: value})
    with pytest.raises(ConfigError):
        train(config)


def test_divergence_is_reported_not_silently_trained_through():
    config = TrainConfig(model="mlp", dataset="synthetic", epochs=1, lr=1e6, momentum=0.0)
    with pytest.raises(ConfigError, match="diverged"):
        train(config)


def test_cli_trains_saves_and_prints_the_accuracy_line(tmp_path):
    model_path, metrics_path = tmp_path / "model.npz", tmp_path / "m.jsonl"
    result = CliRunner().invoke(
        cli,
        ["train", "--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--lr", "0.05",
         "--metrics", str(metrics_path), "--save", str(model_path), "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("test accuracy: ") and float(last.split(": ")[1]) >= 0.9
    reloaded = build_model("mlp")
    load(reloaded, model_path)
    data = load_dataset("synthetic")
    assert evaluate(reloaded, data.x_test, data.y_test)[0] == float(last.split(": ")[1])
    assert read_metrics(metrics_path)[-1]["event"] == "summary"


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    code = "from minips.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "resnet999"], "--model"),
        (["--dataset", "imagenet"], "--dataset"),
        (["--dataset", "mnist", "--data-dir", "/nonexistent/minips"], "mnist"),
        (["--epochs", "0"], "--epochs"),
        (["--lr", "-1"], "--lr"),
        (["--batch-size", "many"], "--batch-size"),
    ],
)
def test_user_errors_are_one_line_without_traceback(args, message, tmp_path, monkeypatch):
    # An empty cache and system dir, so `mnist` cannot be found anywhere.
    monkeypatch.setenv("MINIPS_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("MINIPS_SYSTEM_DATA", str(tmp_path / "system"))
    proc = _run_cli("train", "--quiet", *args)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if "rror" in line]
    assert len(error_lines) == 1, proc.stderr
    assert message.lower() in error_lines[0].lower()


@pytest.mark.parametrize("damage", ["truncate", "corrupt-gzip"])
def test_damaged_idx_file_is_one_line_error_from_the_cli(tmp_path, damage):
    import gzip
    import shutil

    from minips.data import SAMPLE_DIR

    data_dir = tmp_path / "fashion-mnist"
    shutil.copytree(SAMPLE_DIR, data_dir)
    target = data_dir / "train-images-idx3-ubyte.gz"
    raw = gzip.decompress(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    else:
        blob = bytearray(target.read_bytes())
        blob[len(blob) // 2 : len(blob) // 2 + 64] = b"\x00" * 64
        target.write_bytes(bytes(blob))
    proc = _run_cli("train", "--quiet", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "train-images-idx3-ubyte.gz" in lines[0]


def test_evaluate_reports_the_same_loss_whatever_the_batch_size():
    model = build_model("mlp", seed=3, hidden=[16], in_features=12, n_classes=5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((103, 12)).astype(np.float32)  # 103: batches of 7 leave 5
    y = rng.integers(0, 5, 103)
    logits = model.forward(x, train=False)
    whole_loss, _ = softmax_cross_entropy(logits, y)
    whole_accuracy = float((logits.argmax(axis=1) == y).mean())
    for batch_size in (1, 7, 50, 103, 1000):
        accuracy, loss = evaluate(model, x, y, batch_size=batch_size)
        assert accuracy == pytest.approx(whole_accuracy, abs=1e-12), batch_size
        assert loss == pytest.approx(whole_loss, rel=1e-5), batch_size
