"""Accuracy, macro-F1 and the batched evaluator against NumPy references."""

import jax
import numpy as np
import pytest

import fedjax_pals as fjp


def _reference_macro_f1(labels, predictions, num_classes):
    scores = []
    for k in range(num_classes):
        tp = np.sum((labels == k) & (predictions == k))
        fp = np.sum((labels != k) & (predictions == k))
        fn = np.sum((labels == k) & (predictions != k))
        if tp + fp + fn == 0:
            continue  # class absent from labels and predictions
        scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


@pytest.mark.parametrize("seed", range(5))
def test_confusion_accuracy_and_macro_f1_match_numpy(seed):
    rng = np.random.default_rng(seed)
    num_classes = 6
    labels = rng.choice([0, 2, 3, 5], size=300)  # classes 1 and 4 never occur
    predictions = np.where(rng.random(300) < 0.6, labels, rng.integers(0, 5, 300))
    confusion = np.asarray(fjp.metrics.confusion_matrix(labels, predictions, num_classes))
    expected = np.zeros((num_classes, num_classes), int)
    np.add.at(expected, (labels, predictions), 1)
    np.testing.assert_array_equal(confusion, expected)
    assert fjp.metrics.accuracy_from_confusion(confusion) == pytest.approx(np.mean(labels == predictions))
    assert fjp.metrics.macro_f1_from_confusion(confusion) == pytest.approx(
        _reference_macro_f1(labels, predictions, num_classes)
    )


def test_masked_entries_are_ignored():
    labels = np.array([0, 1, 1, 2])
    predictions = np.array([0, 1, 0, 0])
    mask = np.array([True, True, False, False])
    confusion = np.asarray(fjp.metrics.confusion_matrix(labels, predictions, 3, mask))
    assert confusion.sum() == 2 and fjp.metrics.accuracy_from_confusion(confusion) == 1.0


@pytest.mark.parametrize("num_examples, batch_size", [(37, 8), (5, 1024), (64, 16)])
def test_evaluator_equals_a_direct_computation(num_examples, batch_size):
    rng = np.random.default_rng(num_examples)
    model = fjp.logistic_regression((4,), 3)
    params = model.init(jax.random.PRNGKey(0))
    x = rng.normal(size=(num_examples, 4)).astype(np.float32)
    y = rng.integers(0, 3, num_examples).astype(np.int32)
    metrics = fjp.metrics.make_evaluator(model.apply, x, y, 3, batch_size=batch_size)(params)
    logits = np.asarray(model.apply(params, x), np.float64)
    predictions = logits.argmax(1)
    log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    assert metrics["accuracy"] == pytest.approx(np.mean(predictions == y))
    assert metrics["macro_f1"] == pytest.approx(_reference_macro_f1(y, predictions, 3))
    assert metrics["loss"] == pytest.approx(-log_probs[np.arange(num_examples), y].mean(), rel=1e-5)


def test_evaluator_rejects_an_empty_set():
    model = fjp.logistic_regression((4,), 3)
    with pytest.raises(ValueError, match="empty"):
        fjp.metrics.make_evaluator(model.apply, np.zeros((0, 4), np.float32), np.zeros(0, np.int32), 3)
