"""Models of the paper's experiments, as pairs of pure functions.

A `Model` is `init(key) -> params` and `apply(params, x) -> logits`, so the round engine can
vmap and jit them over a stacked client axis without knowing about Flax.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_pals import extensions

Params = chex.ArrayTree


class Model(NamedTuple):
    """A classifier: `init(key) -> params`, `apply(params, x) -> logits (B, K)`; x of
    `input_dtype` ("float32"; "int32" for token models, "uint8" for a model that scales the
    stored pixels itself, `make_model`'s input_scaling)."""

    name: str
    init: Callable[[chex.PRNGKey], Params]
    apply: Callable[[Params, jax.Array], jax.Array]
    num_classes: int
    is_convolutional: bool
    input_dtype: str = "float32"


class _LogisticRegression(nn.Module):
    num_classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


class _LeNet(nn.Module):
    """LeNet-5-style CNN (LeCun et al., 1998), the FedPALS paper's "small, two-layer
    convolutional network" for Fashion-MNIST and CIFAR-10 (Sec. 5): conv5x5-6, maxpool 2,
    conv5x5-16, maxpool 2, dense 120, dense 84, dense K; ReLU.

    head_bias=False drops the bias of the last (classifier) layer: logits z = W h, the
    head of FedRS' reference implementation (lxcnju/FedRepo, algorithms/fedrs.py)."""

    num_classes: int
    head_bias: bool = True

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(6, (5, 5), padding="VALID")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(16, (5, 5), padding="VALID")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.num_classes, use_bias=self.head_bias)(x)


# ----------------------------------------------------------------------------
# The LeNet's forward pass on the CPU: the same function of the same parameters,
# formulated for XLA's CPU backend (docs/decisions/0008-lenet-step-on-cpu.md).
#
# XLA:CPU runs flax's NHWC convolutions with 1 and 6 input channels through Eigen at a few
# GFLOP/s, and the input gradient of the second one (a padded convolution) is slower still; the
# 6- and 16-channel minor dimension also vectorises poorly in the elementwise ops and pooling.
# Here activations are laid out channel-first, (C, B, H, W), and each convolution is its patches
# (25 shifted slices, stacked: (kh*kw*C_in, B*H_out*W_out)) times the kernel reshaped to
# (kh*kw*C_in, C_out), one matmul that XLA hands to its matmul library; the kernel's gradient is
# one matmul too, and the input gradient of the second convolution a matmul plus a sum of
# slices. Max pooling is the same `reduce_window` as flax's `nn.max_pool` (so its gradient,
# select-and-scatter, picks the same element on ties). The parameters, their tree and the logits
# are flax's, up to float32 rounding (the sums run in another order).


def _conv_patches_cf(h, kernel, bias):
    """VALID, stride-1 convolution of h (C, B, H, W) by an HWIO kernel: (C_out, B, H', W')."""
    kh, kw, c_in, c_out = kernel.shape
    _, b, height, width = h.shape
    ho, wo = height - kh + 1, width - kw + 1
    rows = [h[:, :, i : i + ho, j : j + wo] for i in range(kh) for j in range(kw)]
    patches = jnp.stack(rows).reshape(kh * kw * c_in, b * ho * wo)  # rows ordered (i, j, c)
    out = kernel.reshape(kh * kw * c_in, c_out).T @ patches
    return (out + bias[:, None]).reshape(c_out, b, ho, wo)


def _max_pool_cf(h):
    """2x2, stride 2, VALID max pooling of h (C, B, H, W), as flax's nn.max_pool."""
    return lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def _lenet_apply_cpu(params, x):
    """`_LeNet.apply` for inputs (B, H, W, C), channel-first inside (see above)."""
    conv0, conv1 = params["Conv_0"], params["Conv_1"]
    dtype = jnp.result_type(x, conv0["kernel"])
    h = jnp.transpose(x.astype(dtype), (3, 0, 1, 2))  # (C, B, H, W)
    h = _max_pool_cf(jax.nn.relu(_conv_patches_cf(h, conv0["kernel"], conv0["bias"])))
    h = _max_pool_cf(jax.nn.relu(_conv_patches_cf(h, conv1["kernel"], conv1["bias"])))
    h = jnp.transpose(h, (1, 2, 3, 0)).reshape(x.shape[0], -1)  # flax's NHWC flattening
    for name in ("Dense_0", "Dense_1"):
        h = jax.nn.relu(h @ params[name]["kernel"] + params[name]["bias"])
    head = params["Dense_2"]
    logits = h @ head["kernel"]
    return logits + head["bias"] if "bias" in head else logits


