"""The overflow check at its boundary, in float32 with momentum: no update writes a
non-finite value (weights, the server's velocity, a rule's own state).

Each case pushes a value just under what overflows (applied, everything finite) and one
just over it (refused `nonfinite`, nothing changed), then a small push, applied: the
server still serves. The boundaries are float32's own, found with np.nextafter.
"""

import numpy as np
import pytest
from test_server_support import RawPeer, running_server, send_then_fence

import minips
from minips.nn.zoo import build_model
from minips.ops.overflow import OverflowCheck
from minips.ops.rule_state import rule_state
from minips.protocol import wire
from minips.protocol.wire import ProtocolError
from minips.rules import RULES, make_rule
from minips.run.build import make_server
from minips.run.config import RunConfig
from minips.state.store import SGD, ParameterStore

F32 = np.float32
BIG = F32(3e38)


def largest_finite_sum(a: np.float32) -> np.float32:
    """The largest float32 x with a + x finite in float32 (a > 0)."""
    x = np.finfo(np.float32).max - a  # exact in float64, then search around its float32
    x = F32(x)
    with np.errstate(over="ignore"):
        while np.isfinite(a + np.nextafter(x, F32(np.inf))):
            x = np.nextafter(x, F32(np.inf))
        while not np.isfinite(a + x):
            x = np.nextafter(x, F32(0))
    return x


def one_param(value: float = 0.0) -> dict[str, np.ndarray]:
    return {"b": np.full(4, value, np.float32)}


def hello(peer: RawPeer, worker: str = "w") -> None:
    assert peer.request({"op": "hello", "worker": worker}).op == "hello"


def push(peer: RawPeer, seq: int, value, worker: str = "w", name: str = "b", size: int = 4):
    header = {"op": "push", "worker": worker, "seq": seq, "base": 0}
    reply = peer.request(header, {name: np.full(size, value, np.float32)})
    return "applied" if reply.op == "push" and reply.header["applied"] else reply.header.get("code")


def written(server) -> dict[str, np.ndarray]:
    """Every array the server's updates write: weights, velocity, the rule's own state."""
    arrays = {f"param/{n}": a for n, a in server.store.params.items()}
    arrays.update({f"velocity/{n}": a for n, a in server.store.optimizer.velocity.items()})
    arrays.update({f"rule/{k}": np.asarray(a) for k, a in rule_state(server.rule).items()})
    return arrays


def everything(server) -> dict[str, bytes]:
    return {key: array.tobytes() for key, array in written(server).items()}


def all_finite(server) -> bool:
    floats = [a for a in written(server).values() if a.dtype.kind == "f"]
    return all(np.isfinite(a).all() for a in floats)


def test_the_issues_case_two_finite_3e38_pushes_against_a_default_server():
    # The default rule (dana-gap, momentum 0.9 per worker) and lr 0.01 on LeNet-5: the
    # second 3e38 overflowed the worker's momentum, and with it every parameter.
    params = {n: np.array(p, np.float32) for n, p in build_model("lenet5").params.items()}
    with running_server(rule="dana-gap", params=params, lr=0.01) as server:
        with RawPeer(server.endpoint) as peer:
            hello(peer)
            for seq in range(2):
                grads = {n: np.full(p.shape, 3e38, np.float32) for n, p in params.items()}
                peer.request({"op": "push", "worker": "w", "seq": seq, "base": 0}, grads)
            assert all_finite(server)
            small = {n: np.full(p.shape, 1e-3, np.float32) for n, p in params.items()}
            reply = peer.request({"op": "push", "worker": "w", "seq": 2, "base": 0}, small)
            assert reply.op == "push" and reply.header["applied"]
    assert all(np.isfinite(p).all() for p in params.values())


