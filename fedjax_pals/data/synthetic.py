"""The synthetic Gaussian label-shift task of FedPALS (App. B.7 and C.4, Fig. 9).

Three classes with X | Y=y ~ N(mu_y, I_2), the means of App. B.7. Two
training clients with label distributions S_1 = [.5, .5, 0] (n_1 = 40) and
S_2 = [.5, 0, .5] (n_2 = 18), so FedAvg leans towards client 1. The target

    T_delta = (1 - delta) T_proj + delta T_ext,
    T_proj = [.5, .25, .25]  (inside Conv(S): 0.5 S_1 + 0.5 S_2),
    T_ext  = [0, .5, .5]     (outside Conv(S)),

moves away from the clients' convex hull as delta grows, so delta controls the projection
distance d(T, S). The paper evaluates on 2000 target test points.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_pals.data.datasets import Dataset, LabeledSplit, register_dataset
from fedjax_pals import _validation
from fedjax_pals import hyperparameters as declared
from fedjax_pals.data.partitions import (
    MIN_TARGET_TEST_SIZE,
    FederatedPartition,
    _pad,
    largest_remainder_counts,
)

SYNTHETIC_MEANS = np.array([[6.0, 4.6], [1.2, -1.6], [4.6, -5.4]])
SYNTHETIC_CLIENT_LABEL_DISTS = np.array([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]])
SYNTHETIC_CLIENT_SIZES = (40, 18)

_T_PROJ = np.array([0.5, 0.25, 0.25])
_T_EXT = np.array([0.0, 0.5, 0.5])


def synthetic_target_label_dist(delta: float) -> np.ndarray:
    """T_delta = (1 - delta) [.5, .25, .25] + delta [0, .5, .5] for delta in [0, 1] (App. C.4)."""
    if not isinstance(delta, (int, float, np.integer, np.floating)) or not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be a number in [0, 1], got {delta!r}")
    return (1.0 - float(delta)) * _T_PROJ + float(delta) * _T_EXT


def _sample(labels_counts: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian points for the given per-class counts, in random class order."""
    y = rng.permutation(np.repeat(np.arange(len(labels_counts)), labels_counts))
    x = SYNTHETIC_MEANS[y] + rng.standard_normal((len(y), SYNTHETIC_MEANS.shape[1]))
    return x.astype(np.float32), y.astype(np.int32)


def synthetic_label_shift_task(
    delta: float,
    *,
    seed: int,
    num_test: int = 2000,
    num_val: int = 500,
    min_target_test_size: int = MIN_TARGET_TEST_SIZE,
) -> tuple[Dataset, FederatedPartition]:
    """Draws the synthetic task of App. C.4 for one delta.

    The train split holds the two clients' examples (exactly S_i * n_i per class: [20, 20, 0]
    and [9, 0, 9]) followed by a target validation set of ``num_val`` points with per-class
    counts largest_remainder(T_delta, num_val); the test split holds ``num_test`` points drawn
    the same way. The partition's ``target_label_dist`` is T_delta itself. As for the other
    partitions, ``num_test`` must be >= ``min_target_test_size`` (default 30): accuracy on fewer
    examples is noise.

    Returns:
      (dataset named "synthetic" with x float32 (N, 2), y int32; the matching
      partition with 2 training clients).
    """
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    for name, value in (("num_test", num_test), ("num_val", num_val)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    min_test = _validation.check_positive_int("min_target_test_size", min_target_test_size)
    if num_test < min_test:
        raise ValueError(
            f"num_test={num_test} is fewer than min_target_test_size={min_test}: accuracy on so "
            "few target test examples is noise (the paper uses 2000); pass "
            f"min_target_test_size <= {num_test} to accept so small a set."
        )
    target = synthetic_target_label_dist(delta)
    rng = np.random.default_rng(seed)

    client_counts = np.rint(
        SYNTHETIC_CLIENT_LABEL_DISTS * np.asarray(SYNTHETIC_CLIENT_SIZES)[:, None]
    ).astype(np.int64)
    blocks = [_sample(c, rng) for c in client_counts]
    blocks.append(_sample(largest_remainder_counts(target, int(num_val)), rng))
    x_test, y_test = _sample(largest_remainder_counts(target, int(num_test)), rng)

    xs, ys = zip(*blocks)
    sizes = np.array([len(y) for y in ys])
    starts = np.concatenate([[0], np.cumsum(sizes)])
    rows = [np.arange(starts[i], starts[i + 1]) for i in range(len(blocks) - 1)]

    dataset = Dataset(
        name="synthetic",
        train=LabeledSplit(x=np.concatenate(xs), y=np.concatenate(ys)),
        test=LabeledSplit(x=x_test, y=y_test),
        num_classes=3,
        source=f"synthetic Gaussians (FedPALS App. B.7/C.4), delta={delta:g}, seed {seed}",
    )
    partition = FederatedPartition(
        client_indices=_pad(rows),
        client_sizes=sizes[:-1],
        client_label_counts=client_counts,
        target_label_dist=target,
        target_val_indices=np.arange(starts[-2], starts[-1]),
        target_test_indices=np.arange(len(y_test)),
        num_classes=3,
        description=(
            f"synthetic label shift delta={delta:g} (App. C.4), 3 clients "
            f"(2 train + target), seed {seed}"
        ),
    )
    return dataset, partition


@dataclasses.dataclass(frozen=True)
class SyntheticHyperparameters(declared.Hyperparameters):  # config key dataset.synthetic_delta
    synthetic_delta: float = declared.hyperparameter(0.5, low=0.0, high=1.0)


# Its own clients (2 training + the target, with their 58 training examples): no scheme.
register_dataset(
    "synthetic",
    lambda synthetic_delta, seed: synthetic_label_shift_task(synthetic_delta, seed=seed),
    num_classes=3, num_train=sum(SYNTHETIC_CLIENT_SIZES), images=False, label="Synthetic",
    hyperparameters=SyntheticHyperparameters, num_clients=3,
)
