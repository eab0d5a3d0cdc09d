"""Codecs: every one round-trips through the wire; top-k loses nothing; sf is exact."""

import math

import numpy as np
import pytest

from minips.errors import ConfigError
from minips.guard import wire_checks
from minips.nn import Sequential, softmax_cross_entropy
from minips.nn.layers import Dense, ReLU
from minips.protocol import wire
from minips.protocol.wire import ProtocolError, WirePart
from minips.state.store import SGD
from minips.transmission import codecs
from minips.transmission.codecs import Encoder, Factors, TopK, decode_gradients, top_k_indices

PUSH = {"op": "push", "worker": "w", "seq": 0, "base": 0}


def _through_wire(parts):
    """Encode, deliver as plain bytes, decode, decode the codecs: what the server will get."""
    frames = wire.encode_parts(PUSH, parts)
    return decode_gradients(wire_checks.decode_request([bytes(f) for f in frames]))


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def _dense_layer_batch(batch=64, n_in=80, n_out=50, seed=0):
    """A real Dense -> ReLU -> Dense step: (the first layer, its weight gradient)."""
    rng = np.random.default_rng(seed)
    fc1, fc2 = Dense(n_in, n_out, rng=rng), Dense(n_out, 10, rng=rng)
    model = Sequential([("fc1", fc1), ("relu", ReLU()), ("fc2", fc2)])
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    _, dlogits = softmax_cross_entropy(model.forward(x), rng.integers(0, 10, batch))
    model.backward(dlogits)
    return fc1, fc1.grads["w"].copy()


def test_registry_matches_the_wire_table():
    assert set(codecs.CODEC_CLASSES) == set(wire.CODECS) - wire.PULL_ONLY_CODECS
    for name, cls in codecs.CODEC_CLASSES.items():
        assert cls.name == name and cls.part_names() == tuple(wire.CODECS[name])


@pytest.mark.parametrize(
    "spec, tolerance",
    [("dense", 0), ("fp16", 2**-11), ({"codec": "topk", "ratio": 1.0}, 0)],
)
def test_lossless_or_rounding_only_codecs_round_trip(spec, tolerance):
    grad = np.random.default_rng(1).standard_normal((30, 20)).astype(np.float32)
    grads, extras = _through_wire(Encoder().encode({"g": grad}, {"g": spec}))
    assert extras == {} and grads["g"].dtype == np.float32 and grads["g"].shape == grad.shape
    np.testing.assert_allclose(grads["g"], grad, rtol=tolerance, atol=0)


def test_dense_and_fp16_messages_are_byte_for_byte_as_before_codecs():
    grads = {"fc.w": np.ones((2, 3), np.float32), "fc.b": np.arange(3, dtype=np.float32)}
    specs = {"fc.b": "fp16"}
    old = wire.encode(
        PUSH, {"fc.w": grads["fc.w"], "fc.b": grads["fc.b"].astype(np.float16)}, specs
    )
    new = wire.encode_parts(PUSH, Encoder().encode(grads, specs))
    assert [bytes(f) for f in new] == [bytes(f) for f in old]


def test_sf_rebuilds_the_dense_gradient_of_a_real_layer():
    fc1, dense = _dense_layer_batch()
    x, dy = fc1.sufficient_factors()
    assert x.shape == (64, 80) and dy.shape == (64, 50)
    grads, _ = _through_wire(Encoder().encode({"fc1.w": Factors(x, dy)}, {"fc1.w": "sf"}))
    assert grads["fc1.w"].shape == dense.shape
    assert _rel(grads["fc1.w"], dense) < 1e-5
    # float16 factors: about 2^-11 relative per factor, so a few 1e-3 on the product.
    half = {"fc1.w": {"codec": "sf", "dtype": "float16"}}
    grads, _ = _through_wire(Encoder().encode({"fc1.w": Factors(x, dy)}, half))
    assert _rel(grads["fc1.w"], dense) < 5e-3


def test_sf_sends_fewer_bytes_than_dense_when_the_batch_is_small():
    x, dy = np.ones((64, 800), np.float32), np.ones((64, 500), np.float32)
    encoder = Encoder()
    encoder.encode({"fc1.w": Factors(x, dy)}, {"fc1.w": "sf"})
    assert encoder.bytes_sent == {"fc1.w": 64 * (800 + 500) * 4}


def test_sf_needs_factors():
    with pytest.raises(ConfigError):
        Encoder().encode({"w": np.zeros((2, 3), np.float32)}, {"w": "sf"})