def _from_flax(
    name: str,
    module: nn.Module,
    input_shape: Sequence[int],
    num_classes: int,
    is_convolutional: bool,
    cpu_apply: Callable[[Params, jax.Array], jax.Array] | None = None,
    input_dtype: str = "float32",
) -> Model:
    """A Model of a flax module; `cpu_apply`, if given, is the module's apply on the CPU.

    The choice is made when the computation is lowered (`lax.platform_dependent`):
    a program for the CPU gets `cpu_apply`, one for an accelerator flax's apply.
    """
    dummy = jnp.zeros((1, *input_shape), input_dtype)

    def init(key):
        return module.init(key, dummy)["params"]

    def flax_apply(params, x):
        return module.apply({"params": params}, x)

    if cpu_apply is None:
        apply = flax_apply
    else:

        def apply(params, x):
            return lax.platform_dependent(params, x, cpu=cpu_apply, default=flax_apply)

    return Model(name, init, apply, num_classes, is_convolutional, str(np.dtype(input_dtype)))


# The builders are cached so that equal arguments give the same Model object: the round
# engine keys its programs on the model's structure, but an equal object also spares
# `abstract_model`'s trace and jit's own caches a second entry.
def logistic_regression(input_shape: Sequence[int], num_classes: int) -> Model:
    """Multinomial logistic regression (the synthetic task, App. C.4)."""
    return _logistic_regression(tuple(int(d) for d in input_shape), int(num_classes))


def lenet(input_shape: Sequence[int], num_classes: int, head_bias: bool = True) -> Model:
    """The small two-layer CNN used for Fashion-MNIST and CIFAR-10 (Sec. 5).

    head_bias=False gives the bias-free classifier z_k = w_k^T h of FedRS' reference
    implementation (model name "lenet_nobias"); FedRS then scales exactly w_k^T h.
    """
    if len(input_shape) != 3:
        raise ValueError(f"lenet needs (H, W, C) inputs, got input_shape {tuple(input_shape)}.")
    if not isinstance(head_bias, bool):
        raise ValueError(f"head_bias must be a bool, got {head_bias!r}.")
    return _lenet(tuple(int(d) for d in input_shape), int(num_classes), head_bias)


@functools.cache
def _logistic_regression(input_shape, num_classes):
    return _from_flax(
        "logistic_regression", _LogisticRegression(num_classes), input_shape, num_classes, False
    )


@functools.cache
def _lenet(input_shape, num_classes, head_bias):
    name = "lenet" if head_bias else "lenet_nobias"
    module = _LeNet(num_classes, head_bias)
    return _from_flax(name, module, input_shape, num_classes, True, cpu_apply=_lenet_apply_cpu)


def _lenet_nobias(input_shape: Sequence[int], num_classes: int) -> Model:
    return lenet(input_shape, num_classes, head_bias=False)


MODELS = {"logistic_regression": logistic_regression, "lenet": lenet, "lenet_nobias": _lenet_nobias}


# The models that take image inputs (H, W, C): config.model may name them only for an image
# data set.
_IMAGE_MODELS = {"lenet", "lenet_nobias"}
# What the registered models take when it is not float32 (`model_input_dtype`).
_INPUT_DTYPES: dict[str, str] = {}


def register_model(
    name: str,
    build: Callable[[Sequence[int], int], Model],
    *,
    needs_images: bool = False,
    input_dtype: str = "float32",
    replace: bool = False,
) -> None:
    """Registers a model under `name` (config.model = name).

    build(input_shape, num_classes) -> Model; `model_from_flax` makes one from any
    flax.linen Module. No caching needed: the round engine is shared by structure
    (`engine.structure_key`), so models built alike by an uncached builder train in one
    compiled program.
    needs_images: the model takes (H, W, C) inputs (refused for feature-vector data sets).
    input_dtype: what its `Model.input_dtype` is ("int32" for a model of tokens).
    """
    if not isinstance(name, str) or not name.isidentifier() or name == "auto":
        raise ValueError(f"a model's name must be a Python identifier other than 'auto', got {name!r}.")
    if not callable(build):
        raise TypeError(f"build must be callable (input_shape, num_classes) -> Model, got {build!r}.")
    if name in MODELS and not replace:
        raise ValueError(f"a model {name!r} is already registered; pass replace=True to redefine it.")
    MODELS[name] = build
    (_IMAGE_MODELS.add if needs_images else _IMAGE_MODELS.discard)(name)
    _INPUT_DTYPES[name] = str(np.dtype(input_dtype))
    extensions.note_registration("model", name)


def registered_models() -> tuple[str, ...]:
    return tuple(MODELS)


def model_needs_images(name: str) -> bool:
    return name in _IMAGE_MODELS


