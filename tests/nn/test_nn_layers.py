"""Each layer against its loop oracle (classroom/exercise/naive.py) and centred differences."""

import numpy as np
import pytest

from minips.classroom.exercise.gradcheck import numerical_gradient, relative_error
from minips.classroom.exercise.naive import (
    conv2d_backward_naive,
    conv2d_forward_naive,
    maxpool_backward_naive,
    maxpool_forward_naive,
)
from minips.errors import ShapeError
from minips.nn import Conv2D, Dense, Dropout, Flatten, MaxPool2D, ReLU
from minips.nn.conv import batch_last

# (in_channels, out_channels, kernel, stride, padding, H, W)
CONV_CASES = [
    (1, 3, 5, 1, 0, 9, 9),
    (2, 4, 3, 1, 1, 7, 6),
    (3, 2, 3, 2, 1, 8, 9),
    (2, 3, 2, 2, 0, 6, 6),
    (3, 5, 1, 1, 0, 4, 5),
    (2, 2, 4, 3, 2, 7, 8),
]
# Memory orders an (N, C, H, W) batch can come in: layers must give the same numbers for
# each. "batch_last" is what conv and pool layers hand on; "channels_last" is neither.
MEMORY_ORDERS = {"c": (0, 1, 2, 3), "batch_last": (1, 2, 3, 0), "channels_last": (0, 2, 3, 1)}


def in_memory_order(x, order):
    """x (N, C, H, W) with the same shape and values, laid out in memory in `order`."""
    axes = MEMORY_ORDERS[order]
    stored = np.ascontiguousarray(x.transpose(axes))
    y = stored.transpose(np.argsort(axes))
    assert y.shape == x.shape and np.array_equal(y, x)
    return y


def make_conv(case, order, dtype=np.float64, seed=0):
    c_in, c_out, k, s, p, h, w = case
    rng = np.random.default_rng(seed)
    conv = Conv2D(c_in, c_out, k, stride=s, padding=p, rng=rng)
    conv.cast(dtype)
    conv.params["b"][:] = rng.standard_normal(c_out)
    x = rng.standard_normal((3, c_in, h, w)).astype(dtype)
    return conv, in_memory_order(x, order)


def check_layer_gradients(layer, x, seed=1, before_forward=lambda: None):
    """Compare backward with centred differences of L = sum(forward(x) * R), float64."""
    rng = np.random.default_rng(seed)
    before_forward()
    y = layer.forward(x)
    weights = rng.standard_normal(y.shape)  # R: makes every output matter differently

    def loss():
        before_forward()
        return float(np.sum(layer.forward(x) * weights))

    before_forward()
    layer.forward(x)
    dx = layer.backward(weights.copy())
    analytic = {name: g.copy() for name, g in layer.grads.items()}
    assert relative_error(dx, numerical_gradient(loss, x)) < 1e-5
    for name, param in layer.params.items():
        assert relative_error(analytic[name], numerical_gradient(loss, param)) < 1e-5, name


