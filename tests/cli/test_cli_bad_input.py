"""Bad input on the command line and in the files it reads: one `error:` line, exit 2.

Each case is one the commands once let through: a NaN or an integer too large for the
wire that no range refused, a path the file system refuses, a damaged file beside a run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minips.cli import main
from minips.errors import ConfigError
from minips.run.config import RunConfig
from minips.run.settings import MAX_INT

HUGE = str(MAX_INT + 1)
TINY_RUN = ["--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--workers", "1"]


def _refused(capsys, *args: str) -> str:
    """The one error line `minips ARGS` prints, asserting it exits 2 with nothing else."""
    with pytest.raises(SystemExit) as leaving:
        main(list(args))
    lines = capsys.readouterr().err.strip().splitlines()
    assert leaving.value.code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (["train", "--lr", "nan"], "--lr: 'nan' is not a finite number"),
        (["train", "--weight-decay", "inf"], "--weight-decay: 'inf' is not a finite number"),
        (["train", "--momentum", "nan"], "--momentum: 'nan' is not a finite number"),
        (["train", "--seed", "-1"], "--seed: -1 is not in the range x>=0"),
        (["run", "--join-wait", "1e400"], "--join-wait: '1e400' is not a finite number"),
        (["run", "--heartbeat-timeout", "nan"], "--heartbeat-timeout: 'nan' is not a finite"),
        (["run", "--clip-norm", "nan"], "--clip-norm: 'nan' is not a finite number"),
        (["run", "--epochs", HUGE], f"--epochs: {HUGE} is more than {MAX_INT}"),
        (["run", "--seed", HUGE], f"--seed: {HUGE} is more than {MAX_INT}"),
        (["run", "--rule", "ssp", "--staleness", HUGE], f"--staleness: {HUGE} is more than"),
        (["run", "--workers", "1025"], "--workers: 1025 is not in the range 1<=x<=1024"),
        (["run", "--workers", HUGE], f"--workers: {HUGE} is not in the range 1<=x<=1024"),
        (["run", "--workers", "1", "--hetero", "nan"], "--hetero factors must be finite"),
        (["run", "--eval-interval", "nan"], "--eval-interval: 'nan' is not a finite number"),
        (["worker", "--connect", "tcp://127.0.0.1:9", "--timeout", "inf"], "--timeout: 'inf'"),
        (["worker", "--connect", "tcp://127.0.0.1:9", "--rank", HUGE], f"--rank: {HUGE} is"),
        (["plan", "--compute-ms", "nan"], "--compute-ms: 'nan' is not a finite number"),
        (["plan", "--batch-size", "10" + "0" * 11], "--batch-size: 1000000000000 is not in"),
        (["run", "--plan", "auto", "--batch-size", "10" + "0" * 11],
         "--plan auto times batches of --batch-size here: at most 4096, got 1000000000000"),
    ],
)  # fmt: skip
def test_a_number_no_run_can_use_is_refused_at_its_option(tmp_path, capsys, args, words):
    # Data for train, and an --out that holds a file for run: were the number let through,
    # the command would go on to train, or be refused for its --out instead.
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    extra = {
        "train": ["--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--quiet"],
        "run": ["--dataset", "synthetic", "--out", str(tmp_path)],
        "plan": ["--bandwidth", "100mbit", "--repeats", "1", "--json", str(a_file) + "/x"],
    }.get(args[0], [])
    assert words in _refused(capsys, *args, *extra)


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"lr": NaN}', "lr must be a finite number, got nan"),
        ('{"join_wait": Infinity}', "join wait must be a finite number, got inf"),
        ('{"seed": -1}', "seed must be >= 0, got -1"),
        (f'{{"epochs": {HUGE}}}', f"epochs must be <= {MAX_INT}"),
        ('{"workers": 2, "hetero": [1, "x"]}', "--hetero factors must be finite numbers"),
        ('{"rule": "ssp", "rule_options": {"staleness": 1e400}}', "rule option staleness"),
    ],
)
def test_a_config_file_with_a_number_no_run_can_use_is_refused(tmp_path, text, words):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words):
        RunConfig.from_json(path).validate()


def test_a_server_refuses_a_batch_too_large_for_the_planner_to_time():
    """`minips server --plan auto` plans in its own process, as `minips plan` does (a batch
    that large was a MemoryError from the planner's first allocation)."""
    config = RunConfig(model="mlp", dataset="synthetic", plan="auto", batch_size=10**12)
    with pytest.raises(ConfigError, match="--plan auto times batches of --batch-size here"):
        config.validate()
    RunConfig(model="mlp", dataset="synthetic", batch_size=10**12).validate()  # no planner


def test_more_servers_than_a_model_can_split_is_one_short_line():
    with pytest.raises(ConfigError) as caught:
        RunConfig(model="mlp", dataset="synthetic", servers=100_000).validate()
    line = str(caught.value)
    assert line.startswith("--servers 100000 is more than the") and len(line) < 200


def test_an_out_directory_the_file_system_refuses_is_one_line(tmp_path):
    """A real process, as a user meets it: `minips run --out` under a file."""
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "out"
    argv = [sys.executable, "-m", "minips", "run", *TINY_RUN, "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: cannot use {out}")
    assert lines[0].endswith(f"{tmp_path / 'a-file'} is a file, not a directory")


def test_a_plot_that_cannot_be_written_is_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"event": "eval", "time": 1.0}) + "\n")
    (tmp_path / "a-file").write_text("")
    pytest.importorskip("matplotlib")
    line = _refused(capsys, "plot", str(run_dir), "--out", str(tmp_path / "a-file" / "p.png"))
    assert str(tmp_path / "a-file") in line and line.endswith("a file, not a directory")


