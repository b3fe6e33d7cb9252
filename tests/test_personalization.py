"""Personalisation (fine-tuning, Ditto, local training) against a float64 NumPy reference:
multinomial logistic regression trained by the same minibatch schedule, its per-client
accuracies and its per-client choice."""

import jax
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals import personalization

U32 = 2.0**-24  # float32 unit roundoff
D, K = 3, 3  # features, classes
MODEL = fjp.logistic_regression((D,), K)


def _problem(seed, num_clients=6, width=8, eval_width=6):
    """Well-separated classes (means 1.5 * N(0, I), noise 0.3), clients of label-skewed data;
    sizes include 0 (no training / validation / test examples), 1 and 2 (fewer than a batch)
    and full rows. Padding holds garbage indices (they must be masked)."""
    rng = np.random.default_rng(seed)
    means = 1.5 * rng.normal(size=(K, D))

    def split(num):
        y = rng.integers(0, K, num).astype(np.int32)
        return (means[y] + 0.3 * rng.normal(size=(num, D))).astype(np.float32), y

    train_x, train_y = split(80)
    eval_x, eval_y = split(60)

    def rows(num, w, sizes):
        idx = rng.integers(0, num, (num_clients, w)).astype(np.int32)
        idx[np.arange(w)[None, :] >= np.asarray(sizes)[:, None]] = 10**6
        return idx, np.asarray(sizes)

    train = rows(80, width, [0, 1, 2, 5, width, width][:num_clients])
    val = rows(60, eval_width, [3, 0, 4, eval_width, 2, 5][:num_clients])
    test = rows(60, eval_width, [4, 2, 0, eval_width, 3, 6][:num_clients])
    # A start model of N(0, 4) weights: wrong on many examples, so personalising pays.
    start = jax.tree_util.tree_map(lambda a: 2 * rng.normal(size=a.shape).astype(np.float32),
                                   MODEL.init(jax.random.PRNGKey(seed)))
    data = (train_x, train_y, *train, eval_x, eval_y, *val, *test)
    return start, data


def _as_numpy(params):
    return (np.asarray(params["Dense_0"]["kernel"], np.float64),
            np.asarray(params["Dense_0"]["bias"], np.float64))


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _reference_sgd(start, anchor, x, y, row, n, positions, lr, lam, num_steps):
    """Float64 SGD on mean cross-entropy + (lam/2)||v - anchor||^2 for one client and the
    first-order bound on |float32 result - this| (entrywise max) along the trajectory:

      e_{t+1} <= ||I - lr H_t||_inf e_t + delta_t,

    H_t the loss's Hessian at v_t (exact for logistic regression), delta_t the rounding error
    of one float32 step: logits from d + 1 products (gamma_{d+1}), softmax (exp, sum of K,
    division: 2 * err_z + 8u), the batch mean of B products (gamma_B), the prox term and the
    update itself (u |v| + 2 u lr |g|); a factor 2 covers XLA's exp/log (a few ulp).
    """
    (kernel, bias), (anchor_k, anchor_b) = start, anchor
    kernel, bias = kernel.copy(), bias.copy()
    bound = 0.0
    if n == 0:
        return (kernel, bias), bound
    for t in range(num_steps):
        idx = row[positions[t]]
        xt = np.concatenate([x[idx], np.ones((len(idx), 1))], axis=1)  # (B, D + 1)
        batch = len(idx)
        w = np.concatenate([kernel, bias[None]], axis=0)  # (D + 1, K)
        p = _softmax(xt @ w)
        g = p.copy()
        g[np.arange(batch), y[idx]] -= 1
        grad = xt.T @ g / batch + lam * (w - np.concatenate([anchor_k, anchor_b[None]]))
        # Hessian of the data term, (D+1)K x (D+1)K, indices (j, k) -> j * K + k.
        hess = sum(np.kron(np.outer(xb, xb), np.diag(pb) - np.outer(pb, pb))
                   for xb, pb in zip(xt, p)) / batch + lam * np.eye(w.size)
        jacobian = np.abs(np.eye(w.size) - lr * hess).sum(1).max()
        xmax = np.abs(xt).max()
        err_z = (D + 1) * U32 * (np.abs(xt) @ np.abs(w)).max()
        err_p = 2 * err_z + 8 * U32
        err_g = xmax * (err_p + 2 * U32) + batch * U32 * xmax * 2 + 4 * U32 * lam * np.abs(
            w).max()
        delta = 2 * (U32 * np.abs(w).max() + lr * err_g + 2 * U32 * lr * np.abs(grad).max())
        bound = jacobian * bound + delta
        w = w - lr * grad
        kernel, bias = w[:-1], w[-1]
    return (kernel, bias), bound