def test_dana_momentum_just_under_and_just_over_the_overflow():
    # v_i = 3e38 after the first push; then v_i' = 0.9 v_i + g overflows float32 for g
    # one float past `edge`, while w - lr v_i' (lr 0.01) stays far from overflowing.
    edge = largest_finite_sum(F32(0.9) * BIG)
    with running_server(rule="dana", params=one_param(), lr=0.01) as server:
        with RawPeer(server.endpoint) as peer:
            hello(peer)
            assert push(peer, 0, BIG) == "applied"
            before = everything(server)
            assert push(peer, 1, np.nextafter(edge, F32(np.inf))) == "nonfinite"
            assert everything(server) == before  # weights, v_i, sum_j v_j untouched
            assert push(peer, 2, edge) == "applied"
            assert all_finite(server)
            assert server.rule._velocity["w"]["b"][0] == F32(0.9) * BIG + edge
            assert push(peer, 3, -1e-3) == "applied"  # still serving


def test_server_momentum_with_weight_decay_just_under_and_just_over():
    # A small gradient whose decayed step g + wd w overflows the server's velocity
    # m v + g + wd w: the norm bound (||w|| + lr * step < 1e38) passes it, the velocity
    # does not. w0 = 4e37, wd 5, lr 0.01, m 0.9; the first push sets v = 1e38 + 2e38.
    params = one_param(4e37)
    with running_server(params=params, lr=0.01, momentum=0.9, weight_decay=5.0) as server:
        with RawPeer(server.endpoint) as peer:
            hello(peer)
            assert push(peer, 0, 1e38) == "applied"
            w, v = server.store.params["b"][0], server.store.optimizer.velocity["b"][0]
            decayed = F32(5.0) * w
            # the largest g with fl(0.9 v) + fl(g + 5 w) finite, found from below
            with np.errstate(over="ignore"):
                g = largest_finite_sum(F32(0.9) * v) - decayed
                while not np.isfinite(F32(0.9) * v + (g + decayed)):
                    g = np.nextafter(g, F32(-np.inf))
                over = g
                while np.isfinite(F32(0.9) * v + (over + decayed)):
                    over = np.nextafter(over, F32(np.inf))
            before = everything(server)
            assert push(peer, 1, over) == "nonfinite"
            assert everything(server) == before
            assert push(peer, 2, g) == "applied"
            assert all_finite(server)
            # v is near float32's largest now: only a gradient that cancels the decay
            # (g = -wd w) is applied; the server still serves it.
            assert push(peer, 3, -F32(5.0) * server.store.params["b"][0]) == "applied"
            assert push(peer, 4, 0.0) == "nonfinite" and all_finite(server)


@pytest.mark.parametrize("rule", ["asgd", "dasgd", "dcasgd", "ssp", "gap", "dana", "dana-gap"])
def test_huge_finite_pushes_never_make_anything_non_finite(rule):
    # Each push is applied or refused `nonfinite`; the model, the velocity and the rule's
    # state stay finite; a small push is applied after.
    momentum = 0.0 if rule.startswith("dana") else 0.9
    with running_server(rule=rule, params=one_param(), lr=0.01, momentum=momentum) as server:
        with RawPeer(server.endpoint) as peer:
            hello(peer)
            for seq, value in enumerate([1e19, 3e38, 3e38, -3e38, 3.4e38, 3.4e38, 1e30]):
                before = everything(server)
                answer = push(peer, seq, value)
                assert answer in ("applied", "nonfinite")
                if answer == "nonfinite":
                    assert everything(server) == before
                assert all_finite(server)
            assert push(peer, 10, 1e-3) == "applied"


def test_an_ssgd_round_whose_mean_overflows_is_refused_and_the_next_is_served():
    # Each push alone is safe (w - lr 3e38), but the round's float32 sum 3e38 + 3e38 is
    # inf: the round is not written and both pushes are answered `nonfinite`.
    with running_server(rule="ssgd", params=one_param(), lr=0.01, world_size=2) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            hello(a, "a")
            hello(b, "b")
            before = everything(server)
            header = {"op": "push", "seq": 0, "base": 0}
            a.send(_encode({**header, "worker": "a"}, BIG))
            b.send(_encode({**header, "worker": "b"}, BIG))
            replies = [a.recv(), b.recv()]
            assert [(r.op, r.header.get("code")) for r in replies] == [("error", "nonfinite")] * 2
            assert everything(server) == before and server.store.version == 0
            a.send(_encode({"op": "push", "seq": 1, "base": 0, "worker": "a"}, BIG))
            b.send(_encode({"op": "push", "seq": 1, "base": 0, "worker": "b"}, F32(1.0)))
            assert [r.header["applied"] for r in (a.recv(), b.recv())] == [True, True]
            assert all_finite(server) and server.store.version == 1
            # a retry of a refused push gets the refusal again, and is not applied
            a.send(_encode({**header, "worker": "a"}, BIG))
            assert a.recv().header.get("code") == "nonfinite"
            assert server.store.version == 1


