"""The server decodes every codec before checking a gradient against its parameter."""

import numpy as np
from test_server_support import running_server

from minips.transmission.codecs import Factors
from minips.worker.client import PSClient, ServerError


def _params():
    rng = np.random.default_rng(3)
    return {
        "fc.w": rng.standard_normal((6, 5)).astype(np.float32),
        "fc.b": rng.standard_normal(5).astype(np.float32),
    }


def test_sufficient_factors_are_applied_as_their_dense_product():
    params = _params()
    before = params["fc.w"].copy()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 6)).astype(np.float32)  # (B, in)
    dy = rng.standard_normal((3, 5)).astype(np.float32)  # (B, out)
    with running_server(params=params, lr=1.0) as server, PSClient(server.endpoint) as ps:
        ps.hello()
        reply = ps.push({"fc.w": Factors(x, dy)}, base=0, codecs={"fc.w": "sf"})
    assert reply.applied
    np.testing.assert_allclose(params["fc.w"], before - x.T @ dy, rtol=1e-5, atol=1e-6)


def test_topk_is_applied_as_a_sparse_gradient():
    params = _params()
    before = params["fc.b"].copy()
    grad = np.array([0.1, -5.0, 0.2, 3.0, 0.0], np.float32)
    spec = {"codec": "topk", "ratio": 0.4}  # k = 2 of 5: the -5 and the 3
    with running_server(params=params, lr=1.0) as server, PSClient(server.endpoint) as ps:
        ps.hello()
        ps.push({"fc.b": grad}, base=0, codecs={"fc.b": spec})
    expected = before.copy()
    expected[[1, 3]] -= grad[[1, 3]]
    np.testing.assert_array_equal(params["fc.b"], expected)


def test_a_decoded_gradient_of_the_wrong_shape_is_refused_untouched():
    params = _params()
    before = {name: array.copy() for name, array in params.items()}
    x = np.ones((2, 4), np.float32)  # in = 4, but fc.w has 6 rows
    dy = np.ones((2, 5), np.float32)
    with running_server(params=params, lr=1.0) as server, PSClient(server.endpoint) as ps:
        ps.hello()
        try:
            ps.push({"fc.w": Factors(x, dy)}, base=0, codecs={"fc.w": "sf"})
        except ServerError as exc:
            assert exc.code == "shape"
        else:
            raise AssertionError("a (4, 5) gradient for a (6, 5) parameter was accepted")
        stats = ps.stats()
    assert stats["version"] == 0
    for name, array in params.items():
        np.testing.assert_array_equal(array, before[name])
