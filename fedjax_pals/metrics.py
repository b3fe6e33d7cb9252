"""Classification metrics of the global model on the target sets, and per-client accuracies
(every client's model on its own examples, in one compiled program) with their summary."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals import _validation


def confusion_matrix(
    labels: chex.Array, predictions: chex.Array, num_classes: int, mask: chex.Array | None = None
) -> jax.Array:
    """(K, K) counts, rows true class, columns predicted class; masked entries ignored."""
    weights = jnp.ones_like(labels, jnp.int32) if mask is None else mask.astype(jnp.int32)
    flat = labels * num_classes + predictions
    return jnp.bincount(flat, weights=weights, length=num_classes * num_classes).reshape(
        num_classes, num_classes
    )


def accuracy_from_confusion(confusion: np.ndarray) -> float:
    total = confusion.sum()
    return float(np.trace(confusion) / total) if total else float("nan")


# The classes macro-F1 averages over, as results.json records it (`macro_f1_classes`; a
# results.json without the key is of a version that averaged over the classes in the labels or
# the predictions).
MACRO_F1_CLASSES = "present in the labels"


def macro_f1_from_confusion(confusion: np.ndarray) -> float:
    """Mean F1 over the classes present in the labels (the rows of `confusion` with support).

    F1_k = 2 TP_k / (2 TP_k + FP_k + FN_k), averaged over the classes k that occur in the
    evaluated set's labels: scikit-learn's `f1_score(y, p, labels=np.unique(y),
    average="macro")`. Under label shift the target lacks some classes; a prediction of such a
    class is an error of the true class (its FN, lowering its recall), but the absent class is
    not itself averaged in as F1 = 0 (which would put a model 99 % accurate on 3 classes that
    strays once into each of 4 absent ones at 42 %). A class of the labels never predicted
    counts, with F1 = 0. NaN for an empty set.
    """
    confusion = np.asarray(confusion, np.float64)
    true_pos = np.diag(confusion)
    support = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    present = support > 0
    if not present.any():
        return float("nan")
    f1 = 2 * true_pos[present] / (support[present] + predicted[present])
    return float(f1.mean())


class Scores(dict):
    """{"accuracy", "macro_f1", "loss"} of a model on a set (`RestoredRun.evaluate`): accuracy
    and macro-F1 are fractions in [0, 1], as results.json records them (the screen and the
    tables show them in percent: 0.969 is 96.9 %); loss is the mean cross-entropy in nats. A
    plain dict (equal to one, JSON-ready) whose repr shows the percentages beside the fractions:
    Scores(accuracy=0.969 (96.9%), macro_f1=0.9545 (95.5%), loss=0.1311).

    `make_evaluator`'s carry two attributes besides (not keys): `predicted`, the number of
    examples predicted as each class, and `support`, the number labelled with each (the
    confusion matrix's column and row sums, int64 (K,)); None elsewhere."""

    PERCENT = ("accuracy", "macro_f1")
    predicted: np.ndarray | None = None
    support: np.ndarray | None = None

    def __repr__(self) -> str:
        parts = []
        for name, value in self.items():
            text = f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value!r}"
            if name in self.PERCENT and isinstance(value, float) and np.isfinite(value):
                text += f" ({100 * value:.1f}%)"
            parts.append(text)
        return f"Scores({', '.join(parts)})"

    __str__ = __repr__


@functools.cache
def _compiled_evaluation(apply_fn: Callable, num_classes: int):
    """(params, xs, ys, mask) -> (confusion, mean loss), batches scanned in one jit.

    The data are arguments, not closed-over constants, so every evaluator of
    one model shares one compilation per set shape.
    """

    @jax.jit
    def evaluate(params, xs, ys, mask):
        def body(carry, batch):
            confusion, loss_sum = carry
            bx, by, bm = batch
            logits = apply_fn(params, bx)
            losses = -jnp.take_along_axis(jax.nn.log_softmax(logits), by[:, None], axis=1)[:, 0]
            confusion = confusion + confusion_matrix(by, jnp.argmax(logits, -1), num_classes, bm)
            return (confusion, loss_sum + jnp.sum(jnp.where(bm, losses, 0.0))), None

        init = (jnp.zeros((num_classes, num_classes), jnp.int32), jnp.zeros((), jnp.float32))
        (confusion, loss_sum), _ = jax.lax.scan(body, init, (xs, ys, mask))
        return confusion, loss_sum / jnp.maximum(jnp.sum(mask), 1)

    return evaluate