def _reference(start, anchor, data, lrs, lams, checkpoints, batch_size, key):
    """Per grid point, checkpoint and client: float64 params, their error bound, and the
    reference correct counts on validation / test with their smallest logit margin."""
    train_x, train_y, rows, sizes, eval_x, eval_y, val_rows, val_n, test_rows, test_n = data
    x64, e64 = train_x.astype(np.float64), eval_x.astype(np.float64)
    grid = [(lr, lam) for lr in lrs for lam in lams]
    num_clients = len(sizes)
    shape = (len(grid), len(checkpoints), num_clients)
    val_correct, test_correct = np.zeros(shape, int), np.zeros(shape, int)
    params, bounds, margins = {}, np.zeros(shape), []
    for i in range(num_clients):
        positions = personalization.personal_schedule(
            key, i, int(sizes[i]), rows.shape[1], checkpoints[-1], batch_size)
        for g, (lr, lam) in enumerate(grid):
            for s, k in enumerate(checkpoints):
                v, bound = _reference_sgd(_as_numpy(start), _as_numpy(anchor), x64, train_y,
                                          rows[i], sizes[i], positions, lr, lam, k)
                params[g, s, i], bounds[g, s, i] = v, bound
                for out, r, n in ((val_correct, val_rows, val_n), (test_correct, test_rows,
                                                                    test_n)):
                    idx = r[i, :n[i]]
                    logits = e64[idx] @ v[0] + v[1]
                    out[g, s, i] = np.sum(logits.argmax(1) == eval_y[idx])
                    top = np.sort(logits, 1)
                    # Logit error from the params' error: (D + 1) * max|x~| * bound, plus
                    # the float32 evaluation's own rounding.
                    slack = (D + 1) * max(1.0, np.abs(e64).max()) * (bound + 4 * U32 * (
                        np.abs(v[0]).max() + np.abs(v[1]).max()))
                    margins.extend(((top[:, -1] - top[:, -2]) / slack).tolist())
    return params, bounds, val_correct, test_correct, min(margins, default=np.inf)


def _reference_choice(val_correct, checkpoints):
    """Best validation count per client; ties: fewest steps, then first grid point."""
    num_grid, num_checkpoints, num_clients = val_correct.shape
    choice = []
    for i in range(num_clients):
        best = None
        for s in range(num_checkpoints):
            for g in range(num_grid):
                if best is None or val_correct[g, s, i] > val_correct[best[0], best[1], i]:
                    best = (g, s)
        choice.append(best)
    return np.array(choice).T


@pytest.mark.parametrize("seed, batch_size", [(4, 4), (2, 3)])
def test_params_accuracies_and_choice_match_the_float64_reference(seed, batch_size):
    start, data = _problem(seed)
    anchor = jax.tree_util.tree_map(lambda a: a[::-1] * 0.5, start)  # a general anchor
    lrs, lams, checkpoints = (0.25, 0.0625), (0.0, 0.5), (0, 2, 5)  # exact in float32
    key = jax.random.PRNGKey(seed + 10)
    result = personalization.personalize(
        MODEL.apply, start, *data, learning_rates=lrs, steps=checkpoints, prox=lams,
        anchor_params=anchor, batch_size=batch_size, key=key, eval_batch_size=4,
        return_params=True)
    params, bounds, val_correct, test_correct, margin = _reference(
        start, anchor, data, lrs, lams, checkpoints, batch_size, key)
    # The bound is discriminating (a wrong batch or step moves params by ~ lr |g| >> 1e-3)...
    assert bounds.max() < 1e-3
    kernel, bias = _as_numpy(result.params)
    for (g, s, i), (ref_kernel, ref_bias) in params.items():
        if s == len(checkpoints) - 1:
            err = max(np.abs(kernel[g, i] - ref_kernel).max(), np.abs(bias[g, i] - ref_bias).max())
            assert err <= bounds[g, s, i], (g, i, err, bounds[g, s, i])
    np.testing.assert_array_equal(bias[:, 0], np.broadcast_to(start["Dense_0"]["bias"],
                                                             bias[:, 0].shape))  # n_0 = 0
    # ... and no evaluated prediction sits within the error's reach of a decision boundary.
    assert margin > 1
    np.testing.assert_array_equal(result.val.correct, val_correct)
    np.testing.assert_array_equal(result.test.correct, test_correct)
    val_n, test_n = data[7], data[9]
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(result.val.accuracy, val_correct / val_n)
        np.testing.assert_array_equal(result.test.accuracy, test_correct / test_n)
    assert np.isnan(result.val.accuracy[..., 1]).all()  # client 1: no validation examples
    assert np.isnan(result.test.accuracy[..., 2]).all()  # client 2: no test examples
    grid, checkpoint = _reference_choice(val_correct, checkpoints)
    np.testing.assert_array_equal(result.chosen_grid, grid)
    np.testing.assert_array_equal(result.chosen_checkpoint, checkpoint)
    assert (grid[1], checkpoint[1]) == (0, 0)  # no validation examples: the first candidate
    clients = np.arange(len(grid))
    np.testing.assert_array_equal(result.chosen_test_accuracy,
                                  result.test.accuracy[grid, checkpoint, clients])
    np.testing.assert_array_equal(result.chosen_steps, np.array(checkpoints)[checkpoint])
    np.testing.assert_array_equal(result.chosen_learning_rate,
                                  np.repeat(lrs, len(lams))[grid])
    np.testing.assert_array_equal(result.chosen_prox, np.tile(lams, len(lrs))[grid])
    assert result.client_steps == 5 * 4 * 5  # 5 clients with training data, G = 4, 5 steps
    # The choice is not trivial here: several clients pick a personalised model.
    assert (checkpoint > 0).sum() >= 2 and (grid > 0).any()