def test_topk_sends_the_k_largest_magnitudes():
    rng = np.random.default_rng(2)
    grad = rng.standard_normal((400, 100)).astype(np.float32)  # 40,000 > 4 * sample size
    topk = TopK(ratio=0.01)
    grads, _ = _through_wire(topk.encode("g", grad))
    sent = np.flatnonzero(grads["g"])
    expected = np.argsort(-np.abs(grad).reshape(-1))[:400]
    np.testing.assert_array_equal(sent, np.sort(expected))
    np.testing.assert_array_equal(grads["g"].reshape(-1)[sent], grad.reshape(-1)[sent])


@pytest.mark.parametrize("size, k", [(100_000, 1000), (100_000, 10), (100_000, 30_000), (50, 7)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_k_indices_is_exact(size, k, seed):
    rng = np.random.default_rng(seed)
    magnitude = rng.permutation(size).astype(np.float32)  # distinct: one right answer
    got = top_k_indices(magnitude, k, np.random.default_rng(seed))
    assert got.size == k and np.all(np.diff(got) > 0)
    np.testing.assert_array_equal(np.sort(magnitude[got]), np.arange(size - k, size))


@pytest.mark.parametrize("zeros", [0.98, 0.5])
def test_top_k_indices_is_exact_when_most_entries_tie_at_zero(zeros):
    rng = np.random.default_rng(8)
    magnitude = rng.permutation(100_000).astype(np.float32) + 1
    magnitude[rng.random(100_000) < zeros] = 0.0  # most of an early fc1 gradient is 0
    for k in (1000, int((magnitude > 0).sum()) + 500):  # fewer nonzeros than k, then more
        got = top_k_indices(magnitude, k, np.random.default_rng(0))
        assert got.size == k and np.all(np.diff(got) > 0)
        kth = np.sort(magnitude)[-k]
        assert np.all(magnitude[got] >= kth) and np.all(np.delete(magnitude, got) <= kth)


def test_topk_error_feedback_loses_nothing_over_many_steps():
    # Small integers: float32 sums are exact, so "nothing lost" can be checked with ==.
    rng = np.random.default_rng(3)
    topk, total_sent, total_grad = TopK(ratio=0.05, warmup=3), 0, 0
    for _ in range(25):
        grad = rng.integers(-50, 50, size=(40, 30)).astype(np.float32)
        grads, _ = _through_wire(topk.encode("g", grad))
        total_sent = total_sent + grads["g"]
        total_grad = total_grad + grad
    np.testing.assert_array_equal(total_sent + topk.residual, total_grad)
    assert np.any(topk.residual != 0)  # something was really held back


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_topk_each_step_sent_plus_residual_is_residual_plus_gradient_exactly(dtype):
    rng = np.random.default_rng(4)
    topk = TopK(ratio=0.02, dtype=dtype)
    previous = np.zeros((50, 40), np.float32)
    for _ in range(5):
        grad = (rng.standard_normal((50, 40)) * 1e-3).astype(np.float32)
        expected = previous + grad  # one float32 rounding, as the encoder does it
        grads, _ = _through_wire(topk.encode("g", grad))
        np.testing.assert_array_equal(grads["g"] + topk.residual, expected)
        previous = topk.residual.copy()


def test_topk_warmup_density_decays_to_the_ratio():
    topk = TopK(ratio=0.01, warmup=3)
    sizes = [topk.encode("g", np.ones(10_000, np.float32))[0].array.size for _ in range(5)]
    expected = [math.ceil(0.01 ** (t / 4) * 10_000) for t in (1, 2, 3)] + [100, 100]
    assert sizes == expected


def test_topk_momentum_correction_sent_dense_is_momentum_sgd_applied_plainly():
    """ratio 1: each step sends the velocity u = m u + g itself; applied without momentum
    it moves the weights bit for bit as the server's momentum SGD moves them on g."""
    rng = np.random.default_rng(6)
    grads = [(rng.standard_normal((20, 10)) * 1e-2).astype(np.float32) for _ in range(6)]
    w0 = rng.standard_normal((20, 10)).astype(np.float32)
    dense = {"p": w0.copy()}
    server = SGD(dense, lr=0.1, momentum=0.9)
    corrected = {"p": w0.copy()}
    plain = SGD(corrected, lr=0.1, momentum=0.9)
    plain.plain_for({"p": 0.9})
    topk = TopK(ratio=1.0, momentum=0.9)
    for grad in grads:
        server.step_one("p", grad)
        sent, _ = _through_wire(topk.encode("p", grad))
        plain.step_one("p", sent["p"])
    np.testing.assert_array_equal(corrected["p"], dense["p"])
    assert "p" not in plain.velocity  # the server kept no velocity of its own


def test_topk_momentum_correction_accumulates_the_velocity_and_loses_nothing():
    rng = np.random.default_rng(7)
    topk, velocity = TopK(ratio=0.05, momentum=0.5), np.zeros((40, 30), np.float32)
    total_sent, total_velocity = 0, 0
    for _ in range(8):  # integers times powers of 1/2: every sum below is exact in float32
        grad = rng.integers(-50, 50, size=(40, 30)).astype(np.float32)
        velocity = np.float32(0.5) * velocity + grad
        grads, _ = _through_wire(topk.encode("g", grad))
        total_sent, total_velocity = total_sent + grads["g"], total_velocity + velocity
    np.testing.assert_array_equal(topk.velocity, velocity)
    np.testing.assert_array_equal(total_sent + topk.residual, total_velocity)


@pytest.mark.parametrize("momentum", [-0.1, 1.0, "0.9"])
def test_topk_momentum_must_be_in_0_1(momentum):
    with pytest.raises(ConfigError, match="momentum must be in"):
        TopK(ratio=0.01, momentum=momentum)


def test_lowrank_rebuilds_a_rank_one_gradient_and_feeds_back_the_rest():
    rng = np.random.default_rng(5)
    u, v = rng.standard_normal(30), rng.standard_normal(8 * 3 * 3)
    grad = np.outer(u, v).reshape(30, 8, 3, 3).astype(np.float32)  # a conv weight's shape
    encoder = Encoder()
    grads, _ = _through_wire(encoder.encode({"c": grad}, {"c": {"codec": "lowrank", "rank": 2}}))
    assert grads["c"].shape == grad.shape
    assert _rel(grads["c"], grad) < 1e-5
    # A full-rank gradient is not sent whole, but sent + residual is what it was.
    lowrank = codecs.LowRank(rank=2)
    noise = rng.standard_normal((20, 10)).astype(np.float32)
    grads, _ = _through_wire(lowrank.encode("n", noise))
    assert _rel(grads["n"], noise) > 0.1
    np.testing.assert_allclose(grads["n"] + lowrank.residual, noise, atol=1e-5)


def test_lowrank_clips_the_rank_to_the_smaller_side_of_the_matrix():
    """rank 4 of a (10, 2) gradient (and of a (2, 10) one) sends rank-2 factors, exactly."""
    grad = np.random.default_rng(6).standard_normal((10, 2)).astype(np.float32)
    for matrix in (grad, np.ascontiguousarray(grad.T)):
        p, q = codecs.LowRank(rank=4).encode("w", matrix)
        assert p.array.shape == (matrix.shape[0], 2) and q.array.shape == (matrix.shape[1], 2)
        grads, _ = _through_wire([p, q])
        np.testing.assert_allclose(grads["w"], matrix, atol=1e-5)


def test_encoder_keeps_state_per_parameter_and_resets_on_a_new_spec():
    encoder = Encoder()
    spec = {"codec": "topk", "ratio": 0.5}
    grad = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    encoder.encode({"a": grad, "b": grad}, {"a": spec, "b": spec})
    assert encoder.codec("a", spec) is not encoder.codec("b", spec)
    np.testing.assert_array_equal(encoder.codec("a", spec).residual, [1, 2, 0, 0])
    fresh = encoder.codec("a", {"codec": "topk", "ratio": 0.25})
    assert fresh.residual is None
    assert encoder.codec("b", dict(spec)).residual is not None  # an equal spec: the same codec
    spec["ratio"] = 0.25  # the caller's dict changed in place: a new spec, a new codec
    assert encoder.codec("b", spec).residual is None
    assert encoder.bytes_sent == {"a": 16, "b": 16}


@pytest.mark.parametrize(
    "spec",
    [{"codec": "topk", "ratio": 0}, {"codec": "topk", "ratio": 2},
     {"codec": "sf", "dtype": "float64"}, {"codec": "lowrank", "rank": 0}],
)  # fmt: skip
def test_bad_option_values_are_config_errors(spec):
    # A spec's form and option names are the run's to check (tests/run/test_plan_checks.py);
    # each codec checks its options' values.
    with pytest.raises(ConfigError):
        codecs.make_codec(spec)


def test_fp16_overflow_is_refused_before_the_residual_changes():
    topk = TopK(ratio=0.5, dtype="float16")
    with pytest.raises(ProtocolError) as info:
        topk.encode("g", np.array([1e6, 1.0], np.float32))
    assert info.value.code == "nonfinite"


def test_extras_pass_through_and_gradients_keep_message_order():
    parts = [
        WirePart("b", np.ones(2, np.float32)),
        WirePart("extra/sample/b", np.arange(3, dtype=np.float32)),
        WirePart("a", np.ones(2, np.float16), "fp16"),
    ]
    grads, extras = _through_wire(parts)
    assert list(grads) == ["b", "a"] and list(extras) == ["extra/sample/b"]
    np.testing.assert_array_equal(extras["extra/sample/b"], [0, 1, 2])


def test_an_extra_sent_in_fp16_arrives_widened_to_float32():
    parts = [WirePart("extra/sample/b", np.array([0.5, -2.0, 3.0], np.float16), "fp16")]
    _, extras = _through_wire(parts)
    assert extras["extra/sample/b"].dtype == np.float32
    np.testing.assert_array_equal(extras["extra/sample/b"], [0.5, -2.0, 3.0])


# ----------------------------------------------------------------------- decode errors

_OF = (2, 3)


def _topk(indices, values, of=_OF):
    return [
        WirePart("w", np.array(indices, np.int32), "topk", "indices", of),
        WirePart("w", np.array(values, np.float32), "topk", "values", of),
    ]


def _sf(x_shape, dy_shape, of=_OF):
    return [
        WirePart("w", np.ones(x_shape, np.float32), "sf", "x", of),
        WirePart("w", np.ones(dy_shape, np.float32), "sf", "dy", of),
    ]


def _lowrank(p_shape, q_shape, of=_OF):
    return [
        WirePart("w", np.ones(p_shape, np.float32), "lowrank", "p", of),
        WirePart("w", np.ones(q_shape, np.float32), "lowrank", "q", of),
    ]


@pytest.mark.parametrize(
    "parts, code",
    [
        (_topk([1, 6], [1, 1]), "bad_field"),  # index 6 outside 2 x 3
        (_topk([-1, 2], [1, 1]), "bad_field"),
        (_topk([3, 3], [1, 1]), "bad_field"),  # duplicate
        (_topk([4, 2], [1, 1]), "bad_field"),  # not ascending
        (_topk([1, 2], [1, 1, 1]), "shape"),
        (_topk([1, 2, 4], [1, 1]), "shape"),  # more indices than values
        (_topk([1, 2], [1]), "shape"),  # one value is not broadcast to every index
        (_topk([[1, 2]], [[1, 1]]), "shape"),  # parts must be 1-d
        (_sf((4, 2), (5, 3)), "shape"),  # rows differ
        (_sf((4, 2), (4, 3), of=(3, 2)), "shape"),  # of is not (in, out)
        (_sf((4,), (4, 3)), "shape"),
        (_lowrank((2, 1), (3, 2)), "shape"),  # ranks differ
        (_lowrank((2, 1), (4, 1)), "shape"),
        (_lowrank((6, 1), (1, 1), of=(6,)), "shape"),  # a vector has no rows and columns
        ([WirePart("w", np.ones(2, np.int32))], "dtype"),  # an int gradient
    ],
)
def test_malformed_payloads_are_protocol_errors(parts, code):
    with pytest.raises(ProtocolError) as info:
        _through_wire(parts)
    assert info.value.code == code


@pytest.mark.parametrize("codec, names", [("sf", ("x", "dy")), ("lowrank", ("p", "q"))])
def test_factors_whose_product_overflows_are_nonfinite(codec, names):
    big = np.full((2, 2), 3e38, np.float32)
    parts = [WirePart("w", big, codec, part, (2, 2)) for part in names]
    with pytest.raises(ProtocolError) as info:
        _through_wire(parts)
    assert info.value.code == "nonfinite"


def test_empty_topk_and_empty_batch_are_zero_gradients():
    grads, _ = _through_wire(_topk([], []))
    np.testing.assert_array_equal(grads["w"], np.zeros(_OF))
    grads, _ = _through_wire(_sf((0, 2), (0, 3)))
    np.testing.assert_array_equal(grads["w"], np.zeros(_OF))
