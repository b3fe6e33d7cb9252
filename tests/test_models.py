"""The paper's models: shapes, sizes, and equal arguments giving one Model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp


def _num_params(params):
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(params))


def test_lenet_has_the_reference_architecture_on_fashion_mnist():
    model = fjp.lenet((28, 28, 1), 10)
    params = model.init(jax.random.PRNGKey(0))
    # conv 5x5x1->6, conv 5x5x6->16, dense 256->120->84->10 (LeNet-5, LeCun et al., 1998).
    expected = (
        (5 * 5 * 1 * 6 + 6)
        + (5 * 5 * 6 * 16 + 16)
        + (256 * 120 + 120)
        + (120 * 84 + 84)
        + (84 * 10 + 10)
    )
    assert _num_params(params) == expected
    assert model.apply(params, jnp.zeros((3, 28, 28, 1))).shape == (3, 10)
    assert model.is_convolutional


def test_lenet_on_cifar_shapes():
    model = fjp.lenet((32, 32, 3), 10)
    logits = model.apply(model.init(jax.random.PRNGKey(0)), jnp.zeros((2, 32, 32, 3)))
    assert logits.shape == (2, 10)


def test_logistic_regression_is_one_dense_layer():
    model = fjp.logistic_regression((2,), 3)
    params = model.init(jax.random.PRNGKey(0))
    assert _num_params(params) == 2 * 3 + 3
    x = jnp.array([[1.0, -2.0]])
    kernel, bias = params["Dense_0"]["kernel"], params["Dense_0"]["bias"]
    np.testing.assert_allclose(model.apply(params, x), x @ kernel + bias, rtol=1e-6)
    assert not model.is_convolutional


def test_equal_arguments_give_the_same_model_object():
    # The round engine's compilation cache is keyed on the Model.
    assert fjp.lenet([28, 28, 1], 10) is fjp.lenet((28, 28, 1), 10)
    assert fjp.make_model("logistic_regression", (2,), 3) is fjp.logistic_regression((2,), 3)


def test_bad_model_requests_raise():
    with pytest.raises(ValueError, match="unknown model"):
        fjp.make_model("resnet", (28, 28, 1), 10)
    with pytest.raises(ValueError, match="H, W, C"):
        fjp.lenet((784,), 10)


def test_lenet_without_head_bias_is_fedrs_reference_head():
    # FedRS' reference classifier (lxcnju/FedRepo) is z = W h, no bias: 10 fewer parameters.
    with_bias = fjp.lenet((28, 28, 1), 10)
    model = fjp.lenet((28, 28, 1), 10, head_bias=False)
    params = model.init(jax.random.PRNGKey(0))
    assert _num_params(params) == _num_params(with_bias.init(jax.random.PRNGKey(0))) - 10
    assert set(params["Dense_2"]) == {"kernel"}
    assert model.name == "lenet_nobias" and with_bias.name == "lenet"
    assert fjp.make_model("lenet_nobias", (28, 28, 1), 10) is model
    assert fjp.lenet((28, 28, 1), 10, head_bias=True) is with_bias
    # A zero head kernel gives zero logits (there is no bias to add).
    zero = {**params, "Dense_2": {"kernel": jnp.zeros_like(params["Dense_2"]["kernel"])}}
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 28, 28, 1))
    np.testing.assert_array_equal(model.apply(zero, x), np.zeros((2, 10)))
    with pytest.raises(ValueError, match="head_bias must be a bool"):
        fjp.lenet((28, 28, 1), 10, head_bias=0)


def _flax_lenet_apply(num_classes, head_bias=True):
    from fedjax_pals.models import _LeNet

    module = _LeNet(num_classes, head_bias)
    return lambda params, x: module.apply({"params": params}, x)


@pytest.mark.parametrize(
    "input_shape, head_bias", [((28, 28, 1), True), ((32, 32, 3), True), ((28, 28, 1), False)]
)
def test_lenet_cpu_formulation_equals_flax_in_values_and_gradients(input_shape, head_bias):
    # On the CPU the LeNet runs channel-first, convolutions as patches x kernel (models.py);
    # the params are flax's and the logits and gradients equal flax's to float32 rounding.
    model = fjp.lenet(input_shape, 10, head_bias=head_bias)
    params = model.init(jax.random.PRNGKey(0))
    x = jax.random.uniform(jax.random.PRNGKey(1), (4, *input_shape))
    y = jnp.array([0, 3, 7, 9])
    flax_apply = _flax_lenet_apply(10, head_bias)
    np.testing.assert_allclose(
        jax.jit(model.apply)(params, x), jax.jit(flax_apply)(params, x), rtol=1e-5, atol=1e-6
    )

    def loss(apply):
        return lambda p: -jnp.mean(jax.nn.log_softmax(apply(p, x))[jnp.arange(4), y])

    got = jax.jit(jax.grad(loss(model.apply)))(params)
    want = jax.jit(jax.grad(loss(flax_apply)))(params)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_lenet_cpu_formulation_routes_pooling_ties_as_flax():
    # Constant inputs make every pooling window a tie: the gradient must still go where
    # flax's select-and-scatter sends it (the first maximum), not be split.
    model = fjp.lenet((28, 28, 1), 10)
    params = model.init(jax.random.PRNGKey(0))
    params = {**params, "Conv_0": {**params["Conv_0"], "bias": jnp.full((6,), 0.1)}}
    x = jnp.zeros((2, 28, 28, 1)).at[:, 10:18, 10:18].set(1.0)
    flax_apply = _flax_lenet_apply(10)
    # The input's gradient shows where each window's gradient went.
    got = jax.jit(jax.grad(lambda p, x: jnp.sum(model.apply(p, x) ** 2), (0, 1)))(params, x)
    want = jax.jit(jax.grad(lambda p, x: jnp.sum(flax_apply(p, x) ** 2), (0, 1)))(params, x)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_lenet_cpu_formulation_is_what_a_cpu_program_runs():
    model = fjp.lenet((28, 28, 1), 10)
    params = model.init(jax.random.PRNGKey(0))
    hlo = jax.jit(model.apply).lower(params, jnp.zeros((2, 28, 28, 1))).as_text()
    if jax.default_backend() == "cpu":
        assert "convolution" not in hlo and "dot_general" in hlo
    else:
        assert "convolution" in hlo


def test_a_registered_builder_returning_no_model_is_refused_naming_it_and_the_type():
    import flax.linen as nn

    from fedjax_pals import models

    fjp.register_model("bare_module", lambda input_shape, num_classes: nn.Dense(num_classes))
    try:
        with pytest.raises(ValueError) as raised:
            fjp.make_model("bare_module", (2,), 3)
    finally:
        models.MODELS.pop("bare_module")
    assert str(raised.value) == (
        "model 'bare_module': its builder returned Dense, not a fedjax_pals.Model; make one from "
        "a flax module with fjp.model_from_flax('bare_module', module, input_shape, num_classes)."
    )


@pytest.mark.parametrize(
    "logits, message",
    [
        (7, "model 'misfit' outputs 7 logits but data set 'blobs' has 3 classes"),
        (None, "model 'misfit' returns shape (1, 2, 3) for a batch of one example of data set "
               "'blobs'; it must return logits of shape (batch, 3)."),
    ],
)
def test_make_model_refuses_a_builder_whose_logits_do_not_fit_the_classes(logits, message):
    import flax.linen as nn

    from fedjax_pals import models

    class Misfit(nn.Module):
        @nn.compact
        def __call__(self, x):
            if logits is None:  # a batch of (2, 3) maps instead of 3 logits
                return nn.Dense(6)(x).reshape((x.shape[0], 2, 3))
            return nn.Dense(logits)(x)

    fjp.register_model("misfit", lambda shape, k: fjp.model_from_flax("misfit", Misfit(), shape, k))
    try:
        with pytest.raises(ValueError) as raised:
            fjp.make_model("misfit", (4,), 3, data="blobs")
        assert fjp.make_model("logistic_regression", (4,), 3, data="blobs").num_classes == 3
    finally:
        models.MODELS.pop("misfit")
    assert str(raised.value).startswith(message)


def test_stored_pixels_scaled_inside_the_step_equal_the_host_scaling_bit_for_bit():
    """Every uint8 value, scaled by a jitted model's input scaling, is the float32 the host
    used to compute (pixel / 127.5 - 1): holding the data as uint8 changes no run."""
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    host = pixels.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
    seen = []
    identity = fjp.Model("identity", lambda key: {}, lambda p, x: (seen.append(x), x.reshape(
        (x.shape[0], -1))[:, :3])[1], 3, False)
    scaled = fjp.models.with_input_scaling(identity, fjp.InputScaling(127.5, -1.0), "uint8")
    assert scaled.input_dtype == "uint8"
    on_device = jax.jit(lambda x: fjp.InputScaling(127.5, -1.0)(x))(pixels)
    np.testing.assert_array_equal(np.asarray(on_device), host)
    assert np.asarray(on_device).dtype == np.float32
    scaled.apply({}, jnp.asarray(pixels))
    np.testing.assert_array_equal(np.asarray(seen[-1]), host)


def test_a_token_model_is_built_and_traced_on_int32_inputs():
    class Embedder(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.Embed(10, 4)(x).mean(axis=1))

    model = fjp.model_from_flax("embedder", Embedder(), (5,), 3, input_dtype="int32")
    assert model.input_dtype == "int32"
    params = model.init(jax.random.PRNGKey(0))
    assert model.apply(params, jnp.zeros((2, 5), jnp.int32)).shape == (2, 3)