@pytest.mark.parametrize("num_examples", [1, 3, 8])
@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_schedule_walks_through_epochs_of_fresh_permutations(num_examples, batch_size):
    key = jax.random.PRNGKey(num_examples * 100 + batch_size)
    num_steps, width = 7, 9
    positions = personalization.personal_schedule(key, 2, num_examples, width, num_steps,
                                                  batch_size)
    assert positions.shape == (num_steps, batch_size)
    flat = positions.reshape(-1)
    whole = len(flat) // num_examples
    epochs = flat[: whole * num_examples].reshape(whole, num_examples)
    for epoch in epochs:  # every epoch a permutation of the client's n positions
        np.testing.assert_array_equal(np.sort(epoch), np.arange(num_examples))
    assert set(flat[whole * num_examples:]) <= set(range(num_examples))
    if num_examples >= 3 and whole >= 3:
        assert len({tuple(e) for e in epochs}) > 1  # fresh permutations, not one repeated
    # A prefix of a longer schedule, and the same with every epoch of a batch drawn (the
    # static bound epochs_per_step is enough).
    longer = personalization.personal_schedule(key, 2, num_examples, width, num_steps + 3,
                                               batch_size)
    np.testing.assert_array_equal(longer[:num_steps], positions)
    every_epoch = jax.jit(jax.vmap(lambda t: personalization.step_positions(
        jax.random.fold_in(key, 2), num_examples, width, t, batch_size, batch_size)))
    np.testing.assert_array_equal(positions, every_epoch(np.arange(num_steps)))


def test_ditto_prox_keeps_v_near_w_and_lam_zero_is_fine_tuning():
    global_params, data = _problem(3)
    key = jax.random.PRNGKey(7)
    lr, lam, steps = 1 / 128, 64.0, 20  # lr * lam = 1/2: v - w contracts
    common = dict(learning_rates=(lr,), steps=(steps,), batch_size=4, key=key,
                  return_params=True)
    ditto = personalization.ditto(MODEL.apply, global_params, *data, lams=(0.0, lam), **common)
    fine = personalization.fine_tune(MODEL.apply, global_params, *data, **common)
    w = _as_numpy(global_params)
    ditto_kernel, ditto_bias = _as_numpy(ditto.params)
    fine_kernel, fine_bias = _as_numpy(fine.params)
    # lam = 0 adds 0 * (v - w) = 0 exactly: the same float32 arithmetic as fine-tuning.
    np.testing.assert_array_equal(ditto_kernel[0], fine_kernel[0])
    np.testing.assert_array_equal(ditto_bias[0], fine_bias[0])
    np.testing.assert_array_equal(ditto.test.correct[0], fine.test.correct[0])
    # v_{t+1} - w = (1 - lr lam)(v_t - w) - lr g_t, |g_t| <= max|x~| entrywise (cross-entropy
    # gradient: a batch mean of x~_j (p_k - y_k)): |v_t - w| <= max|x~| / lam.
    xmax = max(1.0, np.abs(data[0]).max())
    moved = max(np.abs(ditto_kernel[1] - w[0]).max(), np.abs(ditto_bias[1] - w[1]).max())
    assert moved <= xmax / lam * (1 + 1e-5)
    free = max(np.abs(fine_kernel[0] - w[0]).max(), np.abs(fine_bias[0] - w[1]).max())
    assert free > 2 * moved  # without the prox term v goes further
    assert ditto.client_steps == 5 * 2 * steps


