"""What the tests of the methods (tests/test_<method>.py) share: tiny label-shift tasks, rounds
of an algorithm through the engine, one local step, tree comparisons."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedjax_pals as fjp
from fedjax_pals.engine.client_update import LocalCarry, make_local_step

LR = 0.1
DIM, K = 4, 3
TRAINING = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=LR)


def tree_close(a, b, atol=0.0, rtol=0.0):
    return all(
        np.allclose(np.asarray(u), np.asarray(v), atol=atol, rtol=rtol)
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def tree_equal(a, b):
    return all(
        np.array_equal(np.asarray(u), np.asarray(v))
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def tree_norm(tree):
    return float(jnp.sqrt(sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(tree))))


def tree_sub(a, b):
    return jax.tree_util.tree_map(jnp.subtract, a, b)


def label_task(label_counts, seed=0, pool=60):
    """Gaussian classes in DIM dims; a partition with the given (clients + target) label counts."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=2.0, size=(K, DIM))
    train_y = np.repeat(np.arange(K), pool).astype(np.int32)
    test_y = np.repeat(np.arange(K), 20).astype(np.int32)
    train_x = (means[train_y] + rng.normal(size=(len(train_y), DIM))).astype(np.float32)
    partition = fjp.data.partition_from_label_counts(
        train_y, test_y, np.asarray(label_counts), seed=seed, description="test task"
    )
    return train_x, train_y, partition


def task_data(train_x, train_y, partition):
    return fjp.engine.device_data(
        train_x,
        train_y,
        partition.client_indices,
        partition.client_sizes,
        partition.client_label_dists,
    )


def synthetic():
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    model = fjp.logistic_regression((2,), 3)
    return task_data(dataset.train.x, dataset.train.y, partition), partition, model


def run(
    algorithm, data, model, training=None, *, rounds, participants=None, backend="vmap_scan", seed=0
):
    """Rounds of `algorithm`; returns (states after each round incl. the initial, metrics)."""
    training = TRAINING if training is None else training
    num_clients = int(data.client_sizes.shape[0])
    engine = fjp.engine.round_engine(algorithm, model, training, backend=backend)
    state = fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(seed)), num_clients)
    states, metrics = [state], []
    for r in range(rounds):
        who = np.arange(num_clients) if participants is None else participants(r)
        state, m = engine.run_round(
            data,
            state,
            jnp.asarray(who, jnp.int32),
            jax.random.fold_in(jax.random.PRNGKey(seed + 1), r),
        )
        states.append(state)
        metrics.append(m)
    return states, metrics


def _softmax64(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _one_local_step(algorithm, model, params, state, x, y, info, lr):
    """One local SGD step of `algorithm`'s client from `params` (state.params is w^t)."""
    optimizer = optax.sgd(lr)
    step = make_local_step(algorithm, model, optimizer)
    zero = jnp.zeros((), jnp.float32)
    carry = LocalCarry(params, optimizer.init(params), jnp.zeros((), jnp.int32), zero, zero)
    mask = jnp.ones(len(y), bool)
    return step(carry, jnp.asarray(x), jnp.asarray(y), mask, info, state).params