def make_evaluator(
    apply_fn: Callable, x: chex.Array, y: chex.Array, num_classes: int, batch_size: int = 1024
) -> Callable[[chex.ArrayTree], dict]:
    """An evaluator of `params` on a fixed labelled set, compiled once.

    The set is padded to whole batches and kept on the device; each call scans
    the batches inside one jit and returns {"accuracy", "macro_f1", "loss"}, a `Scores` with
    the predictions and labels per class as its `predicted` and `support`.
    """
    num = int(len(y))
    if num == 0:
        raise ValueError("cannot evaluate on an empty set.")
    batch_size = min(batch_size, num)
    num_batches = -(-num // batch_size)
    pad = num_batches * batch_size - num
    xs = jnp.asarray(np.concatenate([np.asarray(x), np.zeros((pad, *np.shape(x)[1:]), np.float32)]))
    ys = jnp.asarray(np.concatenate([np.asarray(y), np.zeros((pad,), np.int32)]))
    xs = xs.reshape(num_batches, batch_size, *xs.shape[1:])
    ys = ys.reshape(num_batches, batch_size)
    mask = (jnp.arange(num_batches * batch_size) < num).reshape(num_batches, batch_size)

    def evaluate(params) -> dict:
        confusion, loss = jax.device_get(
            _compiled_evaluation(apply_fn, num_classes)(params, xs, ys, mask)
        )
        scores = Scores(
            accuracy=accuracy_from_confusion(confusion),
            macro_f1=macro_f1_from_confusion(confusion),
            loss=float(loss),
        )
        scores.predicted = np.asarray(confusion, np.int64).sum(axis=0)
        scores.support = np.asarray(confusion, np.int64).sum(axis=1)
        return scores

    return evaluate


# ----------------------------------------------------------------------------
# Per-client evaluation: every client's model on its own (padded) row of examples.


class ClientEvaluation(NamedTuple):
    """Per-client results of `client_accuracies`, NumPy arrays of shape (M,).

    correct: int64, examples whose argmax prediction equals the label.
    count: int64, examples evaluated (the client's size).
    loss: float64, mean cross-entropy over them (NaN where count is 0).
    accuracy: float64, correct / count (NaN where count is 0).
    """

    correct: np.ndarray
    count: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray


def client_sums(
    apply_fn: Callable, params: chex.ArrayTree, x: jax.Array, y: jax.Array,
    row: jax.Array, size: jax.Array, batch_size: int,
) -> tuple[jax.Array, jax.Array]:
    """One client's (number correct, sum of cross-entropies) over x[row[:size]], traceable.

    The row (V,) is cut into ceil(V / b) batches of b = min(batch_size, V) positions (the
    last padded), scanned; x keeps its stored dtype and is gathered batch by batch, so only
    b examples of the client are materialised at a time. Positions >= size are masked (their
    index is replaced by 0, so any padding value is safe). `client_accuracies` vmaps this over
    the clients and `personalization.personalize` over clients and its grid: the one
    definition of a client's evaluation.
    """
    width = row.shape[0]
    if width == 0:
        return jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32)
    b = min(batch_size, width)
    num_batches = -(-width // b)
    rows = jnp.pad(row, (0, num_batches * b - width)).reshape(num_batches, b)
    valid = (jnp.arange(num_batches * b) < size).reshape(num_batches, b)

    def body(carry, batch):
        correct, loss_sum = carry
        idx, mask = batch
        idx = jnp.where(mask, idx, 0)
        by = y[idx]
        logits = apply_fn(params, x[idx])
        losses = -jnp.take_along_axis(jax.nn.log_softmax(logits), by[:, None], axis=1)[:, 0]
        hits = mask & (jnp.argmax(logits, -1) == by)
        return (correct + jnp.sum(hits, dtype=jnp.int32),
                loss_sum + jnp.sum(jnp.where(mask, losses, 0.0))), None

    init = (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32))
    (correct, loss_sum), _ = jax.lax.scan(body, init, (rows, valid))
    return correct, loss_sum


@functools.cache
def _compiled_client_evaluation(apply_fn: Callable, per_client_params: bool, batch_size: int):
    """(params, x, y, indices, sizes) -> (correct (M,), loss_sum (M,)), one jit for all
    clients (vmap over clients, scan over batches), compiled once per shape; the data are
    arguments, as in `_compiled_evaluation`."""

    if per_client_params:  # per-lane kernels: no grouped convolutions (see personalization)
        from fedjax_pals.engine.convs import matmul_convs

        apply_fn = matmul_convs(apply_fn)

    @jax.jit
    def evaluate(params, x, y, indices, sizes):
        one = lambda p, row, size: client_sums(apply_fn, p, x, y, row, size, batch_size)
        return jax.vmap(one, in_axes=(0 if per_client_params else None, 0, 0))(
            params, indices, sizes)

    return evaluate


