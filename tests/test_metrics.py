"""Accuracy, macro-F1 and the batched evaluator against NumPy references."""

import json
import math
import statistics

import jax
import numpy as np
import pytest

import fedjax_pals as fjp


def _reference_macro_f1(labels, predictions, num_classes):
    """scikit-learn's f1_score(labels, predictions, labels=np.unique(labels), average="macro"),
    in float64 NumPy: the mean F1 over the classes present in the labels."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    scores = []
    for k in np.unique(labels):
        tp = np.sum((labels == k) & (predictions == k), dtype=np.float64)
        fp = np.sum((labels != k) & (predictions == k), dtype=np.float64)
        fn = np.sum((labels == k) & (predictions != k), dtype=np.float64)
        scores.append(2 * tp / (2 * tp + fp + fn))  # tp + fn > 0: k is in the labels
    return float(np.mean(scores))


def _macro_f1(labels, predictions, num_classes):
    confusion = fjp.metrics.confusion_matrix(
        np.asarray(labels), np.asarray(predictions), num_classes)
    return fjp.metrics.macro_f1_from_confusion(np.asarray(confusion))


@pytest.mark.parametrize("seed", range(5))
def test_confusion_accuracy_and_macro_f1_match_numpy(seed):
    rng = np.random.default_rng(seed)
    num_classes = 6
    labels = rng.choice([0, 2, 3, 5], size=300)  # classes 1 and 4 never occur
    # Predictions stray into 1 and 4 (absent from the labels): errors of the true classes.
    predictions = np.where(rng.random(300) < 0.6, labels, rng.integers(0, 5, 300))
    assert set(predictions.tolist()) >= {1, 4}
    confusion = np.asarray(fjp.metrics.confusion_matrix(labels, predictions, num_classes))
    expected = np.zeros((num_classes, num_classes), int)
    np.add.at(expected, (labels, predictions), 1)
    np.testing.assert_array_equal(confusion, expected)
    assert fjp.metrics.accuracy_from_confusion(confusion) == pytest.approx(np.mean(labels == predictions))
    assert fjp.metrics.macro_f1_from_confusion(confusion) == pytest.approx(
        _reference_macro_f1(labels, predictions, num_classes), rel=1e-12
    )


def test_macro_f1_averages_over_the_classes_in_the_labels_only():
    # A nearly perfect model on a target of 3 classes that strays once into each of 4 classes
    # the target lacks: averaging those 4 as F1 = 0 would report 3/7 of its quality.
    labels = np.repeat([0, 1, 2], 100)
    predictions = labels.copy()
    predictions[[0, 100, 200, 201]] = [5, 6, 7, 8]
    f1 = _macro_f1(labels, predictions, 10)
    assert f1 == pytest.approx(_reference_macro_f1(labels, predictions, 10), rel=1e-12)
    assert f1 == pytest.approx(np.mean([2 * 99 / 199, 2 * 99 / 199, 2 * 98 / 198]), rel=1e-12)
    assert f1 > 0.98
    # A class in the labels that is never predicted counts, with F1 0.
    never = _macro_f1([0, 0, 1, 1], [0, 0, 0, 0], 3)
    assert never == pytest.approx(np.mean([2 * 2 / (4 + 2), 0.0]), rel=1e-12)
    assert never == pytest.approx(_reference_macro_f1([0, 0, 1, 1], [0, 0, 0, 0], 3))
    # Every prediction of an absent class: F1 0 for each class present, not NaN.
    assert _macro_f1([0, 1], [2, 2], 3) == 0.0
    # A class with neither labels nor predictions is left out; an empty set is NaN.
    assert _macro_f1([0, 1], [0, 1], 5) == 1.0
    assert math.isnan(fjp.metrics.macro_f1_from_confusion(np.zeros((3, 3), int)))


@pytest.mark.parametrize("seed", range(20))
def test_macro_f1_matches_the_reference_on_random_sets_with_absent_classes(seed):
    rng = np.random.default_rng(100 + seed)
    num_classes = int(rng.integers(2, 11))
    present = rng.choice(num_classes, size=int(rng.integers(1, num_classes + 1)), replace=False)
    n = int(rng.integers(1, 60))
    labels = rng.choice(present, size=n)
    predictions = np.where(rng.random(n) < rng.random(), labels, rng.integers(0, num_classes, n))
    assert _macro_f1(labels, predictions, num_classes) == pytest.approx(
        _reference_macro_f1(labels, predictions, num_classes), rel=1e-12)


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


# ----------------------------------------------------------------------------
# Per-client accuracies and their summary.


def _reference_client_metrics(logits_fn, params_of, x, y, indices, sizes):
    """NumPy float64 loop over the clients: (correct, count, mean loss, accuracy, min margin)."""
    correct, losses, accuracies, margins = [], [], [], [np.inf]
    for i, n in enumerate(sizes):
        idx = indices[i, :n]
        if n == 0:
            correct.append(0), losses.append(np.nan), accuracies.append(np.nan)
            continue
        logits = logits_fn(params_of(i), x[idx])
        log_probs = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(
            1, keepdims=True)) - logits.max(1, keepdims=True)
        hits = int(np.sum(logits.argmax(1) == y[idx]))
        correct.append(hits)
        losses.append(-log_probs[np.arange(n), y[idx]].mean())
        accuracies.append(hits / n)
        top2 = np.sort(logits, axis=1)[:, -2:]
        margins.append((top2[:, 1] - top2[:, 0]).min())
    return np.array(correct), np.array(losses), np.array(accuracies), min(margins)


def _linear_logits(params):
    kernel = np.asarray(params["Dense_0"]["kernel"], np.float64)
    bias = np.asarray(params["Dense_0"]["bias"], np.float64)
    return lambda p_x: p_x.reshape(len(p_x), -1).astype(np.float64) @ kernel + bias


def _client_sets(rng, num_clients, width, num_examples):
    indices = rng.integers(0, num_examples, (num_clients, width)).astype(np.int32)
    sizes = rng.integers(0, width + 1, num_clients)
    sizes[0], sizes[-1] = 0, width  # an empty client and a full row
    # Padding may hold anything: it must be masked, not gathered.
    padding = np.arange(width)[None, :] >= sizes[:, None]
    indices[padding] = rng.integers(-(10**6), 10**6, padding.sum())
    return indices, sizes


@pytest.mark.parametrize("per_client", [False, True])
@pytest.mark.parametrize("width, batch_size", [(9, 4), (9, 256), (6, 1)])
def test_client_accuracies_match_a_numpy_loop_over_clients(per_client, width, batch_size):
    rng = np.random.default_rng(width * 10 + batch_size + per_client)
    num_clients, num_examples = 7, 40
    model = fjp.logistic_regression((2, 3), 4)  # 2-D examples: flattened inside apply
    x = rng.normal(size=(num_examples, 2, 3)).astype(np.float32)
    y = rng.integers(0, 4, num_examples).astype(np.int32)
    indices, sizes = _client_sets(rng, num_clients, width, num_examples)
    keys = jax.random.split(jax.random.PRNGKey(width), num_clients)
    if per_client:
        params = jax.vmap(model.init)(keys)
        params_of = lambda i: jax.tree_util.tree_map(lambda a: a[i], params)
    else:
        params = model.init(keys[0])
        params_of = lambda i: params
    result = fjp.metrics.client_accuracies(
        model.apply, params, x, y, indices, sizes, per_client_params=per_client,
        batch_size=batch_size)
    logits_of = lambda p, xs: _linear_logits(p)(xs)
    correct, loss, accuracy, margin = _reference_client_metrics(
        logits_of, params_of, x.astype(np.float64), y, indices, sizes)
    # float32 logits of 6 products differ from float64 ones by far less than 1e-4: no argmax
    # in the comparison sits on a decision boundary.
    assert margin > 1e-4
    np.testing.assert_array_equal(result.correct, correct)
    np.testing.assert_array_equal(result.count, sizes)
    np.testing.assert_array_equal(np.isnan(result.accuracy), sizes == 0)
    np.testing.assert_array_equal(result.accuracy, accuracy)  # both correct / count
    np.testing.assert_allclose(result.loss, loss, rtol=1e-5, atol=1e-6)
    assert result.accuracy.dtype == np.float64 and np.isnan(result.loss[0])


def test_client_accuracies_take_uint8_inputs_as_stored_and_compile_once_per_shape():
    traces = []

    def apply(params, x):  # a model of the stored pixels, scaling them inside apply
        traces.append(x.dtype)
        return (x.astype(np.float32) / 255.0).reshape(x.shape[0], -1) @ params["w"]

    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (30, 5), dtype=np.uint8)
    y = rng.integers(0, 3, 30).astype(np.int32)
    indices, sizes = _client_sets(rng, 4, 6, 30)
    params = {"w": rng.normal(size=(5, 3)).astype(np.float32)}
    first = fjp.metrics.client_accuracies(apply, params, x, y, indices, sizes)
    assert traces == [np.uint8]  # gathered inside the jit, not converted before
    expected = _reference_client_metrics(
        lambda p, xs: xs.astype(np.float64) / 255.0 @ p["w"].astype(np.float64),
        lambda i: params, x, y, indices, sizes)
    np.testing.assert_array_equal(first.correct, expected[0])
    # Other values of the same shapes: the same compiled program; another width: one more.
    fjp.metrics.client_accuracies(apply, {"w": params["w"] + 1}, x[::-1].copy(), y, indices,
                                  sizes)
    assert len(traces) == 1
    fjp.metrics.client_accuracies(apply, params, x, y, indices[:, :5], np.minimum(sizes, 5))
    assert len(traces) == 2


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(sizes=np.array([1, 2, 7])), "sizes must lie in"),
        (dict(sizes=np.array([1, 2])), "sizes must be an integer vector"),
        (dict(sizes=np.array([1, 2, 2])), "outside"),  # 99 is valid now
        (dict(indices=np.zeros(3, np.int32)), "indices must be an integer"),
        (dict(y=np.zeros(29, np.int32)), "same N"),
        (dict(batch_size=0), "batch_size"),
        (dict(per_client_params=True), "leading axis of 3"),
    ],
)
def test_client_accuracies_reject_bad_arguments(change, message):
    model = fjp.logistic_regression((4,), 3)
    arguments = dict(
        params=model.init(jax.random.PRNGKey(0)), x=np.zeros((30, 4), np.float32),
        y=np.zeros(30, np.int32), indices=np.array([[0, 1], [2, 99], [3, 4]]),
        sizes=np.array([1, 1, 2]))
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        fjp.metrics.client_accuracies(model.apply, **arguments)


def _reference_summary(accuracies, sizes, reference):
    keep = ~np.isnan(accuracies)
    values = accuracies[keep]
    tail = math.ceil(len(values) / 10)
    ordered = sorted(values.tolist())
    summary = {
        "mean": statistics.fmean(values), "median": statistics.median(values),
        "worst_10": statistics.fmean(ordered[:tail]), "best_10": statistics.fmean(ordered[-tail:]),
        "std": statistics.pstdev(values), "variance": statistics.pvariance(values),
        "num_clients": len(values), "num_unevaluated": int((~keep).sum()),
        "weighted_mean": float(np.dot(sizes[keep], values) / sizes[keep].sum()),
    }
    both = keep & ~np.isnan(reference)
    pairs = list(zip(accuracies[both], reference[both]))
    summary["num_compared"] = len(pairs)
    summary["improved_share"] = sum(a > r for a, r in pairs) / len(pairs)
    summary["worse_share"] = sum(a < r for a, r in pairs) / len(pairs)
    summary["mean_gain"] = statistics.fmean(a - r for a, r in pairs)
    return summary


@pytest.mark.parametrize("num_clients", [1, 7, 23, 30, 34])
def test_client_accuracy_summary_matches_numpy(num_clients):
    rng = np.random.default_rng(num_clients)
    # Accuracies of small test sets: ties between clients and with the reference are common.
    accuracies = rng.integers(0, 6, num_clients) / 5.0
    reference = rng.integers(0, 6, num_clients) / 5.0
    sizes = rng.integers(1, 100, num_clients).astype(float)
    if num_clients > 1:
        accuracies[rng.choice(num_clients, num_clients // 7 + 1, replace=False)[1:]] = np.nan
        reference[rng.integers(num_clients)] = np.nan
    if num_clients == 34:  # 30 evaluated: a multiple of 10 (23 above is not)
        accuracies = rng.integers(0, 6, num_clients) / 5.0
        accuracies[:4] = np.nan
    summary = fjp.metrics.client_accuracy_summary(accuracies, sizes, reference)
    expected = _reference_summary(accuracies, sizes, reference)
    assert num_clients != 34 or expected["num_clients"] == 30
    assert summary.keys() == expected.keys()
    for name, value in expected.items():
        assert type(summary[name]) in (float, int), name  # plain Python numbers
        assert summary[name] == pytest.approx(value, rel=1e-12, abs=1e-15), name
    json.dumps(summary)


def test_client_accuracy_summary_edges():
    nan = float("nan")
    summary = fjp.metrics.client_accuracy_summary([nan, nan])
    assert summary["num_clients"] == 0 and summary["num_unevaluated"] == 2
    assert math.isnan(summary["mean"]) and math.isnan(summary["worst_10"])
    assert "weighted_mean" not in summary and "improved_share" not in summary
    with pytest.raises(ValueError, match="sizes has shape"):
        fjp.metrics.client_accuracy_summary([0.5, 0.6], sizes=[1, 2, 3])
    with pytest.raises(ValueError, match="reference has shape"):
        fjp.metrics.client_accuracy_summary([0.5, 0.6], reference=[0.1])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        fjp.metrics.client_accuracy_summary([])


def test_scores_are_fractions_whose_repr_shows_percent_too():
    scores = fjp.metrics.Scores({"accuracy": 0.969, "macro_f1": 0.95454, "loss": 0.13112})
    assert scores == {"accuracy": 0.969, "macro_f1": 0.95454, "loss": 0.13112}  # a plain dict
    assert json.loads(json.dumps(scores)) == scores
    assert repr(scores) == str(scores) == (
        "Scores(accuracy=0.969 (96.9%), macro_f1=0.9545 (95.5%), loss=0.1311)")
    # A NaN (an empty set's macro-F1) has no percentage.
    assert "nan (" not in repr(fjp.metrics.Scores({"accuracy": float("nan")}))


def test_the_evaluator_counts_the_predictions_and_labels_of_each_class():
    rng = np.random.default_rng(7)
    model = fjp.logistic_regression((4,), 5)
    params = model.init(jax.random.PRNGKey(1))
    x = rng.normal(size=(41, 4)).astype(np.float32)
    y = rng.choice([0, 2, 3], size=41).astype(np.int32)  # classes 1 and 4 absent
    scores = fjp.metrics.make_evaluator(model.apply, x, y, 5, batch_size=8)(params)
    predictions = np.asarray(model.apply(params, x)).argmax(1)
    np.testing.assert_array_equal(scores.predicted, np.bincount(predictions, minlength=5))
    np.testing.assert_array_equal(scores.support, np.bincount(y, minlength=5))
    assert set(scores) == {"accuracy", "macro_f1", "loss"}  # counts are attributes, not keys