def test_zero_steps_give_the_start_model_and_local_only_starts_from_the_initial_params():
    initial, data = _problem(4)
    train_x, train_y, rows, sizes, eval_x, eval_y, val_rows, val_n, test_rows, test_n = data
    result = personalization.local_only(MODEL.apply, initial, *data, learning_rates=(0.5, 0.1),
                                        steps=(0,), batch_size=2, key=jax.random.PRNGKey(0))
    for split, r, n in ((result.val, val_rows, val_n), (result.test, test_rows, test_n)):
        expected = fjp.metrics.client_accuracies(MODEL.apply, initial, eval_x, eval_y, r, n)
        for g in range(2):
            np.testing.assert_array_equal(split.correct[g, 0], expected.correct)
            np.testing.assert_array_equal(split.accuracy[g, 0], expected.accuracy)
            np.testing.assert_allclose(split.loss[g, 0], expected.loss, rtol=1e-6)
    np.testing.assert_array_equal(result.chosen_grid, 0)
    np.testing.assert_array_equal(result.chosen_steps, 0)
    assert result.client_steps == 0


def test_client_blocks_give_the_same_result():
    start, data = _problem(5, num_clients=5)
    options = dict(learning_rates=(0.25,), steps=(1, 4), batch_size=3, key=jax.random.PRNGKey(2),
                   return_params=True)
    whole = personalization.fine_tune(MODEL.apply, start, *data, **options)
    blocks = personalization.fine_tune(MODEL.apply, start, *data, client_block=2, **options)
    np.testing.assert_array_equal(blocks.val.correct, whole.val.correct)
    np.testing.assert_array_equal(blocks.test.correct, whole.test.correct)
    np.testing.assert_array_equal(blocks.chosen_grid, whole.chosen_grid)
    for a, b in zip(jax.tree_util.tree_leaves(blocks.params), jax.tree_util.tree_leaves(
            whole.params)):
        assert a.shape == b.shape and a.shape[:2] == (1, 5)
        np.testing.assert_array_equal(a, b)  # the same program on the same rows


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(learning_rates=()), "learning_rates must be a non-empty"),
        (dict(learning_rates=(0.1, -1.0)), r"learning_rates\[1\] must be > 0"),
        (dict(steps=(0, 3, 3)), "strictly increasing"),
        (dict(steps=(-1, 2)), r"steps\[0\] must be an integer >= 0"),
        (dict(steps=5), "steps must be a non-empty sequence"),
        (dict(steps=np.array([2, 1])), "strictly increasing"),
        (dict(prox=(0.0, 1.0)), "anchor_params is None"),
        (dict(prox=(-0.5,)), r"prox\[0\] must be >= 0"),
        (dict(batch_size=0), "batch_size"),
        (dict(client_block=0), "client_block"),
        (dict(anchor_params={"w": np.zeros(3)}, prox=(1.0,)), "structure"),
        (dict(val_sizes=np.array([3, 0, 4, 6, 2])), "val_sizes must be an integer vector"),
        (dict(test_indices=np.zeros((5, 6), np.int32)), "test_indices has 5 rows"),
        (dict(client_sizes=np.array([0, 1, 2, 5, 8, 9])), "client_sizes must lie in"),
        (dict(train_y=np.zeros(79, np.int32)), "train_x"),
    ],
)
def test_personalize_rejects_bad_arguments(change, message):
    start, data = _problem(6)
    names = ("train_x", "train_y", "client_indices", "client_sizes", "eval_x", "eval_y",
             "val_indices", "val_sizes", "test_indices", "test_sizes")
    arguments = dict(zip(names, data), learning_rates=(0.1,), steps=(0, 1), batch_size=2,
                     key=jax.random.PRNGKey(0))
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        personalization.personalize(MODEL.apply, start, **arguments)


def test_wrappers_take_the_ten_data_arguments():
    start, data = _problem(6)
    with pytest.raises(ValueError, match="10 data arguments"):
        personalization.fine_tune(MODEL.apply, start, *data[:9], learning_rates=(0.1,),
                                  steps=(1,), batch_size=2, key=jax.random.PRNGKey(0))