def _other_models_checkpoint(path):
    from minips.nn import build_model
    from minips.ops.checkpoint_file import save_store
    from minips.state.store import SGD, ParameterStore

    params = build_model("lenet5").params
    return save_store(ParameterStore(params, SGD(params, lr=0.1)), path)


@pytest.mark.parametrize("resume", ["text", "another-model"])
def test_force_keeps_the_previous_run_when_resume_is_no_checkpoint_of_the_model(
    tmp_path, capsys, resume
):
    previous = tmp_path / "run"
    previous.mkdir()
    kept = {name: f"{name} of the previous run" for name in ("metrics.jsonl", "summary.json")}
    for name, text in kept.items():
        (previous / name).write_text(text)
    path = tmp_path / "resume.npz"
    if resume == "text":
        path.write_text("not a checkpoint\n")
        words = "is not an .npz archive (it starts with b'not a ')"
    else:
        _other_models_checkpoint(path)
        words = "holds parameters ['conv1.b'"
    args = ["run", *TINY_RUN, "--quiet", "--force", "--out", str(previous), "--resume", str(path)]
    line = _refused(capsys, *args)
    assert line.startswith(f"error: checkpoint {path}") and words in line
    assert {p.name: p.read_text() for p in previous.iterdir()} == kept


def test_launch_force_keeps_the_checkpoint_it_resumes_from(tmp_path, capsys, monkeypatch):
    """`minips launch --force --resume OUT/checkpoint.npz`, as `minips run` does: the
    previous run's files go, the checkpoint the new run starts from stays."""
    import minips.run.cluster
    from minips.nn import build_model
    from minips.ops.checkpoint_file import save_store
    from minips.state.store import SGD, ParameterStore

    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / "run.lock").write_text("")  # every run leaves its lock file: a run's folder
    params = build_model("mlp").params
    checkpoint = save_store(ParameterStore(params, SGD(params, lr=0.1)), out / "checkpoint.npz")
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)  # this process: the coordinator of a torchrun job
    summary = {"samples": 0, "updates": 0, "wall_s": 0.0, "workers": 1, "accuracy": 0.0}
    monkeypatch.setattr(minips.run.cluster, "launch", lambda *args: summary)  # no job
    main(["launch", "--model", "mlp", "--dataset", "synthetic", "--force", "--out", str(out),
          "--resume", str(checkpoint)])  # fmt: skip
    # run.lock: the run's lock (minips.run.runlock), released when `main` returned
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.npz", "run.lock"]


def _checkpoint_reads(monkeypatch) -> list[str]:
    """The paths every checkpoint read in this process reads from, from now on."""
    from minips.ops import checkpoint_file

    reads, read = [], checkpoint_file.read_checkpoint
    monkeypatch.setattr(checkpoint_file, "read_checkpoint", lambda p: reads.append(p) or read(p))
    return reads


def test_minips_run_reads_its_resume_checkpoint_once_before_it_starts(tmp_path, monkeypatch):
    """Checked against the model once, before --out is claimed (the server process reads it
    again only to resume from it)."""
    from minips.nn import build_model
    from minips.ops.checkpoint_file import save_store
    from minips.run.launch import LocalRun
    from minips.state.store import SGD, ParameterStore

    params = build_model("mlp").params
    path = str(save_store(ParameterStore(params, SGD(params, lr=0.1)), tmp_path / "resume.npz"))
    reads = _checkpoint_reads(monkeypatch)
    summary = {"samples": 0, "updates": 0, "wall_s": 0.0, "staleness_mean": None,
               "staleness_max": None, "accuracy": 0.0}  # fmt: skip
    monkeypatch.setattr(LocalRun, "run", lambda self: summary)  # no processes started
    main(["run", *TINY_RUN, "--quiet", "--out", str(tmp_path / "run"), "--resume", path])
    assert [str(p) for p in reads] == [path]