def model_input_dtype(name: str) -> str:
    """The dtype the registered model `name` takes ("float32" unless its registration says
    otherwise: "int32" for a token model)."""
    return _INPUT_DTYPES.get(name, "float32")


def model_from_flax(
    name: str,
    module: nn.Module,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    convolutional: bool = False,
    input_dtype: str = "float32",
) -> Model:
    """A `Model` from a flax.linen Module whose __call__(x) returns (B, num_classes) logits.

    convolutional=True tells the engine's backend choice that the model convolves: on a CPU
    it then trains clients one at a time (vmapped convolutions are slow there,
    docs/decisions/0003-backend-chosen-per-platform-and-model.md). input_dtype: what x is
    ("int32" for a model of tokens, e.g. one that starts with `nn.Embed`).
    """
    return _from_flax(
        name, module, tuple(int(d) for d in input_shape), int(num_classes), bool(convolutional),
        input_dtype=str(np.dtype(input_dtype)),
    )


def with_input_scaling(model: Model, scaling: Any, stored_dtype: str) -> Model:
    """`model` taking stored (quantised) inputs of `stored_dtype`: apply(params, x) is
    model.apply(params, scaling(x)), the conversion to float inside the jitted step, per
    batch, so that the host and the device hold the data set as stored (uint8 pixels).
    `scaling`: a `fedjax_pals.InputScaling` (a frozen dataclass: models scaled alike share
    one compiled program, `engine.structure_key`)."""
    if getattr(model, "input_dtype", "float32") != "float32":
        raise ValueError(
            f"model {model.name!r} takes {model.input_dtype} inputs, not the float32 an input "
            "scaling gives; a model of tokens takes them as stored (no input_scaling)."
        )
    try:
        return _scaled_model(model, scaling, str(np.dtype(stored_dtype)))
    except TypeError:  # an unhashable model or scaling (a user's): wrapped anew
        return _scaled_model.__wrapped__(model, scaling, str(np.dtype(stored_dtype)))


# One wrapped Model per (model, scaling, dtype): the runs of a sweep then share its `apply`,
# and with it every program cached by the apply function (the evaluators, the per-client
# evaluation). A new closure per run compiled (or loaded) those programs anew for every run
# and kept them all: a 100-run sweep in one process ran out of memory maps (vm.max_map_count)
# after about 50 runs and died in LLVM ("Cannot allocate memory", then a segfault).
@functools.lru_cache(maxsize=64)
def _scaled_model(model: Model, scaling: Any, stored_dtype: str) -> Model:
    inner_apply = model.apply

    def apply(params, x):
        return inner_apply(params, scaling(x))

    return model._replace(apply=apply, input_dtype=stored_dtype)


def model_for_data(model: Model, dataset: Any, *, data: str | None = None) -> Model:
    """`model` taking `dataset`'s inputs as stored: wrapped by the data set's `input_scaling`
    (`with_input_scaling`) when the model takes float32 and the data are quantised; as it is
    when it takes them already (a model of tokens, float32 features, a model wrapped before).

    Integer inputs without a scaling for a float model keep their meaning of before 0.3 (every
    split was converted to float32: the model sees the plain values) and warn.

    Raises:
      ValueError: a model of another input dtype than the data's (named).
    """
    from fedjax_pals import deprecation
    from fedjax_pals.data.datasets import InputScaling

    stored = str(dataset.train.x.dtype)
    taken = getattr(model, "input_dtype", "float32")
    if taken == stored:
        return model
    name = data or dataset.name
    if taken != "float32":
        raise ValueError(
            f"model {model.name!r} takes {taken} inputs, but data set {name!r} holds {stored} "
            "ones" + (" (a model of tokens takes int32)." if stored != "int32" else ".")
        )
    scaling = dataset.input_scaling
    if scaling is None:
        deprecation.warn(
            f"data set {name!r} holds {stored} inputs without an input_scaling, so the model "
            "sees them as plain floats (as before 0.3, when every split was converted to "
            "float32); say so with Dataset(..., input_scaling=fjp.InputScaling(1.0)) or give "
            "the scaling the model should see (uint8 pixels in [-1, 1]: "
            "fjp.InputScaling(127.5, -1.0)).", refused_in="0.4.0")
        scaling = InputScaling(1.0)
    return with_input_scaling(model, scaling, stored)


@functools.lru_cache(maxsize=32)
def abstract_model(model: Model, input_shape: tuple[int, ...]) -> tuple[chex.ArrayTree, jax.Array]:
    """The model's params and its output for a batch of one example, traced, never computed
    (`jax.eval_shape`: `jax.ShapeDtypeStruct`s); cached: the runs of a sweep share their Model."""
    key = jax.eval_shape(jax.random.PRNGKey, 0)
    x = jax.ShapeDtypeStruct((1, *input_shape), getattr(model, "input_dtype", "float32"))

    def init_and_apply(key, x):
        params = model.init(key)
        return params, model.apply(params, x)

    return jax.eval_shape(init_and_apply, key, x)