def _encode(header, value):
    return wire.encode(header, {"b": np.full(4, value, np.float32)})


def test_the_velocity_bound_is_checked_where_the_weights_bound_passes():
    # lr 1e-9, momentum 0.9: after a first push of 3e38 the carried bounds are ||w|| =
    # 3e29 and ||v|| = 3e38 (float64: no pass over the arrays). The weights' bound for a
    # second push g, ||w|| + lr (0.9 ||v|| + ||g||), is far below float32's range, but
    # v' = 0.9 v + g overflows one float32 past `edge`: decided exactly, at the boundary.
    params = {"w": np.zeros(1, np.float32)}
    store = ParameterStore(params, SGD(params, lr=1e-9, momentum=0.9))
    check = OverflowCheck(store)
    first = np.full(1, BIG, np.float32)
    check.check({"w": first}, {"w": float(BIG) ** 2})
    steps = [("w", first, 1.0)]
    assert check.refused(steps) is None
    store.write(steps)
    check.carry(steps)
    before = (params["w"].copy(), store.optimizer.velocity["w"].copy())
    edge = largest_finite_sum(F32(0.9) * BIG)
    over = np.full(1, np.nextafter(edge, F32(np.inf)), np.float32)
    with pytest.raises(ProtocolError) as refused:
        check.check({"w": over}, {"w": float(over[0]) ** 2})  # the wire's ||g||^2
    assert refused.value.code == "nonfinite"
    assert check.refused([("w", over, 1.0)]) == "w"
    np.testing.assert_array_equal(params["w"], before[0])
    np.testing.assert_array_equal(store.optimizer.velocity["w"], before[1])
    under = np.full(1, edge, np.float32)
    check.check({"w": under}, {"w": float(edge) ** 2})
    assert check.refused([("w", under, 1.0)]) is None
    store.write([("w", under, 1.0)])
    assert np.isfinite(store.optimizer.velocity["w"]).all()


