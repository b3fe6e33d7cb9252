"""LEAF's Shakespeare LSTM (`lstm_leaf`) against an independent float64 NumPy LSTM."""

import jax
import numpy as np
import pytest

from fedjax_pals import models


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _numpy_lstm_leaf(params, tokens):
    """The model's equations in float64: embedding, two LSTM layers (gates i, f, g, o from
    x W_i* + h W_h* + b_h*; c' = f c + i g; h' = o tanh(c'), zero initial state), dense on the
    last step."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    h_seq = p["Embed_0"]["embedding"][tokens]  # (B, T, 8)
    for layer in ("OptimizedLSTMCell_0", "OptimizedLSTMCell_1"):
        cell = p[layer]
        batch, steps, _ = h_seq.shape
        units = cell["hi"]["kernel"].shape[0]
        h, c = np.zeros((batch, units)), np.zeros((batch, units))
        outputs = []
        for t in range(steps):
            x = h_seq[:, t]
            pre = {g: x @ cell[f"i{g}"]["kernel"] + h @ cell[f"h{g}"]["kernel"]
                   + cell[f"h{g}"]["bias"] for g in "ifgo"}
            c = _sigmoid(pre["f"]) * c + _sigmoid(pre["i"]) * np.tanh(pre["g"])
            h = _sigmoid(pre["o"]) * np.tanh(c)
            outputs.append(h)
        h_seq = np.stack(outputs, axis=1)
    dense = p["Dense_0"]
    return h_seq[:, -1] @ dense["kernel"] + dense["bias"]


def _perturbed(params, seed):
    """Non-zero biases and a larger embedding, so every term of the equations matters (the
    kernels stay as initialised: larger recurrent weights make 80 steps chaotic, where float32
    rounding grows without bound)."""
    rng = np.random.default_rng(seed)

    def perturb(path, a):
        a = np.asarray(a)
        key = jax.tree_util.keystr(path)
        if "bias" in key or "embedding" in key:
            return a + rng.normal(0.0, 0.5, a.shape).astype(np.float32)
        return a

    return jax.tree_util.tree_map_with_path(perturb, params)


def test_lstm_leaf_shapes_and_registration():
    assert "lstm_leaf" in models.MODELS
    model = models.make_model("lstm_leaf", (80,), 80)
    assert model.input_dtype == "int32" and model.num_classes == 80
    params = model.init(jax.random.PRNGKey(0))
    shapes = jax.tree_util.tree_map(lambda a: a.shape, params)
    assert shapes["Embed_0"]["embedding"] == (80, 8)
    assert shapes["OptimizedLSTMCell_0"]["ii"]["kernel"] == (8, 256)
    assert shapes["OptimizedLSTMCell_0"]["hi"]["kernel"] == (256, 256)
    assert shapes["OptimizedLSTMCell_1"]["ii"]["kernel"] == (256, 256)
    assert shapes["Dense_0"]["kernel"] == (256, 80)
    count = sum(a.size for a in jax.tree_util.tree_leaves(params))
    # 80*8 + 4*(8*256 + 256*256 + 256) + 4*(256*256 + 256*256 + 256) + 256*80 + 80
    assert count == (640 + 4 * (8 * 256 + 256 * 256 + 256) + 4 * (2 * 256 * 256 + 256)
                     + 256 * 80 + 80)  # 817,872
    x = np.random.default_rng(0).integers(0, 80, (3, 80)).astype(np.int32)
    assert model.apply(params, x).shape == (3, 80)
    with pytest.raises(ValueError, match="token sequences"):
        models.lstm_leaf((28, 28, 1), 10)


@pytest.mark.parametrize("seq_len", [5, 80])
def test_lstm_leaf_matches_numpy_float64(seq_len):
    model = models.lstm_leaf((seq_len,), 80)
    params = _perturbed(model.init(jax.random.PRNGKey(1)), seed=seq_len)
    tokens = np.random.default_rng(seq_len).integers(0, 80, (4, seq_len)).astype(np.int32)
    got = np.asarray(jax.jit(model.apply)(params, tokens), np.float64)
    want = _numpy_lstm_leaf(params, tokens)
    assert np.abs(want).max() > 0.1  # not a trivially small output
    # float32: products of 256-term sums, through 80 recurrent steps.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