def test_a_server_reads_its_resume_checkpoint_once(tmp_path, monkeypatch):
    from minips.run.build import make_server

    path = _other_models_checkpoint(tmp_path / "lenet5.npz")
    reads = _checkpoint_reads(monkeypatch)
    config = RunConfig(dataset="synthetic", bind="tcp://127.0.0.1:*", resume=str(path))
    make_server(config).close()
    assert [str(p) for p in reads] == [str(path)]


def _idx_dir(path, n_train: int, n_test: int):
    """A --data-dir holding mnist's four IDX files with these many examples."""
    import numpy as np

    from minips.data import IDX_FILES
    from minips.provision.fetch import write_idx

    (path / "mnist").mkdir(parents=True)
    for role, stem in IDX_FILES.items():
        n = n_train if role.startswith("train") else n_test
        shape = (n, 28, 28) if role.endswith("images") else (n,)
        write_idx(path / "mnist" / stem, np.zeros(shape, np.uint8))
    return path


@pytest.mark.parametrize("n_train, n_test, split", [(0, 5, "training"), (5, 0, "test")])
def test_a_dataset_with_an_empty_split_is_refused(tmp_path, capsys, n_train, n_test, split):
    data_dir = _idx_dir(tmp_path, n_train, n_test)
    args = ["train", "--model", "mlp", "--dataset", "mnist", "--data-dir", str(data_dir)]
    line = _refused(capsys, *args, "--epochs", "1", "--quiet")
    assert line == f"error: {data_dir / 'mnist'}: the {split} set is empty (0 images)"


EVAL = json.dumps({"event": "eval", "time": 1.5, "samples": 64, "accuracy": 0.5}) + "\n"


@pytest.mark.parametrize(
    "files, words",
    [
        ({"metrics.jsonl": EVAL + "[1, 2]\n"}, "metrics.jsonl line 2 is not a JSON object"),
        ({"metrics.jsonl": EVAL, "summary.json": "[1]"}, "summary.json is not a JSON object"),
        ({"metrics.jsonl": EVAL, "summary.json": "{"}, "summary.json is not valid JSON"),
        ({"metrics.jsonl": EVAL, "config.json": '"lenet5"'}, "config.json is not a JSON object"),
        ({"eval.jsonl": EVAL + '{"event": "eval", "time": "x"}\n'},
         "eval.jsonl line 2: time 'x' is not a number"),
    ],
)  # fmt: skip
def test_a_run_directory_with_a_file_of_the_wrong_shape_is_one_line(tmp_path, capsys, files, words):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert words in _refused(capsys, "report", str(tmp_path))


def test_a_run_file_that_is_a_directory_is_one_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").mkdir()
    line = _refused(capsys, "report", str(tmp_path))
    assert line == f"error: cannot use {tmp_path / 'metrics.jsonl'}: Is a directory"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--rule", "nosuch"], "unknown update rule 'nosuch'"),
        (["--momentum", "0.5"], "rule dana-gap keeps one momentum per worker"),
        (["--workers", "1025"], "--workers: 1025 is not in the range 1<=x<=1024"),
    ],
)
def test_plan_refuses_what_run_would_refuse(tmp_path, capsys, args, words):
    # Were it let through, planning would fail on writing the plan under a file.
    (tmp_path / "a-file").write_text("")
    json_path = str(tmp_path / "a-file" / "plan.json")
    line = _refused(capsys, "plan", *args, "--repeats", "1", "--json", json_path)
    assert words in line


@pytest.mark.parametrize("name", ["../outside", "", ".hidden", "server", "a/b"])
def test_keys_refuses_a_client_name_that_is_no_file_name_in_the_directory(tmp_path, capsys, name):
    line = _refused(capsys, "keys", str(tmp_path / "keys"), "--client", name)
    assert "cannot name key files" in line
    assert list(tmp_path.iterdir()) == []  # nothing written, inside or out


def test_keys_refuses_a_client_named_twice(tmp_path, capsys):
    line = _refused(capsys, "keys", str(tmp_path / "keys"), "--client", "a", "--client", "a")
    assert line == "error: client names ['a'] are given more than once"