@pytest.mark.parametrize(
    ("momentum", "weight_decay", "scale", "plain"),
    [(0.0, 0.0, 1.0, False), (0.9, 0.0, 1.0, False), (0.9, 1e-4, 0.3, False),
     (0.0, 1e-4, 0.5, False), (0.9, 1e-4, 0.7, True)],
)  # fmt: skip
def test_preview_is_the_step_bit_for_bit(momentum, weight_decay, scale, plain):
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal(50).astype(np.float32)}
    opt = SGD(params, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    if plain:
        opt.plain_for({"w": momentum})
    for _ in range(3):
        grad = rng.standard_normal(50).astype(np.float32)
        weight, velocity = opt.preview("w", grad, scale)
        before = params["w"].copy()
        out = np.empty_like(before)
        opt.step_one("w", grad, scale, out=out)
        np.testing.assert_array_equal(params["w"], before)  # preview and out: no change
        np.testing.assert_array_equal(weight, out)
        if velocity is not None:
            np.testing.assert_array_equal(velocity, opt.velocity["w"])
        params["w"] = out


@pytest.mark.parametrize("rule", ["gap", "dana-gap"])
def test_a_move_whose_square_gap_keeps_would_overflow_is_refused_at_its_boundary(rule):
    # Gap-Aware keeps the running mean square of each update's move: a move of 1e19 or
    # more squares past float32's range. lr 1 from w = 0: the move is the gradient.
    under = F32(1e19)  # 9.99999980e18, the float32 just below 1e19
    over = np.nextafter(under, F32(np.inf))
    with running_server(rule=rule, params=one_param(), lr=1.0) as server:
        with RawPeer(server.endpoint) as peer:
            hello(peer)
            before = everything(server)
            assert push(peer, 0, over) == "nonfinite"
            assert everything(server) == before
            assert push(peer, 1, under) == "applied"
            assert all_finite(server)
            assert push(peer, 2, -1.0) == "applied"
            assert all_finite(server)


@pytest.mark.parametrize("name", sorted(RULES))
def test_an_assembled_server_checks_what_every_rule_keeps(name):
    # A rule that keeps its own state (DANA's velocities, DC-ASGD's compensation) checks
    # it only through the `finite` its server's operations set: the assembled servers
    # (minips.ParameterServer, a run's) must set it, to their own overflow check.
    params = one_param()
    public = minips.ParameterServer(params, make_rule(name), SGD(params, lr=0.01))
    run = make_server(RunConfig(model="lenet5", rule=name, bind="tcp://127.0.0.1:*"))
    try:
        for server in (public, run):
            assert server.rule.finite is server.ops.overflow
            assert server.ops.overflow.max_move == server.rule.max_move
    finally:
        public.close()
        run.close()


def test_dana_without_its_finite_check_would_let_the_overflow_through():
    # The seam is what keeps DANA's own state finite: against a DANA whose `finite` is
    # unset, the server still refuses to write the weights, but v_i' = 0.9 v_i + g is kept
    # as inf (the server's own check sees only g).
    params = one_param()
    with running_server(rule="dana", params=params, lr=0.01) as server:
        with RawPeer(server.endpoint) as peer:
            hello(peer)
            assert push(peer, 0, BIG) == "applied"
            server.rule.finite = None
            assert push(peer, 1, BIG) == "nonfinite"
            assert not all_finite(server)


def test_the_carried_bound_grows_with_every_update_until_the_exact_check_refuses():
    # A gradient of -1e18 (its square finite in float32) times lr 5e19 moves w by 5e37 a
    # push: only the bound carried from version to version (float64) sees w approach
    # float32's largest. Six pushes are applied (w = 3e38); the seventh would make w
    # infinite and is refused, before and after the write.
    params = {"b": np.zeros(1, np.float32)}
    store = ParameterStore(params, SGD(params, lr=5e19))
    check = OverflowCheck(store)
    grad = np.full(1, -1e18, np.float32)
    answers = []
    for _ in range(8):
        steps = [("b", grad, 1.0)]
        try:
            check.check({"b": grad}, {"b": 1e36})  # the wire's ||g||^2
        except ProtocolError as exc:
            answers.append(exc.code)
            assert check.refused(steps) == "b"
            continue
        assert check.refused(steps) is None
        store.write(steps)
        check.carry(steps)
        answers.append("applied")
    assert answers == ["applied"] * 6 + ["nonfinite"] * 2
    assert np.isfinite(params["b"]).all() and params["b"][0] > F32(2.9e38)


def test_an_ssgd_rounds_step_is_measured_not_taken_for_the_last_pushs():
    # Three pushes, the last one small: the round's sum 3e38 + 3e38 + 1 is inf in float32.
    # The norm the wire measured for the small push (the last checked) is not the step's.
    with running_server(rule="ssgd", params=one_param(), lr=0.01, world_size=3) as server:
        peers = [RawPeer(server.endpoint) for _ in range(3)]
        try:
            for name, peer in zip("abc", peers, strict=True):
                hello(peer, name)
            header = {"op": "push", "seq": 0, "base": 0}
            for name, peer in zip("ab", peers[:2], strict=True):  # held, in this order
                assert send_then_fence(peer, {**header, "worker": name}, one_param(BIG)) is None
            peers[2].send(_encode({**header, "worker": "c"}, F32(1.0)))
            replies = [peer.recv() for peer in peers]
        finally:
            for peer in peers:
                peer.close()
        assert all_finite(server)
    assert [r.header.get("code") for r in replies] == ["nonfinite"] * 3