def make_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    data: str | None = None,
    input_scaling: Any = None,
    stored_dtype: str = "uint8",
) -> Model:
    """The registered model `name` for inputs of `input_shape` and `num_classes` classes.

    input_scaling (a data set's `InputScaling`, None: none): the model takes the stored
    inputs (`stored_dtype`, uint8 pixels) and scales them inside the step
    (`with_input_scaling`); its builder builds it for the float32 inputs it then sees.

    What its builder returns is checked, traced on one example (nothing is computed): a
    `Model` whose logits are (batch, num_classes) and whose `num_classes` says so. More logits
    train silently (argmax may pick a class that does not exist), fewer give a NaN loss.
    `data` names the data set in the messages ("data set 'cifar10'").

    Raises:
      ValueError: an unknown name, or a builder whose model does not fit (named).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}.")
    model = MODELS[name](input_shape, num_classes)
    if not isinstance(model, Model):
        # A registered builder's mistake, named here rather than as an attribute error of the
        # engine (e.g. a bare flax module returned instead of its Model).
        raise ValueError(
            f"model {name!r}: its builder returned {type(model).__name__}, not a "
            f"fedjax_pals.Model; make one from a flax module with "
            f"fjp.model_from_flax({name!r}, module, input_shape, num_classes)."
        )
    if input_scaling is not None:
        model = with_input_scaling(model, input_scaling, stored_dtype)
    k, of = num_classes, "the inputs" if data is None else f"data set {data!r}"
    _, logits = abstract_model(model, tuple(input_shape))
    shape = tuple(logits.shape) if hasattr(logits, "shape") else None
    if shape is None or len(shape) != 2 or shape[0] != 1:
        got = type(logits).__name__ if shape is None else f"shape {shape}"
        raise ValueError(
            f"model {name!r} returns {got} for a batch of one example of {of}; it must return "
            f"logits of shape (batch, {k})."
        )
    has = "the data" if data is None else f"data set {data!r}"
    if shape[1] != k:
        raise ValueError(
            f"model {name!r} outputs {shape[1]} logits but {has} has {k} classes; give its "
            "last layer the num_classes its builder is passed."
        )
    if model.num_classes != k:
        raise ValueError(
            f"model {name!r} was built for {of}'s {k} classes but its Model says "
            f"num_classes={model.num_classes} (evaluation counts that many classes)."
        )
    return model


# ---- LEAF's Shakespeare LSTM ------------------------------------------------------------------


class _LeafLSTM(nn.Module):
    """LEAF's next-character model (Caldas et al., 2018, ``models/shakespeare/stacked_lstm.py``):
    an embedding of the vocabulary in 8 dimensions, two LSTM layers of 256 units, and a dense
    layer to the classes from the last time step's output. The LSTM cells are flax's
    (`nn.OptimizedLSTMCell`: gates i, f, g, o; c' = f c + i g, h' = o tanh(c'); biases
    initialised at 0), where LEAF's TF ``BasicLSTMCell`` adds a constant forget bias of 1.0."""

    num_classes: int
    vocab_size: int
    embed_dim: int = 8
    hidden: int = 256
    num_layers: int = 2

    @nn.compact
    def __call__(self, x):
        h = nn.Embed(self.vocab_size, self.embed_dim)(x.astype(jnp.int32))
        for _ in range(self.num_layers):
            h = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(h)
        return nn.Dense(self.num_classes)(h[:, -1])


def lstm_leaf(input_shape: Sequence[int], num_classes: int) -> Model:
    """LEAF's Shakespeare LSTM for int32 token inputs (seq_len,): embedding 8, two LSTM
    layers of 256, dense softmax over `num_classes` (the vocabulary is the classes: LEAF's 80
    characters, `fedjax_pals.data.vocabulary`)."""
    if len(input_shape) != 1:
        raise ValueError(
            f"lstm_leaf needs token sequences (seq_len,), got input_shape {tuple(input_shape)}."
        )
    return _lstm_leaf(tuple(int(d) for d in input_shape), int(num_classes))


@functools.cache
def _lstm_leaf(input_shape, num_classes):
    module = _LeafLSTM(num_classes, vocab_size=num_classes)
    return _from_flax("lstm_leaf", module, input_shape, num_classes, False, input_dtype="int32")


MODELS["lstm_leaf"] = lstm_leaf
_INPUT_DTYPES["lstm_leaf"] = "int32"
