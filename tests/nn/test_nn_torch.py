"""minips.nn against PyTorch on random inputs, float32 (skipped when torch is not installed)."""

import numpy as np
import pytest

from minips.classroom.exercise.gradcheck import relative_error
from minips.nn import Conv2D, MaxPool2D, lenet5, softmax_cross_entropy

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOLERANCE = 1e-4  # float32, different summation orders


def tensor(array, grad=False):
    return torch.tensor(np.ascontiguousarray(array), requires_grad=grad)


@pytest.mark.parametrize("batch_last_input", [False, True])
@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 1), (1, 2)])
def test_conv_matches_torch(stride, padding, batch_last_input):
    rng = np.random.default_rng(0)
    conv = Conv2D(3, 6, 3, stride=stride, padding=padding, rng=rng)
    conv.params["b"][:] = rng.standard_normal(6).astype(np.float32)
    x = rng.standard_normal((4, 3, 11, 10)).astype(np.float32)
    if batch_last_input:  # the memory order conv and pool outputs have
        x = np.ascontiguousarray(x.transpose(1, 2, 3, 0)).transpose(3, 0, 1, 2)
    y = conv.forward(x)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = conv.backward(dy)

    xt, wt, bt = tensor(x, True), tensor(conv.params["w"], True), tensor(conv.params["b"], True)
    yt = F.conv2d(xt, wt, bt, stride=stride, padding=padding)
    yt.backward(tensor(dy))
    assert relative_error(y, yt.detach().numpy()) < TOLERANCE
    assert relative_error(dx, xt.grad.numpy()) < TOLERANCE
    assert relative_error(conv.grads["w"], wt.grad.numpy()) < TOLERANCE
    assert relative_error(conv.grads["b"], bt.grad.numpy()) < TOLERANCE


@pytest.mark.parametrize("size, stride", [(2, 2), (3, 2), (3, 1)])
def test_maxpool_matches_torch(size, stride):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    pool = MaxPool2D(size, stride)
    y = pool.forward(x)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    xt = tensor(x, True)
    yt = F.max_pool2d(xt, size, stride)
    yt.backward(tensor(dy))
    np.testing.assert_array_equal(y, yt.detach().numpy())
    np.testing.assert_allclose(pool.backward(dy), xt.grad.numpy(), rtol=1e-6, atol=1e-6)


def torch_lenet5_from(model):
    """The same network in torch with minips's weights (torch Linear stores w transposed)."""
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10),
    )  # fmt: skip
    torch_layers = {"conv1": net[0], "conv2": net[3], "fc1": net[7], "fc2": net[9]}
    with torch.no_grad():
        for name, layer in torch_layers.items():
            w = model.params[f"{name}.w"]
            layer.weight.copy_(tensor(w if name.startswith("conv") else w.T))
            layer.bias.copy_(tensor(model.params[f"{name}.b"]))
    return net, torch_layers


def test_lenet5_forward_backward_match_torch():
    model = lenet5(seed=0)
    rng = np.random.default_rng(2)
    for name, bias in model.params.items():
        if name.endswith(".b"):
            bias[:] = rng.normal(0, 0.1, bias.shape)
    x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=8)
    logits = model.forward(x)
    loss, dlogits = softmax_cross_entropy(logits, y)
    model.backward(dlogits)

    net, torch_layers = torch_lenet5_from(model)
    logits_t = net(tensor(x))
    loss_t = F.cross_entropy(logits_t, torch.tensor(y))
    loss_t.backward()
    assert relative_error(logits, logits_t.detach().numpy()) < TOLERANCE
    assert loss == pytest.approx(loss_t.item(), rel=TOLERANCE)
    for name, layer in torch_layers.items():
        grad_w = layer.weight.grad.numpy()
        grad_w = grad_w if name.startswith("conv") else grad_w.T
        assert relative_error(model.grads[f"{name}.w"], grad_w) < TOLERANCE, name
        assert relative_error(model.grads[f"{name}.b"], layer.bias.grad.numpy()) < TOLERANCE
