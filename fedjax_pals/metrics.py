"""Classification metrics of the global model on the target sets."""

from __future__ import annotations

import functools
from typing import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np


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


def macro_f1_from_confusion(confusion: np.ndarray) -> float:
    """Mean F1 over the classes present in the labels or the predictions.

    Classes absent from both (common under label shift: a sparse target) are
    left out rather than counted as F1 = 0, as scikit-learn does with `labels`
    restricted to the observed classes.
    """
    confusion = np.asarray(confusion, np.float64)
    true_pos = np.diag(confusion)
    support = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    present = (support + predicted) > 0
    if not present.any():
        return float("nan")
    f1 = np.where(present, 2 * true_pos / np.maximum(support + predicted, 1), 0.0)
    return float(f1[present].mean())


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
    the batches inside one jit and returns {"accuracy", "macro_f1", "loss"}.
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
        return {
            "accuracy": accuracy_from_confusion(confusion),
            "macro_f1": macro_f1_from_confusion(confusion),
            "loss": float(loss),
        }

    return evaluate
