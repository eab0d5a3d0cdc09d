"""Keys in each form a key directory can take, against an in-process CURVE server.

`minips keys` always writes the full set (a worker and an operator key); a teacher copying
`.key` files in and out of `allowed/` and `operators/`, or a script calling make_keys with
its own names, makes the others: several clients, no operator, an operator key only in
`operators/`, a damaged or public-only key file. Each is checked for what it lets in and
what it lets stop or checkpoint the server.
"""

import pytest
from test_server_support import running_server

from minips.provision import keyfiles
from minips.worker.client import PSClient, ServerError, ServerUnavailable


def _client(server, keys_dir, name, **kw) -> PSClient:
    return PSClient(
        server.endpoint, timeout=5, keys=keyfiles.load_client_keys(keys_dir, name), **kw
    )


def test_worker_keys_train_only_operator_keys_stop_and_checkpoint(tmp_path):
    keys_dir = tmp_path / "keys"
    keyfiles.make_keys(keys_dir, clients=("alice", "bob", "teacher"), operators=("teacher",))
    keys = keyfiles.load_server_keys(keys_dir)
    assert len(keys.allowed) == 3 and len(keys.operators) == 1
    with running_server(keys=keys, checkpoint_path=tmp_path / "ckpt.npz") as server:
        for student in ("alice", "bob"):
            with _client(server, keys_dir, student, worker_id=student) as ps:
                assert ps.hello()["rank"] in (0, 1)
                for call in (ps.stop, ps.checkpoint):
                    with pytest.raises(ServerError) as refused:
                        call()
                    assert refused.value.code == "operator"
        with _client(server, keys_dir, "teacher") as teacher:
            assert not teacher.stats()["stopping"]  # the students' attempts changed nothing
            assert teacher.checkpoint() == str(tmp_path / "ckpt.npz")
            teacher.stop()
            assert teacher.stats()["stopping"]


def test_without_operators_nobody_may_stop_and_an_operator_only_key_is_allowed(tmp_path):
    keys_dir = tmp_path / "keys"
    keyfiles.make_keys(keys_dir, clients=("w",), operators=())
    with running_server(keys=keyfiles.load_server_keys(keys_dir)) as server:
        with _client(server, keys_dir, "w") as ps, pytest.raises(ServerError) as refused:
            ps.stop()
        assert refused.value.code == "operator"
    # A key only in operators/ (its allowed/ copy removed) is still allowed to connect.
    other = tmp_path / "other"
    keyfiles.make_keys(other, clients=("w", "op"), operators=("op",))
    (other / "allowed" / "op.key").unlink()
    keys = keyfiles.load_server_keys(other)
    assert keys.operators <= keys.allowed
    with running_server(keys=keys) as server, _client(server, other, "op") as op:
        op.stop()


def test_a_key_taken_out_of_allowed_cannot_send_at_all(tmp_path):
    keys_dir = tmp_path / "keys"
    keyfiles.make_keys(keys_dir, clients=("w", "banned"), operators=())
    (keys_dir / "allowed" / "banned.key").unlink()
    with running_server(keys=keyfiles.load_server_keys(keys_dir)) as server:
        banned = PSClient(server.endpoint, timeout=0.5, retries=0,
                          keys=keyfiles.load_client_keys(keys_dir, "banned"))  # fmt: skip
        with banned, pytest.raises(ServerUnavailable):
            banned.stats()
        with _client(server, keys_dir, "w") as ps:
            assert ps.stats()["workers"] == []


def test_damaged_and_incomplete_key_directories_are_one_line_errors(tmp_path):
    keys_dir = tmp_path / "keys"
    keyfiles.make_keys(keys_dir, clients=("w",), operators=())
    with pytest.raises(keyfiles.AuthError, match="key files already exist"):
        keyfiles.make_keys(keys_dir, clients=("w",), operators=())
    with pytest.raises(keyfiles.AuthError, match=r"operator names \['x'\] are not among"):
        keyfiles.make_keys(tmp_path / "new", clients=("w",), operators=("x",))
    assert not (tmp_path / "new" / "server.key").exists()  # refused before writing
    # A public key cut short: not a Z85 key of 40 characters.
    public = keys_dir / "w.key"
    text = public.read_text()
    key = text.split('public-key = "')[1].split('"')[0]
    public.write_text(text.replace(key, key[:-1]))
    with pytest.raises(keyfiles.AuthError, match="holds no Z85 public key"):
        keyfiles.load_pair(public)
    # A public key file where the server's secret one belongs.
    (keys_dir / "server.key_secret").write_text((keys_dir / "server.key").read_text())
    with pytest.raises(keyfiles.AuthError, match="holds no secret key"):
        keyfiles.load_server_keys(keys_dir)
    # No allowed key at all: nobody could ever join.
    empty = tmp_path / "empty"
    keyfiles.make_keys(empty, clients=("w",), operators=())
    (empty / "allowed" / "w.key").unlink()
    with pytest.raises(keyfiles.AuthError, match="no allowed client keys"):
        keyfiles.load_server_keys(empty)
