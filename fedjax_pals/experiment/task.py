"""A run's ingredients built from its resolved config: data, partition, algorithm, model.

`build_task(config)` does, in order: load the data set, draw the label-shift partition,
choose FedPALS' lambda (directly, or from an ESS fraction by bisection, App. B.3), build the
algorithm, the model and the local training. Every error of the data, and of a user's extension
that does not fit (docs/extending.md), surfaces here, before any training, as one
line naming it (`build_task`'s Raises).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import ml_collections
import numpy as np

from fedjax_pals.algorithms import FederatedAlgorithm, init_server_state, make_algorithm, registry
from fedjax_pals.algorithms.base import round_shape_mismatch, weights_over_clients
from fedjax_pals.data import Dataset, FederatedPartition, registered_datasets, registered_partitions
from fedjax_pals.data.client_sets import ClientEvaluationSets, client_evaluation_sets
from fedjax_pals.data.datasets import RegisteredDataset
from fedjax_pals.engine import LocalTraining
from fedjax_pals.experiment.config import ResolvedConfig, validate_config
from fedjax_pals import deprecation, models, sampling
from fedjax_pals.models import Model, abstract_model, make_model
from fedjax_pals.algorithms.server_optimizers import server_optimizer_for
from fedjax_pals.server_weights import effective_sample_size

# Fewer target test examples than this make the reported accuracy noise (+-5 % at 100).
MIN_TARGET_TEST_EXAMPLES = 100


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """What `train_and_evaluate` trains: built by `build_task` from a resolved config.

    `partition` is the one the clients train on (the Oracle's is resampled to T, App. B.5)
    and whose target sets evaluate the run. `target_label_dist` is the T the server's weights
    use (T itself, or Table 2's perturbed T_p). `context` is the `MethodContext` the method
    was built from, after its features' `prepare` (what a method's monitor reads of it).
    """

    config: ml_collections.ConfigDict
    dataset: Dataset
    partition: FederatedPartition
    algorithm: FederatedAlgorithm
    model: Model
    training: LocalTraining
    context: registry.MethodContext
    target_label_dist: np.ndarray
    clients_per_round: int  # under Poisson sampling: the lanes a round runs
    # The clients' S_i(Y) as the server's weights see them: the DP release when
    # algorithm.label_dp_epsilon is set (privacy.py), else None (the exact S_i).
    server_label_dists: np.ndarray | None = None
    # The run's features that are on, with their hyperparameters: (Feature, its settings).
    features: tuple = ()
    # Poisson sampling's q (training.client_sampling="poisson"), None: clients_per_round drawn
    # without replacement; the sampler's `rate`.
    sampling_rate: float | None = None
    # Every training client's own validation and test sets (evaluation.per_client), else None.
    client_sets: ClientEvaluationSets | None = None
    # The run's method and the lender of its weights, each with its hyperparameters:
    # (Method, its settings); what reports the method while it trains (`Method.monitor`).
    methods: tuple = ()
    # What results.json records of the task (`task_summary`), computed when it is built.
    summary: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Who takes part in each round (`fedjax_pals.sampling.ClientSampler`, from
    # training.client_sampling): clients_per_round is its lanes, sampling_rate its rate.
    sampler: Any = None

    @property
    def lam(self) -> float | None:
        """Deprecated: FedPALS' lambda is the context's slot (`fedpals_lambda.LAMBDA`)."""
        from fedjax_pals.algorithms.fedpals_lambda import LAMBDA

        deprecation.warn(
            "Task.lam is deprecated: read task.context.get(fedjax_pals.algorithms.fedpals_lambda."
            "LAMBDA) (FedPALS' monitor reports lambda in results.json's 'lam').",
            refused_in="0.4.0")
        return self.context.get(LAMBDA)


def _load(name: str, registered: RegisteredDataset, options: tuple) -> Any:
    """A registered data set (with its own partition, for one with its own clients), loaded
    and checked against its registration."""
    try:
        loaded = registered.load(**dict(options))
    except ValueError as error:  # e.g. LabeledSplit's float labels: name the data set
        raise TaskError(f"data set {name!r}: {error}") from error
    own = registered.num_clients is not None
    dataset, partition = loaded if own and isinstance(loaded, tuple) else (loaded, None)
    if not isinstance(dataset, Dataset) or own and not isinstance(partition, FederatedPartition):
        raise TaskError(
            f"the loader registered for data set {name!r} returned {type(loaded).__name__}, "
            "not a fedjax_pals.Dataset" + (" and its FederatedPartition." if own else ".")
        )
    _check_registered_dataset(name, registered, dataset, partition)
    return loaded


# Loaded once per process, keyed on the registration too (a data set registered again,
# replace=True, is loaded anew): the runs of a sweep share one copy (and one device copy).
_load_dataset = functools.lru_cache(maxsize=2)(_load)
# A data set with its own clients, one per seed (the synthetic task: small): the runs of a sweep
# that differ only in their method or lambda share it, and with it the runs axis
# (`TrainingRun.lockstep_key`).
_load_with_clients = functools.lru_cache(maxsize=64)(_load)


def _check_registered_dataset(
    name: str, registered: RegisteredDataset, dataset: Dataset, partition: Any
) -> None:
    """The loaded data set is what its registration said (the config was checked against the
    registration before loading) and its features are finite (NaN or inf features end in a
    non-finite loss that reads as a learning rate too high)."""
    ids, own = dataset.client_ids, partition is not None  # own: the data set's own clients
    for split_name in ("train", "test"):
        if not own and len(getattr(dataset, split_name)) == 0:
            raise TaskError(
                f"data set {name!r}: its loader returned an empty {split_name} split; a run "
                "needs examples to train on and a target to test on."
            )
    facts = (
        ("num_classes", registered.num_classes, dataset.num_classes, "classes"),
        ("num_train", registered.num_train,
         int(np.sum(partition.client_sizes)) if own else len(dataset.train), "training examples"),
        ("num_clients", registered.num_clients, partition.num_clients + 1 if own else None,
         "clients"),
        ("num_client_ids", registered.num_client_ids, None if ids is None else ids.max() + 1,
         "client ids"),
    )
    for what, declared, loaded, unit in facts:
        if declared is not None and declared != loaded and (
            registered.check_counts or what == "num_classes"
        ):
            raise TaskError(
                f"data set {name!r} is registered with {what}={declared}, but its loader returned "
                f"one with {loaded} {unit}; register it with {what}={loaded} (configs are "
                "checked against the registration before the data is loaded)."
            )
    if registered.images and registered.describe is None and dataset.train.x.ndim != 4:
        raise TaskError(
            f"data set {name!r} is registered with images=True, but its inputs have shape "
            f"{dataset.train.x.shape[1:]} per example, not (H, W, C); register it with "
            "images=False."
        )
    for split_name in ("train", "test"):
        x = getattr(dataset, split_name).x
        if not np.issubdtype(x.dtype, np.floating):
            continue  # integers (pixels, tokens) are finite
        # One pass, no copy: a sum is finite exactly when every term is (float64: no overflow).
        with np.errstate(invalid="ignore"):  # inf - inf
            if np.isfinite(np.sum(x, dtype=np.float64)):
                continue
        per_example = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        count = int(x.size - np.count_nonzero(np.isfinite(x)))
        raise TaskError(
            f"data set {name!r}: its {split_name} split holds {count} non-finite feature "
            f"value{'s' * (count != 1)} (NaN or inf), the first in example "
            f"{int(np.argmin(per_example))}; training on them gives a NaN loss. Drop or impute "
            "them in the loader."
        )


def load_data(config: ml_collections.ConfigDict) -> tuple[Dataset, FederatedPartition]:
    """The data set and its label-shift partition, as the resolved config describes.

    An explicit `dataset.data_dir` is the only place searched: a data set missing there is an
    error, never a silent fallback to another copy.
    """
    registered = registered_datasets()[config.dataset.name]
    options = registered.load_options(config.dataset, config.seed)
    if registered.num_clients is not None:  # its own partition (the synthetic task)
        return _load_with_clients(config.dataset.name, registered, options)
    dataset = _load_dataset(config.dataset.name, registered, options)
    scheme = registered_partitions()[config.partition.scheme]
    return dataset, scheme.make(config.partition, dataset, config.seed)


def _check_target_sets(partition: FederatedPartition, client_target: int | None = None) -> None:
    n_test = len(partition.target_test_indices)
    if client_target is not None:  # a client's own sets: as large as the client is
        for what, n in (("test", n_test), ("validation", len(partition.target_val_indices))):
            if n == 0:
                raise TaskError(
                    f"evaluation.client_as_target={client_target}: the client has no {what} "
                    "examples of its own (evaluation.client_val_fraction, client_test_size)."
                )
        return
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
    """Builds the run of `config` (validated and resolved first, see `validate_config`; a
    `ResolvedConfig` is taken as it is).

    Raises:
      ConfigError: a bad config (before anything is loaded).
      DatasetUnavailableError: the data set is not available locally.
      TaskError (a ValueError): the partition cannot be drawn, the target test set would be
        too small, or the ESS fraction is out of reach for these clients (the message gives
        the range); a registered data set (unlike its registration, or with non-finite
        features), model (logits not (batch, K)) or method (a server update that returns a
        state of another structure, shape or dtype) does not fit (named).
    """
    if isinstance(config, ResolvedConfig):
        return build_resolved_task(config.config)
    return build_resolved_task(validate_config(config))


def build_resolved_task(resolved: ml_collections.ConfigDict) -> Task:
    """`build_task` of a config that `validate_config` has resolved already (not again: a
    run resolves its config once)."""
    try:
        return _build_task(resolved)
    except TaskError:
        raise
    except ValueError as error:
        raise TaskError(f"{resolved.dataset.name}, seed {resolved.seed}: {error}") from error


def client_as_target(
    partition: FederatedPartition, sets: ClientEvaluationSets, client: int
) -> FederatedPartition:
    """`partition` whose target is its training client `client`: T = S_j (the label
    distribution it trains on), validated and tested on its own sets. The client still
    trains."""
    return dataclasses.replace(
        partition,
        target_label_dist=partition.client_label_dists[client],
        target_val_indices=sets.val_indices[client, : sets.val_sizes[client]],
        target_test_indices=sets.test_indices[client, : sets.test_sizes[client]],
        description=f"{partition.description}; training client {client} the target",
    )


def _build_task(config: ml_collections.ConfigDict) -> Task:
    a, e = config.algorithm, config.evaluation
    dataset, partition = load_data(config)
    client_sets = None
    if e.per_client:
        partition, client_sets = client_evaluation_sets(
            partition, dataset, seed=config.seed, val_fraction=e.client_val_fraction,
            test_size=e.client_test_size,
        )
        if e.client_as_target is not None:
            partition = client_as_target(partition, client_sets, e.client_as_target)
    _check_target_sets(partition, e.client_as_target)
    input_shape = tuple(dataset.train.x.shape[1:])
    try:
        model = make_model(config.model, input_shape, dataset.num_classes,
                           data=config.dataset.name)
        model = models.model_for_data(model, dataset, data=config.dataset.name)
    except ValueError as error:  # the model's own message, as it is
        raise TaskError(str(error)) from None
    params, _ = abstract_model(model, input_shape)
    method = registry.get_method(a.name)
    training_partition = partition
    if method.partition_transform is not None:
        # e.g. the Oracle: FedAvg on clients resampled to the target label distribution.
        training_partition = method.partition_transform(partition, dataset.train.y, config.seed)
    val = partition.target_val_indices
    try:
        sampler = sampling.sampler_for(config.training, training_partition.num_clients)
    except ValueError as error:
        raise TaskError(str(error)) from None
    context = registry.MethodContext(
        # The T the server's weights use: T itself until a feature says otherwise.
        partition=dataclasses.replace(
            training_partition,
            target_label_dist=np.asarray(partition.target_label_dist, np.float64),
        ),
        target_validation=(dataset.train.x[val], dataset.train.y[val]),
        dataset=dataset,
        model=model,
        rounds=config.training.rounds,
        seed=config.seed,
        clients_per_round=sampler.lanes(training_partition.num_clients),
        sampling_rate=sampler.rate,
        sampler=sampler,
    )
    features = tuple(
        (feature, hp)
        for feature in registry.registered_features()
        if (hp := feature.settings(a)) is not None
    )
    # By stage; a prepare that changes what an earlier stage fixed (T, S) is refused.
    context = registry.prepare_context(features, context)
    # The clients train on what the features left them (T estimated: a held-out share); the
    # task keeps the true T, for evaluation and the record.
    training_partition = dataclasses.replace(
        context.partition, target_label_dist=training_partition.target_label_dist
    )
    algorithm = make_algorithm(
        a.name,
        context=context,
        weights=a.weights,
        **{key: a[key] for key in registry.hyperparameter_fields() if a[key] is not None},
    )
    algorithm = registry.wrap_algorithm(algorithm, features, context)
    # The sampler's weights link wraps whatever weighting the features left (T, the DP release
    # of S, lambda); the bound it declares reaches the chain's links (DP on updates' noise)
    # whenever those were added (`server_chain`). Poisson's: the fixed-denominator weights.
    try:
        algorithm = sampler.with_weights(
            algorithm, context.weight_label_dists, context.partition.client_sizes)
    except ValueError as error:
        raise TaskError(f"training.client_sampling={sampler.name!r}: {error}") from None
    accounted = sampler.accounting(training_partition.num_clients)
    if (accounted is not None and accounted.sampling_rate is not None
            and algorithm.weighting.max_weight is None):
        # Accounted as Poisson sampling, its weights must bound a client's weight over every
        # client (the fixed-denominator weights), whoever is drawn.
        raise TaskError(
            f"training.client_sampling={sampler.name!r} is accounted as Poisson sampling "
            f"(q = {accounted.sampling_rate:g}), but its weights link declares no largest "
            "weight a client can receive: DP on updates' noise would follow the round's draw. "
            "Give it with_weights = fjp.algorithms.with_poisson_sampling (or a weighting with "
            "max_weight).")
    # What reports the method while it trains: it, and the lender of its weights.
    methods = registry.run_methods(a.name, a.weights, a)
    if config.server.optimizer is not None:  # else the plain weighted average, as before
        # One name: the sweep's key, "fedadam_fedpals" (a bare "fedadam" for FedAvg).
        name = registry.server_optimizer_key(config.server.optimizer, algorithm.name)
        try:  # a registered optimiser's build may refuse its values or return no transformation
            algorithm = server_optimizer_for(algorithm, **config.server.to_dict())
        except (ValueError, TypeError) as error:
            prefix = f"server optimiser {config.server.optimizer!r}: "
            message = str(error) if str(error).startswith(prefix) else f"{prefix}{error}"
            raise TaskError(message) from None
        algorithm = algorithm._replace(name=name)
    t = config.training
    clients = training_partition.num_clients
    problem = round_shape_mismatch(
        algorithm, params, clients, context.clients_per_round, dataset.num_classes
    )
    if problem is not None:
        raise TaskError(f"method {a.name!r}: {problem}.")
    training = LocalTraining(
        local_epochs=t.local_epochs, batch_size=t.batch_size, learning_rate=t.learning_rate
    )
    task = Task(
        config=config,
        dataset=dataset,
        partition=training_partition,
        algorithm=algorithm,
        model=model,
        training=training,
        context=context,
        target_label_dist=context.partition.target_label_dist,
        clients_per_round=context.clients_per_round,
        server_label_dists=context.server_label_dists,
        features=features,
        sampling_rate=context.sampling_rate,
        client_sets=client_sets,
        methods=methods,
        sampler=sampler,
    )
    return dataclasses.replace(task, summary=task_summary(task))


def server_weights(task: Task, state: Any = None) -> np.ndarray:
    """The server weights alpha of `state` with every client taking part (None: the initial
    state, round 1's weights); `base.weights_over_clients`."""
    partition = task.partition
    if state is None:
        state = init_server_state(
            task.algorithm, task.model.init(jax.random.PRNGKey(0)), partition.num_clients)
    return weights_over_clients(
        task.algorithm, partition.client_label_dists, partition.client_sizes, state,
        task.sampling_rate)


def task_summary(task: Task) -> dict:
    """What results.json records about the task, whatever its method: the data source, the
    partition, the server's weights alpha with every client taking part at the initial state
    (round 1's; the run replaces `alpha` and `ess` by the weights in use at its end, keeping
    these as `alpha_round_1` and `ess_round_1`) and their ESS, N, the participants per round,
    Poisson sampling's rate and, where a `label_marginals` feature released them, the S_i the
    weights see (`server_label_dists`). What a method says of itself (FedPALS' lambda and
    d(T, S)) its monitor reports (`Method.monitor`)."""
    partition = task.partition
    sizes = partition.client_sizes
    alpha = server_weights(task)
    ess = float(effective_sample_size(alpha, sizes))
    summary, released = partition.summary(), task.server_label_dists
    return {
        "dataset_source": task.dataset.source,
        "partition": summary,
        "alpha": alpha.tolist(),
        "ess": ess,
        "alpha_round_1": alpha.tolist(),
        "ess_round_1": ess,
        "total_examples": int(np.sum(sizes)),
        "clients_per_round": task.clients_per_round,
        **({} if task.sampling_rate is None else {"sampling_rate": task.sampling_rate}),
        **({} if released is None else {"server_label_dists": np.asarray(released).tolist()}),
    }
