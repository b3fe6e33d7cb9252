"""A run's ingredients built from its resolved config: data, partition, algorithm, model.

`build_task(config)` does, in order: load the data set, draw the label-shift partition,
choose FedPALS' lambda (directly, or from an ESS fraction by bisection, App. B.3), build the
algorithm, the model and the local training. Every error of the data (a data set that is not
there, a partition that cannot be drawn, a target test set the test split cannot supply, an
ESS fraction out of reach) surfaces here, before any training.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_pals.algorithms import (
    FederatedAlgorithm, adaptive_fedpals, init_server_state, make_algorithm, with_server_label_dists,
)
from fedjax_pals import registry
from fedjax_pals.data import (
    Dataset,
    FederatedPartition,
    dirichlet_partition,
    load_cifar10,
    load_fashion_mnist,
    niid_bench_sparsity_partition,
    registered_datasets,
    sparsity_partition,
    synthetic_label_shift_task,
)
from fedjax_pals.engine import LocalTraining
from fedjax_pals.experiment.config import validate_config
from fedjax_pals.experiment.perturbation import perturb_label_dist
from fedjax_pals.models import Model, make_model
from fedjax_pals.privacy import private_label_dists
from fedjax_pals.server_optimizers import server_optimizer_for
from fedjax_pals.server_weights import LOG10_LAM_RANGE, effective_sample_size, lambda_for_ess

# Fewer target test examples than this make the reported accuracy noise (+-5 % at 100).
MIN_TARGET_TEST_EXAMPLES = 100


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """What `train_and_evaluate` trains: built by `build_task` from a resolved config.

    `partition` is the one the clients train on (the Oracle's is resampled to T, App. B.5)
    and whose target sets evaluate the run. `target_label_dist` is the T the server's weights
    use (T itself, or Table 2's perturbed T_p). `lam` is FedPALS' lambda (None when unused).
    """

    config: ml_collections.ConfigDict
    dataset: Dataset
    partition: FederatedPartition
    algorithm: FederatedAlgorithm
    model: Model
    training: LocalTraining
    lam: float | None
    target_label_dist: np.ndarray
    clients_per_round: int
    # The clients' S_i(Y) as the server's weights see them: the DP release when
    # algorithm.label_dp_epsilon is set (privacy.py), else None (the exact S_i).
    server_label_dists: np.ndarray | None = None


@functools.lru_cache(maxsize=2)
def _load_image_dataset(name: str, data_dir: str | None, download: bool = False) -> Dataset:
    """Loaded once per process: the runs of a sweep share one copy (and one device copy)."""
    if name == "fashion_mnist":
        return load_fashion_mnist(data_dir, search_debian=data_dir is None)
    return load_cifar10(data_dir, download=download)


@functools.lru_cache(maxsize=64)
def _synthetic_task(delta: float, seed: int) -> tuple[Dataset, FederatedPartition]:
    """One object per (delta, seed) in a process: the runs of a sweep that differ only in
    their method or lambda share it, and with it the runs axis (`TrainingRun.lockstep_key`)."""
    return synthetic_label_shift_task(delta, seed=seed)


@functools.lru_cache(maxsize=2)
def _load_registered_dataset(name: str) -> Dataset:
    dataset = registered_datasets()[name].load()
    if not isinstance(dataset, Dataset):
        raise TaskError(
            f"the loader registered for data set {name!r} returned {type(dataset).__name__}, "
            "not a fedjax_pals.Dataset."
        )
    return dataset


def load_data(config: ml_collections.ConfigDict) -> tuple[Dataset, FederatedPartition]:
    """The data set and its label-shift partition, as the resolved config describes.

    An explicit `dataset.data_dir` is the only place searched: a data set missing there is an
    error, never a silent fallback to another copy.
    """
    d, p = config.dataset, config.partition
    if d.name == "synthetic":
        return _synthetic_task(d.synthetic_delta, config.seed)
    if d.name in registered_datasets():
        dataset = _load_registered_dataset(d.name)
    else:
        dataset = _load_image_dataset(d.name, d.data_dir, bool(d.get("download", False)))
    common = dict(num_clients=p.num_clients, seed=config.seed, num_classes=dataset.num_classes)
    if p.scheme in ("sparsity", "niid_bench_sparsity"):
        scheme = sparsity_partition if p.scheme == "sparsity" else niid_bench_sparsity_partition
        partition = scheme(
            dataset.train.y, dataset.test.y, labels_per_client=p.labels_per_client, **common
        )
    else:
        partition = dirichlet_partition(
            dataset.train.y, dataset.test.y, beta=p.dirichlet_beta, **common
        )
    return dataset, partition


def _check_target_sets(partition: FederatedPartition) -> None:
    n_test = len(partition.target_test_indices)
    if n_test < MIN_TARGET_TEST_EXAMPLES:
        raise TaskError(
            f"the target test set has only {n_test} examples (the test split cannot supply more "
            f"with T = {np.round(partition.target_label_dist, 4).tolist()}); accuracy on fewer "
            f"than {MIN_TARGET_TEST_EXAMPLES} is noise. Use another seed or partition."
        )
    if len(partition.target_val_indices) == 0:
        raise TaskError("the target validation set is empty; use another seed or partition.")


class TaskError(ValueError):
    """The data cannot make the run the config asks for (see `build_task`)."""


def build_task(config: Any) -> Task:
    """Builds the run of `config` (validated and resolved first, see `validate_config`).

    Raises:
      ConfigError: a bad config (before anything is loaded).
      DatasetUnavailableError: the data set is not available locally.
      TaskError (a ValueError): the partition cannot be drawn, the target test set would be
        too small, or the ESS fraction is out of reach for these clients (the message gives
        the range).
    """
    config = validate_config(config)
    try:
        return _build_task(config)
    except TaskError:
        raise
    except ValueError as error:
        raise TaskError(f"{config.dataset.name}, seed {config.seed}: {error}") from error


def _build_task(config: ml_collections.ConfigDict) -> Task:
    a = config.algorithm
    dataset, partition = load_data(config)
    _check_target_sets(partition)
    target = np.asarray(partition.target_label_dist, np.float64)
    if a.target_perturbation:  # None (unused) or 0: T itself
        # Table 2: the server knows only T_p; the target's own sets still follow T.
        target = perturb_label_dist(target, a.target_perturbation, config.seed)
    if a.target_estimation is not None:
        # T unknown: the server starts from the clients' aggregate, the guess without target
        # labels, and train_and_evaluate re-estimates T as it trains (`TargetReestimation`).
        sizes = np.asarray(partition.client_sizes, np.float64)
        target = sizes @ np.asarray(partition.client_label_dists, np.float64) / sizes.sum()

    server_dists = None  # the S_i the server's weights see: exact, or the DP release
    if a.label_dp_epsilon is not None:
        # The clients release S_i(Y) through a DP mechanism once; the server's weights and the
        # ESS search use the release (post-processing), local training the exact counts.
        server_dists = private_label_dists(
            partition.client_label_counts,
            a.label_dp_epsilon,
            a.label_dp_mechanism,
            jax.random.fold_in(jax.random.PRNGKey(config.seed), _LABEL_DP_STREAM),
            delta=a.label_dp_delta,
        )
    weight_dists = partition.client_label_dists if server_dists is None else server_dists
    lam = a.lam
    adaptive = a.lam_schedule == "hypergradient"
    if a.ess_fraction is not None:
        try:
            lam = float(
                lambda_for_ess(weight_dists, target, partition.client_sizes, a.ess_fraction)
            )
        except ValueError as error:
            if not (adaptive and "out of range" in str(error)):
                raise
            lam = 0.0  # below the reachable range: the lower end, see below
        if adaptive and lam == 0.0:
            # A fixed lambda would be out of reach (or 0); the hypergradient only needs a start
            # > 0 and moves from there: the lower end of lambda_for_ess's range, which stands
            # for lambda -> 0+.
            lam = float(np.sum(partition.client_sizes)) * 10.0 ** LOG10_LAM_RANGE[0]
    method = registry.get_method(a.name)
    training_partition = partition
    if method.partition_transform is not None:
        # e.g. the Oracle: FedAvg on clients resampled to the target label distribution.
        training_partition = method.partition_transform(partition, dataset.train.y, config.seed)
    weights_partition = dataclasses.replace(training_partition, target_label_dist=target)
    algorithm = make_algorithm(
        a.name,
        partition=weights_partition,
        lam=lam,
        weights=a.weights,
        **{key: a[key] for key in registry.hyperparameter_fields() if a[key] is not None},
    )
    model = make_model(config.model, dataset.train.x.shape[1:], dataset.num_classes)
    if adaptive:
        val = partition.target_val_indices
        algorithm = adaptive_fedpals(
            target,
            weight_dists,
            partition.client_sizes,
            lam,
            model.apply,
            dataset.train.x[val],
            dataset.train.y[val],
            rounds=config.training.rounds,
            hyper_learning_rate=a.lam_hyper_lr,
        )
    if server_dists is not None:
        algorithm = algorithm._replace(
            weighting=with_server_label_dists(algorithm.weighting, server_dists)
        )
    if config.server.optimizer is not None:  # else the plain weighted average, as before
        key, optimizer = algorithm.name, config.server.optimizer  # the method key, e.g. fedpals
        algorithm = server_optimizer_for(algorithm, **config.server.to_dict())
        # One name: the sweep's key, "fedadam_fedpals" (a bare "fedadam" for FedAvg).
        algorithm = algorithm._replace(name=optimizer if key == "fedavg" else f"{optimizer}_{key}")
    t = config.training
    training = LocalTraining(
        local_epochs=t.local_epochs, batch_size=t.batch_size, learning_rate=t.learning_rate
    )
    return Task(
        config=config,
        dataset=dataset,
        partition=training_partition,
        algorithm=algorithm,
        model=model,
        training=training,
        lam=lam,
        target_label_dist=target,
        clients_per_round=t.clients_per_round,
        server_label_dists=server_dists,
    )


# A random stream of its own for the DP noise of the label marginals.
_LABEL_DP_STREAM = 0xD1FF


def task_summary(task: Task) -> dict:
    """What results.json records about the task: the data source, the partition, lambda, the
    server weights alpha with every client taking part at the initial state (AFL's move from
    round to round), their ESS, N, d(T, S), the participants per round and, under label DP,
    the server's released S (`server_label_dists`)."""
    partition = task.partition
    sizes, dists = partition.client_sizes, partition.client_label_dists
    initial = init_server_state(
        task.algorithm, task.model.init(jax.random.PRNGKey(0)), partition.num_clients
    )
    weighting = task.algorithm.weighting
    alpha = weighting.weights(
        jnp.asarray(dists, jnp.float32),
        jnp.asarray(sizes, jnp.float32),
        initial,
        jnp.arange(partition.num_clients),
    )
    summary = partition.summary()
    return {
        "dataset_source": task.dataset.source,
        "partition": summary,
        "lam": task.lam,
        "alpha": np.asarray(alpha).tolist(),
        "ess": float(effective_sample_size(alpha, sizes)),
        "total_examples": int(np.sum(sizes)),
        "projection_distance": summary["projection_distance"],
        "clients_per_round": task.clients_per_round,
        **(
            {}
            if task.server_label_dists is None
            else {"server_label_dists": np.asarray(task.server_label_dists).tolist()}
        ),
    }
