"""Sequential, the model zoo, softmax cross-entropy and whole-model gradients."""

import numpy as np
import pytest

from minips.classroom.exercise.gradcheck import numerical_gradient, relative_error
from minips.errors import ConfigError, DataError, ShapeError
from minips.nn import (
    MODEL_NAMES,
    Conv2D,
    Dense,
    Flatten,
    MaxPool2D,
    ReLU,
    Sequential,
    build_model,
    lenet5,
    mlp,
    softmax_cross_entropy,
)
from minips.nn.model import pool_blocks, run_order


def batch(n=4, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, 28, 28)).astype(dtype)  # (N, 1, 28, 28)
    y = rng.integers(0, 10, size=n)  # (N,)
    return x, y


def test_lenet5_structure_and_parameter_count():
    model = lenet5()
    assert model.n_params == 431_080
    assert list(model.layers) == [
        "conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten1", "fc1", "relu3", "fc2",
    ]  # fmt: skip
    info = model.layer_info()
    assert [(i.name, i.kind, i.n_params) for i in info] == [
        ("conv1", "conv", 520),
        ("conv2", "conv", 25_050),
        ("fc1", "fc", 400_500),
        ("fc2", "fc", 5_010),
    ]
    assert info[2].shapes == {"w": (800, 500), "b": (500,)}
    assert list(model.params) == [f"{i.name}.{p}" for i in info for p in ("w", "b")]
    assert all(a.dtype == np.float32 for a in model.params.values())
    x, _ = batch()
    logits = model.forward(x)
    assert logits.shape == (4, 10) and logits.dtype == np.float32


def test_params_and_grads_are_the_live_arrays():
    model = lenet5()
    model.params["fc2.b"][:] = 3.0
    assert np.all(model.layers["fc2"].params["b"] == 3.0)
    x, y = batch()
    grads_before = model.grads
    _, dlogits = softmax_cross_entropy(model.forward(x), y)
    model.backward(dlogits)
    assert all(grads_before[k] is v for k, v in model.grads.items())
    assert all(np.any(g != 0) for g in grads_before.values())


def test_seeds_make_models_reproducible():
    a, b, c = lenet5(seed=3), lenet5(seed=3), lenet5(seed=4)
    for key in a.params:
        np.testing.assert_array_equal(a.params[key], b.params[key])
    assert not np.array_equal(a.params["conv1.w"], c.params["conv1.w"])


def test_lenet5_gradients_match_centred_differences_float64():
    model = lenet5(seed=1).astype(np.float64)
    x, y = batch(n=3, seed=5, dtype=np.float64)
    for bias in ("conv1.b", "conv2.b", "fc1.b", "fc2.b"):  # nonzero biases get checked too
        model.params[bias][:] = np.random.default_rng(6).normal(0, 0.1, model.params[bias].shape)

    def loss():
        return softmax_cross_entropy(model.forward(x), y)[0]

    _, dlogits = softmax_cross_entropy(model.forward(x), y)
    model.backward(dlogits)
    rng = np.random.default_rng(7)
    for name, param in model.params.items():
        picks = rng.choice(param.size, size=min(12, param.size), replace=False)
        coords = [np.unravel_index(i, param.shape) for i in picks]
        numeric = numerical_gradient(loss, param, indices=coords)
        analytic = model.grads[name]
        rows = tuple(np.array(coords).T)
        assert relative_error(analytic[rows], numeric[rows]) < 1e-5, name


def test_mlp_gradients_match_centred_differences_float64():
    model = mlp(hidden=(6, 5), in_features=12, n_classes=4, seed=2).astype(np.float64)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 3, 4)), rng.integers(0, 4, size=5)

    def loss():
        return softmax_cross_entropy(model.forward(x), y)[0]

    model.backward(softmax_cross_entropy(model.forward(x), y)[1])
    for name, param in model.params.items():
        assert relative_error(model.grads[name], numerical_gradient(loss, param)) < 1e-5, name


def test_astype_copies_and_leaves_the_original():
    model = lenet5()
    double = model.astype(np.float64)
    assert double.dtype == np.float64 and model.dtype == np.float32
    x, _ = batch()
    assert double.forward(x).dtype == np.float64
    # Same weights in two precisions give the same logits up to float32 rounding.
    np.testing.assert_allclose(double.forward(x), model.forward(x), rtol=1e-4, atol=1e-4)
    double.params["fc1.w"][:] = 0
    assert np.any(model.params["fc1.w"] != 0)