@pytest.mark.parametrize("order", MEMORY_ORDERS)
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_matches_naive_loops(case, order):
    conv, x = make_conv(case, order)
    stride, padding = conv.stride, conv.padding
    w, b = conv.params["w"], conv.params["b"]
    y = conv.forward(x)
    y_naive = conv2d_forward_naive(x, w, b, stride, padding)
    assert y.shape == y_naive.shape
    np.testing.assert_allclose(y, y_naive, rtol=1e-10, atol=1e-10)

    dy = in_memory_order(np.random.default_rng(2).standard_normal(y.shape), order)
    dx = conv.backward(dy)
    assert dx.shape == x.shape
    dx_naive, dw_naive, db_naive = conv2d_backward_naive(dy, x, w, stride, padding)
    np.testing.assert_allclose(dx, dx_naive, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(conv.grads["w"], dw_naive, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(conv.grads["b"], db_naive, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("order", ["c", "batch_last"])
@pytest.mark.parametrize("case", CONV_CASES[:3])
def test_conv_gradients_match_centred_differences(case, order):
    conv, x = make_conv(case, order)
    check_layer_gradients(conv, x)


def test_conv_float32_stays_float32_and_skips_input_grad():
    conv = Conv2D(1, 4, 3, rng=np.random.default_rng(0))
    conv.need_input_grad = False
    x = np.random.default_rng(1).standard_normal((2, 1, 6, 6)).astype(np.float32)
    y = conv.forward(x)
    assert y.dtype == np.float32 and y.shape == (2, 4, 4, 4)
    assert conv.backward(np.ones_like(y)) is None
    assert conv.grads["w"].dtype == np.float32
    np.testing.assert_allclose(conv.grads["b"], np.full(4, 2 * 16), rtol=1e-6)


def test_conv_hands_on_batch_last_arrays_that_the_next_conv_takes_without_a_copy():
    rng = np.random.default_rng(0)
    conv1, conv2 = Conv2D(1, 3, 3, rng=rng), Conv2D(3, 2, 3, rng=rng)
    y = conv1.forward(rng.standard_normal((4, 1, 9, 9)).astype(np.float32))  # (4, 3, 7, 7)
    assert np.shares_memory(batch_last(y), y)  # the (C, H, W, N) view is y's own memory
    dx = conv2.backward(rng.standard_normal(conv2.forward(y).shape).astype(np.float32))
    assert dx.shape == y.shape and np.shares_memory(batch_last(dx), dx)


def test_conv_training_forward_reuses_its_buffers_and_evaluation_leaves_the_cache():
    conv, x = make_conv(CONV_CASES[1], "c", dtype=np.float32)
    rng = np.random.default_rng(5)
    other = rng.standard_normal(x.shape).astype(np.float32)
    dy = rng.standard_normal(conv.forward(x).shape).astype(np.float32)
    conv.backward(dy)
    expected = {"dx": conv.backward(dy)} | {k: g.copy() for k, g in conv.grads.items()}
    cols, dcols = conv.cache.cols, conv.cache.dcols

    conv.forward(other)  # a training forward of another batch, then the first one again
    conv.forward(x)
    conv.forward(other, train=False)  # must not touch what backward reads
    got = {"dx": conv.backward(dy)} | conv.grads
    assert conv.cache.cols is cols and conv.cache.dcols is dcols  # no new work buffers
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)

    conv.forward(x[:2])  # another batch size gets buffers of its own
    assert conv.cache.cols is not cols and conv.cache.cols.shape[1] == cols.shape[1] * 2 // 3


# (in_channels, out_channels, kernel, stride, padding, H, W, pool block)
BLOCKED_CASES = [(1, 3, 5, 1, 0, 12, 10, 2), (2, 4, 3, 1, 1, 6, 9, 3), (3, 2, 3, 2, 1, 9, 9, 5)]


@pytest.mark.parametrize("dy_as_windows", [True, False])
@pytest.mark.parametrize("case", BLOCKED_CASES)
def test_conv_with_a_pool_block_hands_on_windows_of_the_same_numbers(case, dy_as_windows):
    conv, x = make_conv(case[:7], "batch_last")
    b = conv.pool_block = case[7]
    stride, padding = conv.stride, conv.padding
    w = conv.params["w"]
    y = conv.forward(x)
    n, o, ho, _, wo, _ = y.shape
    assert y.shape == (3, conv.out_channels, ho, b, wo, b)
    y_naive = conv2d_forward_naive(x, w, conv.params["b"], stride, padding)
    np.testing.assert_allclose(y.reshape(y_naive.shape), y_naive, rtol=1e-10, atol=1e-10)
    # Each window offset (u, v) is one contiguous block of (Ho/b, Wo/b, N) per channel.
    assert y[:, :, :, 1, :, 0].transpose(1, 2, 3, 0)[0].flags.c_contiguous

    dy = np.random.default_rng(2).standard_normal(y_naive.shape)
    dx = conv.backward(dy.reshape(y.shape) if dy_as_windows else dy)
    dx_naive, dw_naive, db_naive = conv2d_backward_naive(dy, x, w, stride, padding)
    np.testing.assert_allclose(dx, dx_naive, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(conv.grads["w"], dw_naive, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(conv.grads["b"], db_naive, rtol=1e-10, atol=1e-10)


def test_conv_pool_block_that_does_not_divide_the_output_gives_plain_output():
    conv, x = make_conv((1, 2, 3, 1, 0, 8, 8), "c")  # 6x6 output, block 4 does not divide it
    conv.pool_block = 4
    y = conv.forward(x)
    np.testing.assert_allclose(
        y, conv2d_forward_naive(x, conv.params["w"], conv.params["b"]), rtol=1e-10, atol=1e-10
    )


def test_conv_with_a_pool_block_gradients_match_centred_differences():
    conv, x = make_conv(BLOCKED_CASES[1][:7], "batch_last")
    conv.pool_block = BLOCKED_CASES[1][7]
    check_layer_gradients(conv, x)


@pytest.mark.parametrize("bad_shape", [(2, 2, 6, 6), (2, 1, 6), (2, 1, 2, 2)])
def test_conv_rejects_wrong_input(bad_shape):
    conv = Conv2D(1, 4, 3)
    with pytest.raises(ShapeError):
        conv.forward(np.zeros(bad_shape, dtype=np.float32))


# (size, stride, H, W)
POOL_CASES = [(2, 2, 8, 8), (2, 2, 7, 9), (3, 2, 9, 8), (3, 3, 9, 9), (2, 1, 5, 6)]


@pytest.mark.parametrize("order", MEMORY_ORDERS)
@pytest.mark.parametrize("case", POOL_CASES)
def test_maxpool_matches_naive_loops(case, order):
    size, stride, h, w = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, h, w))
    x[0, 1, :4, :4] = 0.5  # whole windows of ties: the first maximum takes the gradient
    x = in_memory_order(x, order)
    pool = MaxPool2D(size, stride)
    y = pool.forward(x)
    np.testing.assert_array_equal(y, maxpool_forward_naive(x, size, stride))
    dy = in_memory_order(rng.standard_normal(y.shape), order)
    dx = pool.backward(dy)
    np.testing.assert_allclose(dx, maxpool_backward_naive(dy, x, size, stride), rtol=1e-14)
    # Outputs keep the input's memory order: on batch-last input every view runs along N.
    assert np.argsort(y.strides).tolist() == np.argsort(x.strides).tolist()
    assert dx.strides == x.strides


@pytest.mark.parametrize("size", [2, 3])
def test_maxpool_takes_a_conv_windows_and_hands_dx_back_in_that_shape(size):
    rng = np.random.default_rng(4)
    conv = Conv2D(2, 3, 3, rng=rng)
    conv.cast(np.float64)
    conv.pool_block = size
    x = rng.standard_normal((2, 2, 3 * size + 2, 2 * size + 2))
    windows = conv.forward(x)  # (2, 3, 3, size, 2, size)
    plain = windows.reshape(2, 3, 3 * size, 2 * size)
    pool = MaxPool2D(size, size)
    y = pool.forward(windows)
    np.testing.assert_array_equal(y, maxpool_forward_naive(plain, size, size))
    dy = rng.standard_normal(y.shape)
    dx = pool.backward(dy)
    assert dx.shape == windows.shape and dx.strides == windows.strides
    np.testing.assert_array_equal(
        dx.reshape(plain.shape), maxpool_backward_naive(dy, plain, size, size)
    )


def test_maxpool_ties_route_gradient_to_the_first_maximum():
    # All-equal windows (ReLU zeros, flat image background) must not duplicate gradient.
    x = np.zeros((1, 1, 4, 4))
    pool = MaxPool2D(2, 2)
    pool.forward(x)
    dx = pool.backward(np.ones((1, 1, 2, 2)))
    assert dx.sum() == 4.0
    np.testing.assert_array_equal(dx, maxpool_backward_naive(np.ones((1, 1, 2, 2)), x))


@pytest.mark.parametrize("case", POOL_CASES[:3])
def test_maxpool_gradients_match_centred_differences(case):
    size, stride, h, w = case
    x = np.random.default_rng(3).standard_normal((2, 2, h, w))
    check_layer_gradients(MaxPool2D(size, stride), x)


def test_dense_gradients_and_forward():
    rng = np.random.default_rng(0)
    dense = Dense(7, 4, rng=rng)
    dense.cast(np.float64)
    dense.params["b"][:] = rng.standard_normal(4)
    x = rng.standard_normal((5, 7))
    np.testing.assert_allclose(
        dense.forward(x), x @ dense.params["w"] + dense.params["b"], rtol=1e-12
    )
    check_layer_gradients(dense, x)


def test_dense_rejects_wrong_features():
    with pytest.raises(ShapeError, match="7 input features"):
        Dense(7, 4).forward(np.zeros((5, 6), dtype=np.float32))


def test_relu_gradients():
    x = np.random.default_rng(0).standard_normal((4, 3, 5))
    x[np.abs(x) < 1e-3] = 0.5  # keep centred differences away from the kink
    relu = ReLU()
    np.testing.assert_array_equal(relu.forward(x), np.where(x > 0, x, 0))
    check_layer_gradients(relu, x)


@pytest.mark.parametrize("order", ["c", "batch_last"])
def test_flatten_round_trip(order):
    x = in_memory_order(np.random.default_rng(0).standard_normal((2, 3, 4, 5)), order)
    flat = Flatten()
    y = flat.forward(x)
    assert y.shape == (2, 60)
    np.testing.assert_array_equal(y[1], x[1].ravel())  # C order, whatever x's memory order
    dx = flat.backward(y)
    np.testing.assert_array_equal(dx, x)
    assert dx.strides == x.strides  # handed back in the memory order x came in
    check_layer_gradients(flat, x)


def test_dropout_scales_kept_units_and_is_identity_in_eval():
    x = np.ones((200, 50))
    drop = Dropout(0.3, seed=4)
    y = drop.forward(x)
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1 / 0.7)
    assert 0.65 < kept.mean() < 0.75
    dx = drop.backward(np.full_like(x, 2.0))
    np.testing.assert_allclose(dx, 2.0 * y)  # same mask as forward
    np.testing.assert_array_equal(drop.forward(x, train=False), x)


def test_dropout_gradients_with_fixed_mask():
    drop = Dropout(0.5, seed=0)
    x = np.random.default_rng(0).standard_normal((3, 8))

    def reseed():  # the same mask on every forward, so differences see one function
        drop.rng = np.random.default_rng(11)

    check_layer_gradients(drop, x, before_forward=reseed)


def test_backward_before_forward_is_a_clear_error():
    with pytest.raises(RuntimeError, match="without forward"):
        Dense(3, 2).backward(np.zeros((1, 2), dtype=np.float32))
