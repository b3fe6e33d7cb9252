"""Personalisation baselines: every client's own model, from the global model or from scratch.

After a run, each of the M training clients personalises a model on its own training examples;
its validation examples choose the hyperparameters (learning rate, Ditto's lam, number of steps)
and its test examples report the result. The three baselines personalisation is compared with:

* fine-tuning: k local SGD steps on F_i from the final global model w;
* Ditto (Li, Hu, Beirami and Smith, ICML 2021): a personal model v_i minimising
  h_i(v) = F_i(v) + (lam / 2) ||v - w||^2 by SGD started at w;
* local training only: the same SGD from the run's initial params (no federation).

They are one kernel, `personalize` (start params, optional prox anchor, a grid of learning
rates x lams, checkpoints in steps), run for all clients and all grid points in one jitted
program: vmap over the grid and the clients, `lax.scan` over the checkpoints with the SGD
steps of each segment in a loop, every checkpoint's model evaluated by
`metrics.client_sums` (the code of `metrics.client_accuracies`). `fine_tune`, `ditto` and
`local_only` are the kernel with the start/anchor each baseline prescribes.

The minibatches (`personal_schedule`): client i's step t takes the examples at slots
t * B, ..., t * B + B - 1 of an endless sequence of epochs, each a fresh permutation of its n_i
examples (epoch e's permutation from the client's key folded with e; the client's key is `key`
folded with its index i). So k steps see k * B examples for every client whatever its size
(a client with n_i < B sees some examples twice in one batch), and every grid point and
checkpoint of a client sees the same sequence (common random numbers across the grid).

Memory: the program holds G * M copies of the params (and, during a step, their gradients
and one batch of B examples' activations for each of the G * M (grid point, client) pairs),
G = len(learning_rates) * len(prox). `client_block` runs the clients in blocks of that many
(one compiled program, the last block padded with empty clients): G * block copies instead;
the results are the same, as every client's randomness depends only on its index.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals import _validation, metrics


# ----------------------------------------------------------------------------
# The minibatch schedule.


def epochs_per_step(batch_size: int, min_examples: int) -> int:
    """How many epochs one step's batch of B slots can touch when a client has n >= min_examples
    examples: floor((B - 1) / n) + 2 (a partial epoch, whole ones, a partial one), at most B."""
    return min(batch_size, (batch_size - 1) // max(int(min_examples), 1) + 2)


def _epoch_permutation(key: chex.PRNGKey, epoch: jax.Array, num_examples: jax.Array, width: int):
    """Epoch `epoch`'s order of the client's n examples: (width,) positions, the first n a
    uniform random permutation of range(n) (the rest the padding positions)."""
    noise = jax.random.uniform(jax.random.fold_in(key, epoch), (width,))
    return jnp.argsort(jnp.where(jnp.arange(width) < num_examples, noise, 2.0)).astype(jnp.int32)


def step_positions(
    key: chex.PRNGKey, num_examples: jax.Array, width: int, step: jax.Array, batch_size: int,
    num_epochs: int,
) -> jax.Array:
    """Step `step`'s batch: (batch_size,) positions into the client's index row (of `width`).

    Slot j of the batch is example c = step * B + j of the epoch sequence: position
    perm_{c // n}[c % n]. `num_epochs` (static) bounds the epochs one batch touches
    (`epochs_per_step`); only those permutations are drawn. A client with n = 0 gets position
    0 everywhere (its steps are skipped).
    """
    n = jnp.maximum(num_examples, 1)
    slots = step * batch_size + jnp.arange(batch_size)
    first = (step * batch_size) // n
    perms = jax.vmap(lambda q: _epoch_permutation(key, first + q, num_examples, width))(
        jnp.arange(num_epochs))
    return perms[slots // n - first, slots % n]


def personal_schedule(
    key: chex.PRNGKey, client: int, num_examples: int, width: int, num_steps: int,
    batch_size: int,
) -> np.ndarray:
    """Client `client`'s first `num_steps` batches in `personalize` with this `key`:
    (num_steps, batch_size) positions in [0, num_examples) into its index row (of `width`,
    the width of the client_indices given to personalize: the draws depend on it). For
    references and tests; personalize draws the same positions step by step.
    """
    num_epochs = epochs_per_step(batch_size, num_examples)
    return np.asarray(_schedule(width, num_steps, batch_size, num_epochs)(
        key, client, num_examples))


@functools.cache
def _schedule(width: int, num_steps: int, batch_size: int, num_epochs: int) -> Callable:
    def schedule(key, client, num_examples):
        client_key = jax.random.fold_in(key, client)
        return jax.vmap(lambda t: step_positions(
            client_key, num_examples, width, t, batch_size, num_epochs))(jnp.arange(num_steps))

    return jax.jit(schedule)


# ----------------------------------------------------------------------------
# The kernel.


class PersonalizationResult(NamedTuple):
    """What `personalize` returns; G grid points (g = i_lr * len(prox) + i_prox), S
    checkpoints, M clients.

    learning_rates, prox: (G,) each grid point's learning rate and lam.
    steps: (S,) the checkpoints (numbers of SGD steps).
    val, test: `metrics.ClientEvaluation`s with fields of shape (G, S, M): every client's
      model at every grid point and checkpoint on its validation / test examples.
    chosen_grid, chosen_checkpoint: (M,) the (grid point, checkpoint index) of best validation
      accuracy per client; ties go to the fewest steps, then to the first grid point (so a
      client without validation examples gets checkpoint 0 of grid point 0).
    chosen_steps, chosen_learning_rate, chosen_prox: (M,) those settings.
    chosen_val_accuracy, chosen_test_accuracy: (M,) the chosen model's accuracies.
    client_steps: minibatch SGD steps spent, (clients with training examples) * G * max(steps).
    params: with return_params, the params after max(steps) steps, leaves (G, M, ...); else None.
    """

    learning_rates: np.ndarray
    prox: np.ndarray
    steps: np.ndarray
    val: metrics.ClientEvaluation
    test: metrics.ClientEvaluation
    chosen_grid: np.ndarray
    chosen_checkpoint: np.ndarray
    chosen_steps: np.ndarray
    chosen_learning_rate: np.ndarray
    chosen_prox: np.ndarray
    chosen_val_accuracy: np.ndarray
    chosen_test_accuracy: np.ndarray
    client_steps: int
    params: Any = None


def _mean_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1)[:, 0])


@functools.cache
def _compiled_personalization(
    apply_fn: Callable, batch_size: int, num_epochs: int, eval_batch_size: int,
    return_params: bool,
):
    """The jitted kernel for all clients of a block and all grid points (data as arguments:
    compiled once per shape, cached by apply_fn and the static settings).

    The model's convolutions run as patches times kernel (`engine.convs.matmul_convs`): vmapped
    over clients and grid points with per-lane kernels they would be grouped convolutions,
    which JAX's batching rule cannot nest (a NotImplementedError for a kernel batched over the
    grid around one batched over clients) and GPUs run slowly
    (docs/decisions/0106-vmapped-convolutions-as-matmuls.md)."""
    from fedjax_pals.engine.convs import matmul_convs

    apply_fn = matmul_convs(apply_fn)

    @jax.jit
    def run(start, anchor, lrs, lams, bounds, client_ids, key, train_x, train_y, rows, sizes,
            eval_x, eval_y, val_rows, val_sizes, test_rows, test_sizes):
        width = rows.shape[1]

        def one(lr, lam, client, row, n, val_row, val_n, test_row, test_n):
            client_key = jax.random.fold_in(key, client)

            def loss_fn(v, bx, by):
                sq = sum(jnp.sum(jnp.square(a - b)) for a, b in zip(
                    jax.tree_util.tree_leaves(v), jax.tree_util.tree_leaves(anchor)))
                return _mean_cross_entropy(apply_fn(v, bx), by) + 0.5 * lam * sq

            def step(t, v):
                idx = row[step_positions(client_key, n, width, t, batch_size, num_epochs)]
                grads = jax.grad(loss_fn)(v, train_x[idx], train_y[idx])
                new = jax.tree_util.tree_map(lambda p, g: p - lr * g, v, grads)
                return jax.tree_util.tree_map(lambda a, b: jnp.where(n > 0, a, b), new, v)

            def segment(v, bound):
                v = jax.lax.fori_loop(bound[0], bound[1], step, v)
                evaluate = lambda r, s: metrics.client_sums(
                    apply_fn, v, eval_x, eval_y, r, s, eval_batch_size)
                return v, (*evaluate(val_row, val_n), *evaluate(test_row, test_n))

            v, sums = jax.lax.scan(segment, start, bounds)
            return (v if return_params else None), sums

        clients = jax.vmap(one, in_axes=(None, None, 0, 0, 0, 0, 0, 0, 0))
        grid = jax.vmap(clients, in_axes=(0, 0) + (None,) * 7)
        return grid(lrs, lams, client_ids, rows, sizes, val_rows, val_sizes, test_rows,
                    test_sizes)

    return run


def _check_grid(name: str, values: Any, check: Callable[[str, Any], Any]) -> tuple:
    if isinstance(values, np.ndarray) and values.ndim == 1:
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name} must be a non-empty sequence, got {values!r}.")
    return tuple(check(f"{name}[{i}]", value) for i, value in enumerate(values))


def personalize(
    apply_fn: Callable,
    start_params: chex.ArrayTree,
    train_x: chex.Array,
    train_y: chex.Array,
    client_indices: chex.Array,
    client_sizes: chex.Array,
    eval_x: chex.Array,
    eval_y: chex.Array,
    val_indices: chex.Array,
    val_sizes: chex.Array,
    test_indices: chex.Array,
    test_sizes: chex.Array,
    *,
    learning_rates: Sequence[float],
    steps: Sequence[int],
    prox: Sequence[float] = (0.0,),
    anchor_params: chex.ArrayTree | None = None,
    batch_size: int,
    key: chex.PRNGKey,
    eval_batch_size: int = 256,
    client_block: int | None = None,
    return_params: bool = False,
) -> PersonalizationResult:
    """Per-client SGD from `start_params` over a grid, evaluated at checkpoints, all clients in
    one jitted program.

    For every client i (training examples train_x[client_indices[i, :client_sizes[i]]]) and
    every grid point (eta, lam) in learning_rates x prox, starting from v_0 = start_params:

        v_{t+1} = v_t - eta * grad_v [ (1/B) sum_{j in batch_t} CE(f(v_t, x_j), y_j)
                                       + (lam / 2) ||v_t - anchor||^2 ]

    (plain SGD, batches of B = batch_size from `personal_schedule`); a client without training
    examples keeps start_params. After steps[0] < steps[1] < ... steps (0: the start model),
    v is evaluated on the client's validation and test examples (eval_x / eval_y at
    val_indices / test_indices rows, padded like client_indices; sizes may be 0: NaN). The
    per-client choice is the (grid point, checkpoint) of best validation accuracy (ties: the
    fewest steps, then the first grid point). See `PersonalizationResult`, and the module
    docstring for the memory (G * M params and gradients; `client_block` bounds it).

    The inputs are the splits as stored (x in its dtype: pass a model that takes it,
    `models.model_for_data`); `key` seeds the minibatch schedule; `eval_batch_size` is the
    per-client batch of the evaluation (`metrics.client_accuracies`); anchor_params is needed
    when some lam > 0 (Ditto: the global model).

    Raises:
      ValueError: an empty or invalid grid, steps not increasing or negative, lam > 0 without
        anchor_params, an anchor of another structure, shapes that do not fit (named).
    """
    if not callable(apply_fn):
        raise ValueError(f"apply_fn must be callable, got {apply_fn!r}.")
    lrs = _check_grid("learning_rates", learning_rates, _validation.check_positive)
    lams = _check_grid("prox", prox, _validation.check_nonnegative)
    checkpoints = _check_grid(
        "steps", steps, lambda name, s: _validation.check_integer(name, s, 0))
    if any(b <= a for a, b in zip(checkpoints, checkpoints[1:])):
        raise ValueError(f"steps must be strictly increasing, got {tuple(steps)}.")
    batch_size = _validation.check_integer("batch_size", batch_size, 1)
    eval_batch_size = _validation.check_integer("eval_batch_size", eval_batch_size, 1)
    return_params = _validation.check_flag("return_params", return_params)
    num_train = metrics.check_examples("train_x", train_x, "train_y", train_y)
    num_eval = metrics.check_examples("eval_x", eval_x, "eval_y", eval_y)
    rows, sizes = metrics.check_client_sets("client_indices", client_indices, client_sizes,
                                            num_train)
    num_clients = rows.shape[0]
    val_rows, val_n = metrics.check_client_sets("val_indices", val_indices, val_sizes,
                                                num_eval, num_clients)
    test_rows, test_n = metrics.check_client_sets("test_indices", test_indices, test_sizes,
                                                  num_eval, num_clients)
    if anchor_params is None:
        if any(lam > 0 for lam in lams):
            raise ValueError("anchor_params is None but prox has a lam > 0: give the anchor "
                             "(Ditto's global model).")
        anchor_params = start_params  # multiplied by lam = 0
    else:
        start_def, anchor_def = map(jax.tree_util.tree_structure, (start_params, anchor_params))
        shapes = lambda tree: [np.shape(leaf) for leaf in jax.tree_util.tree_leaves(tree)]
        if start_def != anchor_def or shapes(start_params) != shapes(anchor_params):
            raise ValueError("anchor_params must have the structure and shapes of start_params.")
    block = num_clients if client_block is None else _validation.check_integer(
        "client_block", client_block, 1)
    block = min(block, num_clients)

    trained = sizes > 0
    # Static: the program is compiled per value (it changes with the smallest client's size).
    num_epochs = epochs_per_step(batch_size, sizes[trained].min() if trained.any() else 1)
    program = _compiled_personalization(
        apply_fn, batch_size, num_epochs, eval_batch_size, return_params)
    grid_lr = np.repeat(np.asarray(lrs, np.float64), len(lams))
    grid_lam = np.tile(np.asarray(lams, np.float64), len(lrs))
    bounds = np.stack([(0, *checkpoints[:-1]), checkpoints], axis=1).astype(np.int32)
    shared = (start_params, anchor_params, grid_lr.astype(np.float32),
              grid_lam.astype(np.float32), bounds)

    num_blocks = -(-num_clients // block)
    padded = num_blocks * block
    pad = lambda a: np.concatenate([a, np.zeros((padded - len(a), *a.shape[1:]), a.dtype)])
    ids, rows, sizes_p, val_rows, val_n_p, test_rows, test_n_p = map(
        pad, (np.arange(num_clients, dtype=np.int32), rows, sizes, val_rows, val_n, test_rows,
              test_n))
    train_x, train_y, eval_x, eval_y = jax.device_put((train_x, train_y, eval_x, eval_y))
    outputs = []
    for b in range(num_blocks):
        part = slice(b * block, (b + 1) * block)
        outputs.append(jax.device_get(program(
            *shared, ids[part], key, train_x, train_y, rows[part], sizes_p[part], eval_x, eval_y,
            val_rows[part], val_n_p[part], test_rows[part], test_n_p[part])))
    # Each block: params leaves (G, block, ...), sums (G, block, S) -> concatenated, trimmed.
    concat = lambda *parts: np.concatenate(parts, axis=1)[:, :num_clients]
    final_params, sums = jax.tree_util.tree_map(concat, *outputs)
    val_correct, val_loss, test_correct, test_loss = (np.moveaxis(a, 2, 1) for a in sums)
    val = metrics.finish_client_evaluation(val_correct, val_n, val_loss)
    test = metrics.finish_client_evaluation(test_correct, test_n, test_loss)

    # Best validation accuracy; candidates ordered checkpoint-major so that argmax's first
    # maximum is the fewest steps, then the first grid point (the counts are the client's).
    num_grid, num_checkpoints = len(grid_lr), len(checkpoints)
    flat = np.moveaxis(val.correct, 0, 1).reshape(num_checkpoints * num_grid, num_clients)
    best = np.argmax(flat, axis=0)
    chosen_checkpoint, chosen_grid = np.divmod(best, num_grid)
    clients = np.arange(num_clients)
    return PersonalizationResult(
        learning_rates=grid_lr,
        prox=grid_lam,
        steps=np.asarray(checkpoints, np.int64),
        val=val,
        test=test,
        chosen_grid=chosen_grid,
        chosen_checkpoint=chosen_checkpoint,
        chosen_steps=np.asarray(checkpoints, np.int64)[chosen_checkpoint],
        chosen_learning_rate=grid_lr[chosen_grid],
        chosen_prox=grid_lam[chosen_grid],
        chosen_val_accuracy=val.accuracy[chosen_grid, chosen_checkpoint, clients],
        chosen_test_accuracy=test.accuracy[chosen_grid, chosen_checkpoint, clients],
        client_steps=int(trained.sum()) * num_grid * checkpoints[-1],
        params=final_params if return_params else None,
    )


# ----------------------------------------------------------------------------
# The three baselines.

_DATA = ("train_x, train_y, client_indices, client_sizes, eval_x, eval_y, val_indices, "
         "val_sizes, test_indices, test_sizes")


def _data(name: str, data: tuple) -> tuple:
    if len(data) != 10:
        raise ValueError(f"{name} takes the 10 data arguments of personalize ({_DATA}), "
                         f"got {len(data)}.")
    return data


def fine_tune(
    apply_fn: Callable, global_params: chex.ArrayTree, *data: chex.Array,
    learning_rates: Sequence[float], steps: Sequence[int], batch_size: int, key: chex.PRNGKey,
    **options: Any,
) -> PersonalizationResult:
    """Fine-tuning: plain SGD on the client's data from the final global model w
    (`personalize` with start w, no prox); the learning rate and the number of steps chosen
    per client on its validation examples. `data`: personalize's 10 data arguments, in its
    order; `options`: its eval_batch_size, client_block, return_params."""
    return personalize(apply_fn, global_params, *_data("fine_tune", data),
                       learning_rates=learning_rates, steps=steps, batch_size=batch_size,
                       key=key, **options)


def ditto(
    apply_fn: Callable, global_params: chex.ArrayTree, *data: chex.Array,
    lams: Sequence[float], learning_rates: Sequence[float], steps: Sequence[int],
    batch_size: int, key: chex.PRNGKey, **options: Any,
) -> PersonalizationResult:
    """Ditto's personal models (Li et al., ICML 2021, eq. 2): v_i minimising
    F_i(v) + (lam / 2) ||v - w*||^2 by SGD started at w*, with w* the final global model
    (`personalize` with start = anchor = global_params, prox = lams); lam, the learning rate
    and the number of steps chosen per client on its validation examples.

    A solver choice: Ditto's Algorithm 1 interleaves the personal steps with the global rounds
    (each round's v_i steps are taken against that round's w^t); here they are taken after
    training, against the final w, which approximates w* by it. The objective is the same.
    Ditto tunes lam per data set; the grid is the caller's (no default here). `data` and
    `options` as in `fine_tune`."""
    return personalize(apply_fn, global_params, *_data("ditto", data),
                       learning_rates=learning_rates, steps=steps, prox=lams,
                       anchor_params=global_params, batch_size=batch_size, key=key, **options)


def local_only(
    apply_fn: Callable, initial_params: chex.ArrayTree, *data: chex.Array,
    learning_rates: Sequence[float], steps: Sequence[int], batch_size: int, key: chex.PRNGKey,
    **options: Any,
) -> PersonalizationResult:
    """Local training only (no federation): the same SGD as `fine_tune` from the run's initial
    params instead of the global model. `data` and `options` as in `fine_tune`."""
    return personalize(apply_fn, initial_params, *_data("local_only", data),
                       learning_rates=learning_rates, steps=steps, batch_size=batch_size,
                       key=key, **options)


# ----------------------------------------------------------------------------
# The registry of personalisations (config evaluation.personalization).


class PersonalizationContext(NamedTuple):
    """What a registered personalisation reads of a finished run.

    apply_fn: the run's model (taking the data as stored); global_params: the final global
      model (`FederatedAlgorithm.eval_params` of the final state); initial_params: the run's
      initial params; data: `personalize`'s 10 data arguments, in its order (the clients'
      training examples and their validation and test sets); evaluation: the run's resolved
      `evaluation` section (its grids: fine_tuning_steps, fine_tuning_learning_rates,
      ditto_lams, local_steps); learning_rate, batch_size: the run's local training; key: the
      mode's own key (a function of the run's seed and the mode's name).
    """

    apply_fn: Callable
    global_params: chex.ArrayTree
    initial_params: chex.ArrayTree
    data: tuple
    evaluation: Any
    learning_rate: float
    batch_size: int
    key: chex.PRNGKey


@dataclasses.dataclass(frozen=True)
class Personalization:
    """A way of giving every client its own model after training (evaluation.personalization).

    name: its config name; personalize(context: PersonalizationContext) ->
    PersonalizationResult (each client's choice made on its validation set); label: its row
    in the per-client report, after the method's label ("+ fine-tuning"), or the whole row
    when `federated` is False; federated: False for a mode that does not use the federated
    model (local training), whose row is the same whatever the method.
    """

    name: str
    personalize: Callable[[PersonalizationContext], PersonalizationResult]
    label: str | None = None
    federated: bool = True

    def __post_init__(self) -> None:
        _validation.check_registered_name("personalisation", self.name)
        _validation.check_hook(f"personalisation {self.name!r}", "personalize",
                               self.personalize, "(context) -> PersonalizationResult")

    def row(self, method_label: str) -> str:
        """Its row in the per-client report."""
        label = self.label or f"+ {self.name}"
        return f"{method_label} {label}" if self.federated else label


_PERSONALIZATIONS: dict[str, Personalization] = {}


def register_personalization(mode: Personalization, *, replace: bool = False) -> Personalization:
    """Registers `mode` under its name, for `config.evaluation.personalization` (its grids are
    the evaluation section's, which a user's mode may read from its context)."""
    from fedjax_pals import extensions

    if not isinstance(mode, Personalization):
        raise TypeError("register_personalization takes a fedjax_pals.Personalization, got "
                        f"{type(mode).__name__}.")
    if mode.name in _PERSONALIZATIONS and not replace:
        raise ValueError(f"a personalisation {mode.name!r} is already registered.")
    _PERSONALIZATIONS[mode.name] = mode
    extensions.note_registration("personalization", mode.name)
    return mode


def registered_personalizations() -> dict[str, Personalization]:
    """The registered personalisations, in registration order."""
    return dict(_PERSONALIZATIONS)


def _fine_tuning(c: PersonalizationContext) -> PersonalizationResult:
    return fine_tune(c.apply_fn, c.global_params, *c.data,
                     learning_rates=c.evaluation["fine_tuning_learning_rates"],
                     steps=c.evaluation["fine_tuning_steps"], batch_size=c.batch_size, key=c.key)


def _ditto(c: PersonalizationContext) -> PersonalizationResult:
    return ditto(c.apply_fn, c.global_params, *c.data, lams=c.evaluation["ditto_lams"],
                 learning_rates=(c.learning_rate,), steps=c.evaluation["fine_tuning_steps"],
                 batch_size=c.batch_size, key=c.key)


def _local(c: PersonalizationContext) -> PersonalizationResult:
    return local_only(c.apply_fn, c.initial_params, *c.data,
                      learning_rates=c.evaluation["fine_tuning_learning_rates"],
                      steps=c.evaluation["local_steps"], batch_size=c.batch_size, key=c.key)


for _mode in (
    Personalization("fine_tuning", _fine_tuning, "+ fine-tuning"),
    Personalization("ditto", _ditto, "+ Ditto"),
    Personalization("local", _local, "local only", federated=False),
):
    register_personalization(_mode)