def test_softmax_cross_entropy_value_and_gradient():
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((6, 5)), rng.integers(0, 5, size=6)
    loss, dlogits = softmax_cross_entropy(logits, labels)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert loss == pytest.approx(-np.mean(np.log(probs[np.arange(6), labels])), rel=1e-12)
    numeric = numerical_gradient(lambda: softmax_cross_entropy(logits, labels)[0], logits)
    assert relative_error(dlogits, numeric) < 1e-7
    np.testing.assert_allclose(dlogits.sum(axis=1), 0, atol=1e-12)  # rows of p - onehot


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    loss, dlogits = softmax_cross_entropy(np.array([[1e4, 0.0], [0.0, 1e4]]), np.array([0, 0]))
    assert np.isfinite(loss) and loss == pytest.approx(1e4 / 2)
    assert np.all(np.isfinite(dlogits))


@pytest.mark.parametrize(
    "logits, labels, error",
    [
        (np.zeros((3, 4)), np.zeros(2, dtype=int), ShapeError),
        (np.zeros((3, 4)), np.array([0, 1, 4]), DataError),
        (np.zeros((3, 4)), np.array([0.0, 1.0, 2.0]), DataError),
    ],
)
def test_softmax_cross_entropy_rejects_bad_input(logits, labels, error):
    with pytest.raises(error):
        softmax_cross_entropy(logits, labels)


def test_grad_hooks_run_in_reverse_order_with_grads_ready():
    model = lenet5()
    x, y = batch()
    for g in model.grads.values():
        g[...] = np.nan  # a hook seeing NaN would mean it ran before its layer's backward
    seen = []

    def hook(name):
        layer_grads = [g for key, g in model.grads.items() if key.startswith(name + ".")]
        seen.append((name, all(np.all(np.isfinite(g)) for g in layer_grads)))

    model.add_grad_hook(hook)
    model.backward(softmax_cross_entropy(model.forward(x), y)[1])
    assert seen == [("fc2", True), ("fc1", True), ("conv2", True), ("conv1", True)]


def test_first_layers_skip_input_gradient():
    model = lenet5()
    assert model.layers["conv1"].need_input_grad is False
    assert model.layers["conv2"].need_input_grad is True
    m = mlp()
    assert [m.layers[n].need_input_grad for n in ("flatten1", "fc1", "fc2")] == [
        False,
        False,
        True,
    ]


def test_run_order_moves_each_relu_after_the_max_pool_it_feeds():
    layers = dict(
        relu1=ReLU(), pool1=MaxPool2D(), conv1=Conv2D(1, 1, 1), relu2=ReLU(), relu3=ReLU(),
        pool2=MaxPool2D(), pool3=MaxPool2D(), relu4=ReLU(),
    )  # fmt: skip
    assert run_order(layers) == (
        "pool1", "relu1", "conv1", "relu2", "pool2", "relu3", "pool3", "relu4",
    )  # fmt: skip
    assert lenet5()._run_order[:6] == ("conv1", "pool1", "relu1", "conv2", "pool2", "relu2")


def test_pool_blocks_go_to_each_first_conv_whose_output_a_tiling_pool_takes():
    layers = dict(
        conv1=Conv2D(1, 1, 1), relu1=ReLU(), pool1=MaxPool2D(2, 2),
        conv2=Conv2D(1, 1, 1), pool2=MaxPool2D(3, 3),
        conv3=Conv2D(1, 1, 1), pool3=MaxPool2D(3, 2),  # overlapping windows: no block
        conv4=Conv2D(1, 1, 1), relu2=ReLU(), relu3=ReLU(), pool4=MaxPool2D(),  # two ReLUs
        conv5=Conv2D(1, 1, 1),
        conv6=Conv2D(1, 1, 1), pool6=MaxPool2D(),  # computes its input gradient: no block
    )  # fmt: skip
    for name, layer in layers.items():
        layer.need_input_grad = name == "conv6"
    assert pool_blocks(layers) == {"conv1": 2, "conv2": 3}
    model = lenet5()
    assert [model.layers[name].pool_block for name in ("conv1", "conv2")] == [2, 1]