def check_client_sets(
    name: str, indices: Any, sizes: Any, num_examples: int, num_clients: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Padded per-client index rows (M, V) and their sizes (M,), as NumPy int arrays: sizes in
    [0, V], the valid entries (row i's first sizes[i]) in [0, num_examples). `name` is the
    indices' argument name ("val_indices"); the sizes are named after it ("val_sizes")."""
    sizes_name = name.replace("indices", "sizes")
    idx = np.asarray(indices)
    if idx.ndim != 2 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
        raise ValueError(
            f"{name} must be an integer (num_clients, width) matrix, got shape {idx.shape} "
            f"and dtype {idx.dtype}.")
    if idx.shape[0] == 0:
        raise ValueError(f"{name} has no clients (shape {idx.shape}).")
    if num_clients is not None and idx.shape[0] != num_clients:
        raise ValueError(f"{name} has {idx.shape[0]} rows but there are {num_clients} clients.")
    size = np.asarray(sizes)
    if size.shape != (idx.shape[0],) or not np.issubdtype(size.dtype, np.integer):
        raise ValueError(
            f"{sizes_name} must be an integer vector of shape ({idx.shape[0]},) (one per row of "
            f"{name}), got shape {size.shape} and dtype {size.dtype}.")
    if (size < 0).any() or (size > idx.shape[1]).any():
        bad = np.flatnonzero((size < 0) | (size > idx.shape[1]))[:5]
        raise ValueError(
            f"{sizes_name} must lie in [0, {idx.shape[1]}] (the width of {name}); clients "
            f"{bad.tolist()} have {size[bad].tolist()}.")
    valid = np.arange(idx.shape[1])[None, :] < size[:, None]
    if valid.any() and ((idx[valid] < 0).any() or (idx[valid] >= num_examples).any()):
        bad = idx[valid][(idx[valid] < 0) | (idx[valid] >= num_examples)][:5]
        raise ValueError(
            f"{name} holds indices outside [0, {num_examples}) in its valid entries: "
            f"{bad.tolist()}.")
    return idx.astype(np.int32), size.astype(np.int32)


def check_examples(x_name: str, x: Any, y_name: str, y: Any) -> int:
    """A split's inputs (N, ...) and int labels (N,): the number of examples N."""
    if np.ndim(y) != 1 or np.ndim(x) < 1 or np.shape(x)[0] != np.shape(y)[0]:
        raise ValueError(
            f"{x_name} (N, ...) and {y_name} (N,) must hold the same N examples, got shapes "
            f"{np.shape(x)} and {np.shape(y)}.")
    dtype = y.dtype if hasattr(y, "dtype") else np.asarray(y).dtype
    if not np.issubdtype(dtype, np.integer):
        raise ValueError(f"{y_name} must hold integer labels, got dtype {dtype}.")
    return int(np.shape(y)[0])


def check_client_params(name: str, params: chex.ArrayTree, num_clients: int) -> None:
    """A pytree of per-client params: every leaf has a leading axis of num_clients."""
    leaves = jax.tree_util.tree_leaves(params)
    if not leaves or any(np.ndim(l) == 0 or np.shape(l)[0] != num_clients for l in leaves):
        shapes = [np.shape(l) for l in leaves][:3]
        raise ValueError(
            f"{name} must have a leading axis of {num_clients} clients on every leaf "
            f"(per_client_params=True), got leaf shapes {shapes}.")


def finish_client_evaluation(correct: Any, count: Any, loss_sum: Any) -> ClientEvaluation:
    """The host-side ClientEvaluation of device sums (any leading shape)."""
    correct = np.asarray(correct, np.int64)
    count = np.broadcast_to(np.asarray(count, np.int64), correct.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(count > 0, correct / np.maximum(count, 1), np.nan)
        loss = np.where(count > 0, np.asarray(loss_sum, np.float64) / np.maximum(count, 1),
                        np.nan)
    return ClientEvaluation(correct, count.copy(), loss, accuracy)


def client_accuracies(
    apply_fn: Callable,
    params: chex.ArrayTree,
    x: chex.Array,
    y: chex.Array,
    indices: chex.Array,
    sizes: chex.Array,
    *,
    per_client_params: bool = False,
    batch_size: int = 256,
) -> ClientEvaluation:
    """Every client's accuracy on its own examples, in one jitted call.

    Client i is evaluated on x[indices[i, :sizes[i]]] (labels y likewise) with `params` (one
    model shared by all clients) or, with per_client_params=True, with its own model
    params[i] (every leaf has a leading axis M):

        accuracy_i = (1 / s_i) sum_{j < s_i} 1[argmax_k f(theta_i, x_{idx_ij})_k = y_{idx_ij}]
        loss_i     = (1 / s_i) sum_{j < s_i} -log softmax(f(theta_i, x_{idx_ij}))_{y_{idx_ij}}

    with NaN for both where s_i = 0. x stays in its stored dtype (uint8 pixels, int32 tokens:
    pass a model that takes them, `models.model_for_data`) and is gathered inside the jit.
    The program vmaps over the clients and scans over batches of min(batch_size, V) positions
    of the padded rows (V = indices.shape[1]), so one scan step evaluates M * that many
    examples; it is compiled once per shape and cached by apply_fn, like `make_evaluator`.

    Raises:
      ValueError: shapes that do not fit, sizes outside [0, V], valid indices outside the
        split, batch_size < 1 (named).
    """
    batch_size = _validation.check_integer("batch_size", batch_size, 1)
    per_client_params = _validation.check_flag("per_client_params", per_client_params)
    num = check_examples("x", x, "y", y)
    idx, size = check_client_sets("indices", indices, sizes, num)
    if per_client_params:
        check_client_params("params", params, idx.shape[0])
    correct, loss_sum = jax.device_get(
        _compiled_client_evaluation(apply_fn, per_client_params, batch_size)(
            params, x, y, idx, size))
    return finish_client_evaluation(correct, size, loss_sum)


def client_accuracy_summary(
    accuracies: Any, sizes: Any | None = None, reference: Any | None = None
) -> dict:
    """Summary of per-client accuracies over the clients with a finite accuracy (NaN: not
    evaluated, e.g. no test examples).

    Keys (plain Python numbers, JSON-ready; NaN where no client was evaluated):
      mean, median; worst_10 / best_10: mean of the ceil(n / 10) lowest / highest accuracies
      ("worst 10%" of q-FFL, Li et al. ICLR 2020, and Ditto, Li et al. ICML 2021); std and
      variance (ddof 0; the variance is q-FFL's fairness measure); num_clients evaluated and
      num_unevaluated;
      with `sizes` (the clients' training sizes n_i): weighted_mean = sum n_i a_i / sum n_i
      over the evaluated clients;
      with `reference` (another method's accuracies of the same clients, e.g. FedAvg's global
      model), over the clients with both finite (num_compared of them): improved_share and
      worse_share (shares with a strictly higher / lower accuracy than the reference) and
      mean_gain = mean(a_i - reference_i).

    Raises:
      ValueError: accuracies not a non-empty vector, or sizes / reference of another length.
    """
    acc = np.asarray(accuracies, np.float64)
    if acc.ndim != 1 or acc.size == 0:
        raise ValueError(f"accuracies must be a non-empty 1-D vector, got shape {acc.shape}.")
    finite = np.isfinite(acc)
    values = np.sort(acc[finite])
    n = int(values.size)
    nan = float("nan")
    tail = -(-n // 10)  # ceil(n / 10), in integers
    summary = {
        "mean": float(values.mean()) if n else nan,
        "median": float(np.median(values)) if n else nan,
        "worst_10": float(values[:tail].mean()) if n else nan,
        "best_10": float(values[n - tail:].mean()) if n else nan,
        "std": float(values.std()) if n else nan,
        "variance": float(values.var()) if n else nan,
        "num_clients": n,
        "num_unevaluated": int(acc.size - n),
    }
    if sizes is not None:
        weights = np.asarray(sizes, np.float64)
        if weights.shape != acc.shape:
            raise ValueError(
                f"sizes has shape {weights.shape} but accuracies has shape {acc.shape}.")
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError("sizes must be finite and >= 0.")
        total = weights[finite].sum()
        summary["weighted_mean"] = (
            float((weights[finite] * acc[finite]).sum() / total) if total > 0 else nan)
    if reference is not None:
        ref = np.asarray(reference, np.float64)
        if ref.shape != acc.shape:
            raise ValueError(
                f"reference has shape {ref.shape} but accuracies has shape {acc.shape}.")
        both = finite & np.isfinite(ref)
        gain = acc[both] - ref[both]
        summary["num_compared"] = int(both.sum())
        summary["improved_share"] = float((gain > 0).mean()) if gain.size else nan
        summary["worse_share"] = float((gain < 0).mean()) if gain.size else nan
        summary["mean_gain"] = float(gain.mean()) if gain.size else nan
    return summary