def test_train_refuses_a_save_path_it_cannot_write_before_it_trains(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    save = tmp_path / "a-file" / "model.npz"
    args = ["train", "--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--quiet"]
    line = _refused(capsys, *args, "--save", str(save))
    assert (
        line
        == f"error: --save {save}: cannot write there ({save.parent} is a file, not a directory)"
    )


def test_a_server_refuses_a_checkpoint_path_it_cannot_write_before_it_serves(tmp_path):
    from minips.errors import RunDirError
    from minips.run.build import make_server

    (tmp_path / "a-file").write_text("")
    checkpoint = tmp_path / "a-file" / "checkpoint.npz"
    config = RunConfig(
        model="mlp", dataset="synthetic", bind="tcp://127.0.0.1:*", checkpoint=str(checkpoint)
    )
    with pytest.raises(RunDirError, match="--checkpoint .*: cannot write there"):
        make_server(config).close()  # (closed when the check is missing)


NO_PORT = "--connect 'nonsense' needs a host and a port, e.g. tcp://127.0.0.1:5555"


@pytest.mark.parametrize(
    "args, words",
    [
        (["dashboard", "--connect", "nonsense"], NO_PORT),
        (["web", "--connect", "nonsense"], NO_PORT),
        (["web", "--connect", "tcp://127.0.0.1:9", "--url-file", "{a-file}/url"],
         "--url-file {a-file}/url: cannot write there ({a-file} is a file, not a directory)"),
    ],
)  # fmt: skip
def test_a_page_server_refuses_its_bad_input_before_it_serves(tmp_path, args, words):
    """Real processes: these commands serve until stopped, so a refusal must come first
    (a bad --connect was a traceback in a thread, or a page that never trained)."""
    if args[0] == "web":
        pytest.importorskip("websockets")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    args = [arg.replace("{a-file}", str(a_file)) for arg in args]
    argv = [sys.executable, "-m", "minips", *args, "--listen", "127.0.0.1:0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: " + words.replace("{a-file}", str(a_file))


def _netem_refusal() -> str | None:
    from minips.run import netem

    try:
        netem.check_can_shape()
    except netem.NetemError as error:
        return str(error)
    return None


def _links_named(prefix: str) -> list[str]:
    """The namespaces, links and qdiscs on this machine whose names start with `prefix`."""
    found = []
    for command in (["ip", "netns", "list"], ["ip", "-o", "link"], ["tc", "qdisc", "show"]):
        listing = subprocess.run(command, capture_output=True, text=True).stdout
        found += [line for line in listing.splitlines() if prefix in line]
    return found


@pytest.mark.parametrize("rate", ["1bit", "7bit", "1.5e8tbit"])
def test_force_keeps_the_previous_run_when_tc_could_not_shape_the_netem_rate(
    tmp_path, capsys, rate
):
    """tc's tbf shapes 1 byte/s to 2^64 - 1 bytes/s (1bit is 0 bytes/s to it): a rate
    outside is refused with the options, before --force removes the previous run."""
    previous = tmp_path / "run"
    previous.mkdir()
    kept = {name: f"{name} of the previous run" for name in ("metrics.jsonl", "summary.json")}
    for name, text in kept.items():
        (previous / name).write_text(text)
    args = ["run", *TINY_RUN, "--quiet", "--force", "--out", str(previous), "--netem", rate]
    line = _refused(capsys, *args)
    assert line.startswith(f"error: --netem: bad rate '{rate}': tc shapes 8bit"), line
    assert {p.name: p.read_text() for p in previous.iterdir()} == kept


@pytest.mark.parametrize(
    "plan, words",
    [
        ({"format": 1, "params": {"conv9.w": {"push": "fp16"}}}, "plan names 'conv9.w'"),
        ({"format": 1, "params": {"fc1.w": {"push": "zzz"}}}, "unknown codec 'zzz'"),
        ({"format": 1, "params": {"fc1.b": {"push": "sf"}}}, "codec sf needs an fc layer's"),
    ],
)
def test_force_keeps_the_previous_run_when_the_plan_file_does_not_fit_the_model(
    tmp_path, capsys, plan, words
):
    """A plan file is read and checked against the model with the options, before --force
    removes the previous run (the plan is used only when the processes start)."""
    previous = tmp_path / "run"
    previous.mkdir()
    (previous / "summary.json").write_text("the previous run's")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    args = ["run", *TINY_RUN, "--quiet", "--force", "--out", str(previous), "--plan", str(path)]
    assert words in _refused(capsys, *args)
    assert [p.name for p in previous.iterdir()] == ["summary.json"]


@pytest.mark.parametrize("what", ["dashboard", "page", "keys", "trace"])
def test_force_keeps_the_previous_run_when_what_its_processes_need_is_not_there(
    tmp_path, capsys, what
):
    """An address the dashboard or the browser page cannot listen on, a key directory
    whose keys do not load and a trace file that cannot be written stop the run only once
    its processes start (the trace: when it ends): they are asked before --force removes
    the previous run."""
    import socket

    previous = tmp_path / "run"
    previous.mkdir()
    (previous / "summary.json").write_text("the previous run's")
    args = ["run", *TINY_RUN, "--quiet", "--force", "--out", str(previous)]
    with socket.socket() as taken:  # listening: nobody else can bind this port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        if what == "dashboard":
            args += ["--dashboard", "--dashboard-listen", address]
            words = f"error: --dashboard-listen {address}: cannot listen there: Address already"
        elif what == "page":
            args += ["--browser", "1", "--listen", address]
            words = f"error: --listen {address}: cannot listen there: Address already"
        elif what == "trace":
            (tmp_path / "a-file").write_text("")
            args += ["--trace", str(tmp_path / "a-file" / "trace.json")]
            words = f"error: --trace {tmp_path / 'a-file' / 'trace.json'}: cannot write there"
        else:
            keys = tmp_path / "keys"
            keys.mkdir()
            (keys / "server.key_secret").write_text("not a key\n")
            args += ["--keys", str(keys)]
            words = f"error: cannot read key file {keys / 'server.key_secret'}"
        assert _refused(capsys, *args).startswith(words)
    assert [p.name for p in previous.iterdir()] == ["summary.json"]


def test_a_trace_inside_a_new_out_is_a_run_like_any_other(tmp_path, capsys):
    """--trace under --out, in a folder not made yet: the start's check creates nothing,
    so --out is still new when it is claimed, and the trace is written there."""
    out = tmp_path / "new"
    trace = out / "traces" / "t.json"
    main(["run", *TINY_RUN, "--quiet", "--out", str(out), "--trace", str(trace)])
    assert "test accuracy" in capsys.readouterr().out
    assert trace.exists()


def test_force_keeps_the_previous_run_when_this_user_cannot_shape_a_link(
    tmp_path, capsys, monkeypatch
):
    """Not root: `--netem` cannot build its link, which is said before --force removes
    the previous run (the link itself is built later, when the processes start)."""
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    previous = tmp_path / "run"
    previous.mkdir()
    (previous / "summary.json").write_text("the previous run's")
    args = ["run", *TINY_RUN, "--quiet", "--force", "--out", str(previous), "--netem", "100mbit"]
    line = _refused(capsys, *args)
    assert line == (
        "error: --netem 100mbit: a shaped link needs root (network namespaces and tc): "
        "run it with sudo"
    )
    assert [p.name for p in previous.iterdir()] == ["summary.json"]


@pytest.mark.skipif(_netem_refusal() is not None, reason=f"netem: {_netem_refusal()}")
def test_a_link_tc_refuses_is_one_line_and_leaves_nothing_behind(monkeypatch):
    """A rate tc refuses, given to the shaped-link code itself (below the options' check):
    one line, tc's reason without its usage text; the namespace and veth pair made before
    tc refused are gone."""
    import secrets

    from minips.run import netem

    name = "t" + secrets.token_hex(2)  # the veths are named after these 5 characters
    monkeypatch.setenv("MINIPS_NETEM_NAME", name)
    try:
        with pytest.raises(netem.NetemError) as refused:
            with netem.shaped_links(1, "1bit"):
                pass
        assert str(refused.value) == 'tc failed: tbf: the "rate" parameter is mandatory.'
        assert _links_named(name) == []
    finally:  # what a failing run left, removed even when the test fails
        for netns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                    text=True).stdout.split():  # fmt: skip
            if netns.startswith(f"{name}-ps-"):
                netem._remove(netem.ShapedLink(netns, "", ""))


def test_a_shard_whose_root_never_answers_says_it_waits_then_one_error_line(capsys, monkeypatch):
    """`minips server --root ADDR` with nothing at ADDR: one line saying what it waits for
    and how long, then the error line when the wait is over (the wait cut short here)."""
    import socket

    import minips.group.shard

    monkeypatch.setattr(minips.group.shard, "ASSEMBLE_TIMEOUT", 2.0)
    with socket.socket() as taken:  # bound, never listening: a port nobody answers at
        taken.bind(("127.0.0.1", 0))
        root = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(SystemExit) as leaving:
            main(["server", "--servers", "2", "--shard", "1", "--root", root])
    lines = capsys.readouterr().err.strip().splitlines()
    assert leaving.value.code == 2, lines
    assert lines == [
        f"waiting for the group's root at {root} (up to 2 s)",
        f"error: no answer from the group's root at {root} within 2 s",
    ]