def test_lenet5_with_pool_blocks_computes_what_it_computes_without():
    model = lenet5(seed=1).astype(np.float64)
    plain = model.astype(np.float64)
    for name in ("conv1", "conv2"):
        plain.layers[name].pool_block = 1
    x, y = batch(n=5, seed=3, dtype=np.float64)
    logits = model.forward(x)
    assert model.layers["pool1"].cache.x.ndim == 6  # pool1 was handed conv1's windows
    np.testing.assert_allclose(logits, plain.forward(x), rtol=1e-12, atol=1e-12)
    model.backward(softmax_cross_entropy(logits, y)[1])
    plain.backward(softmax_cross_entropy(plain.forward(x), y)[1])
    for name, grad in model.grads.items():
        np.testing.assert_allclose(grad, plain.grads[name], rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("size, stride", [(2, 2), (3, 1), (3, 2)])
def test_pool_then_relu_gives_exactly_what_relu_then_pool_gives(size, stride):
    rng = np.random.default_rng(0)
    model = Sequential(
        [Conv2D(1, 4, 3, rng=rng), ReLU(), MaxPool2D(size, stride), Conv2D(4, 3, 2, rng=rng),
         ReLU(), MaxPool2D(2, 2), Flatten()],
        input_shape=(1, 12, 12),
    ).astype(np.float64)  # fmt: skip
    for name in ("conv1.b", "conv2.b"):  # biases of both signs: ties above and below zero
        model.params[name][:] = rng.choice([-0.5, 0.5], model.params[name].shape)
    x = rng.standard_normal((3, 1, 12, 12))
    x[:, :, :6, :6] = 0.0  # flat background: every window there is all ties (the bias)
    declared = model.astype(np.float64)  # the same weights, run layer by layer as declared

    y = model.forward(x)
    dy = rng.standard_normal(y.shape)
    model.backward(dy)
    y_declared = x
    for layer in declared.layers.values():
        y_declared = layer.forward(y_declared)
    grad = dy
    for layer in reversed(declared.layers.values()):
        grad = layer.backward(grad)
        if grad is None:
            break
    np.testing.assert_array_equal(y, y_declared)
    for name, g in model.grads.items():
        np.testing.assert_array_equal(g, declared.grads[name], err_msg=name)
    assert np.any(model.grads["conv1.w"] != 0)


def test_naming_of_unnamed_and_named_layers():
    model = Sequential(
        [Conv2D(1, 2, 3), ReLU(), ("mypool", MaxPool2D()), Flatten(), Dense(2 * 3 * 3, 4)]
    )
    assert list(model.layers) == ["conv1", "relu1", "mypool", "flatten1", "fc1"]
    assert model.spec is None
    with pytest.raises(ValueError, match="duplicated"):
        Sequential([("a", ReLU()), ("a", ReLU())])


def test_wrong_input_shape_is_a_one_line_shape_error():
    with pytest.raises(ShapeError) as info:
        lenet5().forward(np.zeros((2, 3, 28, 28), dtype=np.float32))
    assert "(N, 1, 28, 28)" in str(info.value) and "\n" not in str(info.value)
    # Without a declared input shape, the failing layer names itself.
    model = Sequential([Flatten(), Dense(10, 2)])
    with pytest.raises(ShapeError, match="layer fc1: expected 10 input features"):
        model.forward(np.zeros((2, 11), dtype=np.float32))


def test_set_params_validates_before_writing():
    model = mlp(hidden=(8,), seed=0)
    before = model.params["fc1.w"].copy()
    new = {k: np.ones_like(v) for k, v in model.params.items()}
    new["fc2.w"] = np.ones((3, 3))
    with pytest.raises(ShapeError, match="fc2.w"):
        model.set_params(new)
    np.testing.assert_array_equal(model.params["fc1.w"], before)
    with pytest.raises(ShapeError, match="unknown"):
        model.set_params({"fc9.w": np.ones(1)})
    new["fc2.w"] = np.ones((8, 10), dtype=np.float64)
    model.set_params(new)
    assert model.params["fc2.w"].dtype == np.float32 and np.all(model.params["fc2.w"] == 1)
    model.set_params({"fc1.b": np.full(8, 2.0)})  # a subset, as a pull of changed layers
    assert np.all(model.params["fc1.b"] == 2) and np.all(model.params["fc2.w"] == 1)
    with pytest.raises(ShapeError, match="missing parameter"):
        model.set_params({"fc1.b": np.zeros(8)}, strict=True)


def test_build_model_and_spec():
    assert set(MODEL_NAMES) == {"lenet5", "mlp"}
    model = build_model("mlp", seed=3, hidden=[16, 8])
    assert model.spec == {
        "name": "mlp",
        "kwargs": {"hidden": [16, 8], "in_features": 784, "n_classes": 10},
        "seed": 3,
    }
    rebuilt = build_model(model.spec["name"], model.spec["seed"], **model.spec["kwargs"])
    for key in model.params:
        np.testing.assert_array_equal(rebuilt.params[key], model.params[key])
    assert build_model("lenet5").n_params == 431_080
    with pytest.raises(ConfigError, match="unknown model"):
        build_model("resnet")
    with pytest.raises(ConfigError, match="hidden"):
        build_model("lenet5", hidden=[3])


def test_training_steps_reduce_the_loss():
    from minips.state.store import SGD

    model = lenet5(seed=0)
    x, y = batch(n=16, seed=1)
    opt = SGD(model.params, lr=0.01, momentum=0.9)
    losses = []
    for _ in range(20):
        loss, dlogits = softmax_cross_entropy(model.forward(x), y)
        losses.append(loss)
        model.backward(dlogits)
        opt.step(model.grads)
    assert losses[-1] < 0.1 * losses[0]  # it memorises 16 random images
    # Evaluation mode leaves caches and parameters alone.
    assert np.argmax(model.forward(x, train=False), axis=1).tolist() == y.tolist()
