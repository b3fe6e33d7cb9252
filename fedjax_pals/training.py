"""The federated training loop: rounds, client sampling, evaluation, checkpoints.

Everything random derives from one seed: the initial params, each round's client sample (a function
of the seed and the round alone) and each round's client data order (the round key folded with the
client id). The same seed and configuration therefore give identical results, and a run resumed from
a checkpoint continues exactly as if it had never stopped.

Checkpoints go through a `CheckpointerProtocol` (`save(state, history)`, `restore(template)`);
`fedjax_pals.Checkpointer` is the orbax one. Divergence is detected every round (see
`divergence_limit`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals import sampling
# The draws live in sampling.py (its samplers use them); here as they always were.
from fedjax_pals.sampling import (  # noqa: F401
    PERMUTATION_SAMPLING_MAX_CLIENTS, POISSON_OVERFLOW_PROBABILITY, _check_sampling_rate,
    poisson_capacity, sample_participants, sample_poisson_participants,
)
from fedjax_pals.algorithms import FederatedAlgorithm, ServerState, init_server_state
from fedjax_pals.data import Dataset, FederatedPartition
from fedjax_pals.engine import (
    DeviceData,
    LocalTraining,
    device_data,
    engine_key,
    local_view,
    round_engine,
)
from fedjax_pals.data.client_sets import ClientEvaluationSets
from fedjax_pals.metrics import client_accuracies, make_evaluator
from fedjax_pals.models import Model, model_for_data

_INIT_STREAM, _ROUND_STREAM = 0, 1  # the sampling streams (2, 3) are sampling.py's

# A training loss above DIVERGENCE_FACTOR * max(log K, L_0) is divergence (`divergence_limit`).
DIVERGENCE_FACTOR = 10.0


class TrainingDivergedError(FloatingPointError):
    """The training loss became non-finite or exploded (see `divergence_limit`)."""


def clients_per_round_from(
    num_clients: int, count: int | None = None, fraction: float | None = None
) -> int:
    """Participants per round from a count or a fraction (at least one client)."""
    if count is not None and fraction is not None:
        raise ValueError("give clients_per_round or client_fraction, not both.")
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise ValueError(f"client_fraction must be in (0, 1], got {fraction}.")
        return max(1, int(round(fraction * num_clients)))
    return num_clients if count is None else count


@dataclasses.dataclass
class TrainingHistory:
    """Metrics of the evaluated rounds (round r = after r rounds of training)."""

    rounds: list = dataclasses.field(default_factory=list)
    target_accuracy: list = dataclasses.field(default_factory=list)
    target_macro_f1: list = dataclasses.field(default_factory=list)
    val_accuracy: list = dataclasses.field(default_factory=list)
    val_macro_f1: list = dataclasses.field(default_factory=list)
    # One per trained round; None for a Poisson round that drew no client (nothing trained).
    train_loss: list = dataclasses.field(default_factory=list)
    wall_seconds: float = 0.0

    def best_val_index(self) -> int:
        """The evaluation with the best validation accuracy (earliest on ties)."""
        return int(np.argmax(self.val_accuracy))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class CheckpointerProtocol(Protocol):
    """Where `run_training` keeps its state between evaluations.

    `save` is called after every evaluation (after the `on_evaluation` hook, so
    what the hook records is never behind the checkpoint); `restore` once at
    the start, with a freshly initialised state as the template of shapes and
    types. A checkpointer must refuse (raise) a checkpoint of another run.
    """

    def save(self, state: ServerState, history: TrainingHistory) -> None: ...

    def restore(self, template: ServerState) -> tuple[ServerState, TrainingHistory] | None: ...


def divergence_limit(
    num_classes: int, initial_loss: float | None = None, factor: float = DIVERGENCE_FACTOR
) -> float:
    """The largest training loss that is not divergence: `factor * max(log K, L_0)`.

    The reference is the loss of a model that has learnt nothing: log K, the cross-entropy of the
    uniform prediction, or L_0, the loss of the initial model (on the target validation set), when
    that is larger (a logistic regression on unnormalised inputs starts at several times log K). A
    mean cross-entropy L gives the true class a geometric-mean probability exp(-L), so L > 10 L_ref
    is ten times further from the truth, in log-probability, than the untrained model: training with
    a workable learning rate never gets there (its loss starts near L_ref and falls), while a run
    whose weights blow up does within a round or two (logistic regression on the synthetic task at
    learning rate 1e6 reaches 1e5, against 92 here; at 50 it stays below 25).
    """
    reference = math.log(max(int(num_classes), 2))
    if initial_loss is not None and math.isfinite(initial_loss):
        reference = max(reference, float(initial_loss))
    return float(factor) * reference


# update_state(round_index, state_of) -> a replacement state or None: called before every
# round (0-based index, including the first round after a resume); `state_of()` slices the run's
# current state out of the runs axis, so call it only on the rounds that change the state.
StateUpdate = Callable[[int, Callable[[], ServerState]], "ServerState | None"]


class TrainingRun:
    """One run's side of the training loop: its data, evaluation, history and checkpoints.

    `run_trainings` drives several of these in lockstep through the engine's runs axis;
    `run_training` drives one. Construction validates the settings, builds the evaluators, draws the
    initial state from the seed and resumes from the checkpoint if there is one (`start_round`).
    `update_state` (a `StateUpdate`) may replace the run's state between rounds from the host, e.g.
    a new estimate of T (`algorithms.target_estimation.TargetReestimation`); the state it returns is
    what the next rounds and the checkpoints see.

    Who takes part: `sampler` (a `fedjax_pals.ClientSampler`) draws each round's clients on its
    lanes; without one, `clients_per_round` of them without replacement (None: every client),
    or with `sampling_rate` q Poisson sampling on `clients_per_round` lanes
    (`sampling.participation`). `sampler`, `clients_per_round` (the lanes) and `sampling_rate`
    (its `rate`) are attributes either way.
    """

    def __init__(
        self,
        algorithm: FederatedAlgorithm,
        model: Model,
        dataset: Dataset,
        partition: FederatedPartition,
        training: LocalTraining,
        *,
        rounds: int,
        seed: int = 0,
        eval_every: int = 1,
        clients_per_round: int | None = None,
        checkpointer: CheckpointerProtocol | None = None,
        on_evaluation: Callable[[int, dict, TrainingHistory], None] | None = None,
        on_round: Callable[[int, float], None] | None = None,
        max_train_loss: float | None = None,
        update_state: StateUpdate | None = None,
        sampling_rate: float | None = None,
        client_sets: ClientEvaluationSets | None = None,
        sampler: Any = None,
    ):
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}.")
        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {eval_every}.")
        # The model takes the data as stored (uint8 pixels scaled inside the step).
        model = model_for_data(model, dataset)
        num_clients = partition.num_clients
        if sampler is None:  # the older arguments: m of M without replacement, or Poisson
            if clients_per_round is None:  # None is everyone; 0 is an error, never "all"
                clients_per_round = num_clients
            sample_participants(seed, 0, num_clients, clients_per_round)  # validates the count
            if sampling_rate is not None:
                _check_sampling_rate(sampling_rate)
            sampler = sampling.participation(
                None if sampling_rate is not None else clients_per_round, num_clients,
                sampling_rate)
            lanes = clients_per_round if sampling_rate is not None else sampler.lanes(
                num_clients)
        else:
            if not isinstance(sampler, sampling.ClientSampler):
                raise ValueError(f"sampler must be a fedjax_pals.ClientSampler, got "
                                 f"{type(sampler).__name__}.")
            lanes = sampler.lanes(num_clients)
        clients_per_round, sampling_rate = lanes, sampler.rate
        if max_train_loss is not None and not max_train_loss > 0:
            raise ValueError(f"max_train_loss must be > 0, got {max_train_loss!r}.")
        self.algorithm, self.model, self.dataset = algorithm, model, dataset
        self.partition, self.training = partition, training
        self.rounds, self.seed, self.eval_every = rounds, seed, eval_every
        self.sampler = sampler
        # Every lane of a round may be empty (Poisson sampling, a user's sampler), not of a
        # fixed-size sample: only then is the draw checked after the round.
        self._may_draw_nobody = not isinstance(
            sampler, (sampling.EveryClient, sampling.WithoutReplacement))
        self.clients_per_round = clients_per_round  # the lanes a round runs
        self.sampling_rate = sampling_rate
        self.checkpointer = checkpointer
        self.on_evaluation, self.on_round = on_evaluation, on_round
        self.update_state = update_state

        def evaluator(split, indices):
            return make_evaluator(
                model.apply, split.x[indices], split.y[indices], model.num_classes
            )

        self.evaluators = {
            "val": evaluator(dataset.train, partition.target_val_indices),
            "test": evaluator(dataset.test, partition.target_test_indices),
        }
        self.client_sets = client_sets
        self._client_sets = None
        if client_sets is not None:
            if client_sets.num_clients != num_clients:
                raise ValueError(
                    f"client_sets hold {client_sets.num_clients} clients, the partition "
                    f"{num_clients}."
                )
            # Only the examples the sets use, on the device once: a sweep's runs on one data
            # set would otherwise each hold a copy of the whole split.
            self._client_sets = {
                "val": _compact(dataset.train, client_sets.val_indices, client_sets.val_sizes),
                "test": _compact(dataset.test, client_sets.test_indices, client_sets.test_sizes),
            }
        root = jax.random.PRNGKey(seed)
        self._round_root = jax.random.fold_in(root, _ROUND_STREAM)
        params = self.initial_params()
        self.state = init_server_state(algorithm, params, num_clients)
        self.history = TrainingHistory()
        self.limit = max_train_loss
        if self.limit is None:
            # From the initial model, so a resumed run uses the same limit.
            initial_loss = self.evaluators["val"](algorithm.eval_params(self.state))["loss"]
            self.limit = divergence_limit(model.num_classes, initial_loss)
        if checkpointer is not None:
            self._restore()
        self.start_round = int(self.state.round)
        self._started = time.perf_counter() - self.history.wall_seconds

    def _restore(self) -> None:
        restored = self.checkpointer.restore(self.state)
        if restored is None:
            return
        state, history = restored
        done = int(state.round)
        where = getattr(self.checkpointer, "directory", self.checkpointer)
        if done > self.rounds:
            raise ValueError(
                f"the checkpoint in {where} is at round {done}, beyond rounds={self.rounds}: it "
                f"belongs to a longer run. Ask for rounds >= {done}, or use another "
                "checkpoint location."
            )
        if len(history.train_loss) != done:
            raise ValueError(
                f"the checkpoint in {where} is inconsistent: its state is at round {done} "
                f"but its history has {len(history.train_loss)} rounds; delete it to start "
                "afresh."
            )
        self.state, self.history = state, history

    def initial_params(self):
        """The run's initial global params (a function of its seed alone)."""
        root = jax.random.PRNGKey(self.seed)
        return self.model.init(jax.random.fold_in(root, _INIT_STREAM))

    def evaluate_clients(self, params, *, per_client_params: bool = False) -> dict:
        """Every training client's accuracy on its own validation and test sets
        (`client_sets`): {"val": ClientEvaluation, "test": ClientEvaluation}, each one jitted
        pass over all clients. `params`: the global model, or with `per_client_params` one
        model per client (a leading client axis)."""
        if self._client_sets is None:
            raise ValueError("this run has no client_sets to evaluate on.")
        return {
            kind: client_accuracies(
                self.model.apply, params, x, y, indices, sizes,
                per_client_params=per_client_params,
            )
            for kind, (x, y, indices, sizes) in self._client_sets.items()
        }

    def participants(self, round_index: int) -> np.ndarray:
        """Round `round_index`'s client ids, as the run's sampler draws them
        (`fedjax_pals.sampling`): `clients_per_round` lanes, those no client drew last with the
        id M. ValueError for a draw of another shape or out-of-range ids."""
        if self.sampling_rate is not None and isinstance(self.sampler, sampling.PoissonSampling):
            # The older Poisson arguments may give more lanes than the sampler's own.
            return sample_poisson_participants(
                self.seed, round_index, self.partition.num_clients, self.sampling_rate,
                self.clients_per_round,
            )
        drawn = np.asarray(self.sampler.draw(self.seed, round_index, self.partition.num_clients))
        clients = drawn[drawn < self.partition.num_clients] if drawn.ndim == 1 else drawn
        if drawn.shape != (self.clients_per_round,) or not np.issubdtype(drawn.dtype, np.integer) \
                or np.any(drawn < 0) or np.any(drawn > self.partition.num_clients) \
                or np.any(np.diff(clients) <= 0) or np.any(np.diff(drawn) < 0):
            raise ValueError(
                f"client sampler {type(self.sampler).__name__}: its draw for round "
                f"{round_index + 1} is {drawn.dtype} of shape {drawn.shape}, not "
                f"{self.clients_per_round} distinct client ids in [0, "
                f"{self.partition.num_clients}], sorted, the id M last for a lane no client "
                "drew (a client in two lanes would weigh twice).")
        return drawn.astype(np.int32)

    def round_key(self, round_index: int) -> jax.Array:
        return jax.random.fold_in(self._round_root, round_index)

    def after_round(self, done: int, state_of: Callable[[], ServerState], metrics: dict) -> None:
        """Bookkeeping after round `done`: divergence, history, hooks, evaluation, checkpoint.

        `state_of()` gives the run's new state; it is asked for only when needed
        (evaluation and checkpoint rounds), as slicing it out of a runs axis costs.
        """
        # A Poisson round that drew no client trained nothing: its loss is None (null in
        # results.json), not the 0 of an empty weighted sum, which would read as a perfect fit.
        drew_nobody = self._may_draw_nobody and bool(
            np.all(self.participants(done - 1) >= self.partition.num_clients))
        loss = None
        if not drew_nobody:
            loss = float(
                np.sum(np.asarray(metrics["train_loss"]) * np.asarray(metrics["weights"]))
            )
        if loss is not None and (not np.isfinite(loss) or loss > self.limit):
            raise TrainingDivergedError(
                f"training diverged in round {done}: the weighted training loss is {loss:.6g}, "
                f"above the divergence limit {self.limit:.4g} ({DIVERGENCE_FACTOR:g} x the loss "
                f"of the untrained model, or of the uniform guess over K = "
                f"{self.model.num_classes} classes; see divergence_limit). Lower the learning "
                f"rate (now {self.training.learning_rate:g})."
            )
        history = self.history
        history.train_loss.append(loss)
        self.last_weights = metrics["weights"]  # the round's server weights, for the hooks
        if self.on_round is not None:
            self.on_round(done, loss)
        if not (done % self.eval_every == 0 or done == self.rounds):
            return
        self.state = state_of()
        eval_params = local_view(self.algorithm.eval_params(self.state))
        metrics = {name: evaluate(eval_params) for name, evaluate in self.evaluators.items()}
        if self._client_sets is not None:
            metrics["clients"] = self.evaluate_clients(eval_params)
        if not all(np.isfinite(metrics[m]["loss"]) for m in ("val", "test")):
            raise TrainingDivergedError(
                f"training diverged by round {done}: the evaluation loss of the global "
                f"model is not finite (validation {metrics['val']['loss']}, test "
                f"{metrics['test']['loss']}). Lower the learning rate (now "
                f"{self.training.learning_rate:g})."
            )
        history.rounds.append(done)
        history.target_accuracy.append(metrics["test"]["accuracy"])
        history.target_macro_f1.append(metrics["test"]["macro_f1"])
        history.val_accuracy.append(metrics["val"]["accuracy"])
        history.val_macro_f1.append(metrics["val"]["macro_f1"])
        history.wall_seconds = time.perf_counter() - self._started
        # The hook first, then the checkpoint: what the hook records (results,
        # metrics) is never behind the checkpoint a resumed run starts from.
        if self.on_evaluation is not None:
            self.on_evaluation(done, {**metrics, "train_loss": loss}, history)
        if self.checkpointer is not None:
            self.checkpointer.save(self.state, history)

    def finish(self) -> tuple[ServerState, TrainingHistory]:
        self.history.wall_seconds = time.perf_counter() - self._started
        return self.state, self.history

    def lockstep_key(self) -> tuple:
        """What runs trained together must share (besides the engine's `engine_key`).

        Not their data: runs on different data sets of the same example shape (a synthetic
        task drawn per seed) train together on the pooled examples (`_stacked_client_tables`).
        """
        leaves, treedef = jax.tree_util.tree_flatten(self.state)
        train_x = self.dataset.train.x
        return (
            treedef,
            tuple((np.shape(leaf), str(getattr(leaf, "dtype", type(leaf)))) for leaf in leaves),
            (train_x.shape[1:], str(train_x.dtype)),
            self.model.num_classes,
            self.partition.num_clients,
            self.clients_per_round,
            self.sampling_rate,
            self.sampler,
            self.rounds,
            self.start_round,
        )


def renumbered(indices: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The examples that `indices` (rows valid in [:sizes]) use, and the indices renumbered
    into them (padding 0)."""
    valid = np.arange(indices.shape[1])[None, :] < sizes[:, None]
    used = np.unique(indices[valid]) if valid.any() else np.zeros(1, np.int64)
    return used, np.where(valid, np.searchsorted(used, indices), 0).astype(np.int32)


def _compact(split, indices: np.ndarray, sizes: np.ndarray) -> tuple:
    """(x, y, indices, sizes) of the examples that `indices` (valid in [:sizes]) use, on the
    device, the indices renumbered into them."""
    used, renumbered_indices = renumbered(indices, sizes)
    x, y = np.asarray(split.x)[used], np.asarray(split.y)[used]
    return (jnp.asarray(x), jnp.asarray(y), jnp.asarray(renumbered_indices),
            jnp.asarray(sizes, jnp.int32))


def _stacked_client_tables(runs: Sequence[TrainingRun]) -> DeviceData:
    """The runs' client tables on a leading runs axis (rows padded to the widest run).

    Runs on one training split index it as it is (no copy). Runs on several (a synthetic
    task drawn per seed) index the splits' concatenation, each run's rows shifted to where
    its split starts, so that they still train as one program.
    """
    splits = {id(run.dataset.train): run.dataset.train for run in runs}
    offsets, start = {}, 0
    for key, split in splits.items():
        offsets[key], start = start, start + split.x.shape[0]
    if len(splits) == 1:
        (pooled,) = splits.values()
        train_x, train_y = pooled.x, pooled.y
    else:
        train_x = np.concatenate([split.x for split in splits.values()])
        train_y = np.concatenate([split.y for split in splits.values()])
        for array in (train_x, train_y):
            array.setflags(write=False)  # read-only: the device may alias it (device_data)
    tables = [run.partition.client_indices for run in runs]
    shifts = [offsets[id(run.dataset.train)] for run in runs]
    width = max(table.shape[1] for table in tables)
    indices = np.stack(
        [np.pad(t, ((0, 0), (0, width - t.shape[1]))) + s for t, s in zip(tables, shifts)]
    )
    return device_data(
        train_x,
        train_y,
        indices,
        np.stack([run.partition.client_sizes for run in runs]),
        np.stack([run.partition.client_label_dists for run in runs]),
    )


def run_trainings(
    runs: Sequence[TrainingRun],
    *,
    backend: str = "auto",
    chunk_size: int = 64,
    mesh: jax.sharding.Mesh | None = None,
) -> list[tuple[ServerState, TrainingHistory] | Exception]:
    """Trains several runs together through the engine's runs axis (one program for all).

    The runs must share their structure (model, algorithm kind and hyperparameters compiled into the
    round, local training, data set, number of clients and participants, rounds, and the round they
    resume from); they may differ in what lives in the state: seed (initial params, client sample,
    data order), partition (client tables, padded to a common width), T and lambda. Each run gives
    the numbers it gives alone, and its hooks and checkpoints run as if alone. A run that diverges
    (or whose hook raises) gets its exception in its place; the others go on.
    """
    if not runs:
        return []
    first = runs[0]
    options = dict(backend=backend, chunk_size=chunk_size, mesh=mesh)
    engine = round_engine(first.algorithm, first.model, first.training, **options)
    for index, run in enumerate(runs[1:], 1):
        other = round_engine(run.algorithm, run.model, run.training, **options)
        if other is not engine or run.lockstep_key() != first.lockstep_key():
            raise ValueError(
                f"run {index} cannot train in lockstep with run 0: the runs of one "
                "run_trainings call must share the model, the algorithm's compiled parts, "
                "the local training, the examples' shape, the number of clients and "
                "participants, the rounds and the round they resume from; group them by "
                "`training_group_key` first."
            )
    data = _stacked_client_tables(runs)
    states = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *[run.state for run in runs])
    outcomes: list = [None] * len(runs)
    for r in range(first.start_round, first.rounds):
        for i, run in enumerate(runs):
            if outcomes[i] is not None or run.update_state is None:
                continue
            try:
                new_state = run.update_state(r, lambda i=i: _run_slice(states, jnp.int32(i)))
            except Exception as error:  # noqa: BLE001 - one run's failure is its own
                outcomes[i] = error
                continue
            if new_state is not None:
                states = _set_run_slice(states, jnp.int32(i), new_state)
        participants = np.stack([run.participants(r) for run in runs])
        keys = jnp.stack([run.round_key(r) for run in runs])
        states, metrics = engine.run_rounds(data, states, participants, keys)
        for i, run in enumerate(runs):
            if outcomes[i] is not None:
                continue  # failed: its slot keeps computing, unread, so the others keep one program
            run_metrics = {name: value[i] for name, value in metrics.items()}
            try:
                run.after_round(r + 1, lambda i=i: _run_slice(states, jnp.int32(i)), run_metrics)
            except Exception as error:  # noqa: BLE001 - one run's failure is its own
                outcomes[i] = error
        if all(outcome is not None for outcome in outcomes):
            break
    return [
        outcome if outcome is not None else run.finish() for run, outcome in zip(runs, outcomes)
    ]


@jax.jit
def _run_slice(states, i) -> ServerState:
    return jax.tree_util.tree_map(lambda leaf: leaf[i], states)


@jax.jit
def _set_run_slice(states, i, state):
    return jax.tree_util.tree_map(lambda all_runs, one: all_runs.at[i].set(one), states, state)


def training_group_key(run: TrainingRun, *, backend: str = "auto", chunk_size: int = 64) -> tuple:
    """Runs with equal keys can go through one `run_trainings` call: the engine's static
    spec (`engine_key`) and the run's `lockstep_key`."""
    spec = engine_key(
        run.algorithm, run.model, run.training, backend=backend, chunk_size=chunk_size
    )
    return (spec, run.lockstep_key())


def run_training(
    algorithm: FederatedAlgorithm,
    model: Model,
    dataset: Dataset,
    partition: FederatedPartition,
    training: LocalTraining,
    *,
    rounds: int,
    seed: int = 0,
    eval_every: int = 1,
    clients_per_round: int | None = None,
    backend: str = "auto",
    chunk_size: int = 64,
    checkpointer: CheckpointerProtocol | None = None,
    on_evaluation: Callable[[int, dict, TrainingHistory], None] | None = None,
    on_round: Callable[[int, float], None] | None = None,
    max_train_loss: float | None = None,
    update_state: StateUpdate | None = None,
    sampling_rate: float | None = None,
    client_sets: ClientEvaluationSets | None = None,
    sampler: Any = None,
) -> tuple[ServerState, TrainingHistory]:
    """Trains `algorithm` for `rounds` rounds and evaluates the global model.

    Every `eval_every` rounds (and after the last) the model of `algorithm.eval_params` is evaluated
    on the target validation and test sets (accuracy and macro-F1) and
    `on_evaluation(round, metrics, history)` is called; `on_round(round, train_loss)` is called
    after every round (train_loss None when Poisson sampling drew no client). `backend` and `chunk_size` choose how the engine executes a round
    (`round_engine`); they do not change the results.

    Checkpoints: with `checkpointer` (see `CheckpointerProtocol`; the orbax one is
    `fedjax_pals.Checkpointer(directory, identity=...)`), the state and history are saved at every
    evaluation and an existing checkpoint is resumed from; one beyond `rounds` is refused. The run's
    identity is the checkpointer's: `train_and_evaluate` gives it the config digest.

    Divergence: a round whose weighted training loss is non-finite or above `max_train_loss`
    (default `divergence_limit(K, L_0)` = 10 max(log K, L_0), L_0 the initial model's validation
    loss), or whose evaluation loss is non-finite, raises `TrainingDivergedError`.

    `update_state` may replace the state between rounds (see `TrainingRun`).

    Per-client evaluation: with `client_sets` (`fjp.client_evaluation_sets`), every training
    client's accuracy on its own validation and test examples is evaluated with the target's,
    in one jitted pass over all clients, and passed to `on_evaluation` as metrics["clients"]
    ({"val", "test"}: `fjp.ClientEvaluation`).

    Participation: `clients_per_round` clients drawn without replacement each round (None:
    every client); with `sampling_rate` q, Poisson sampling instead: each client with
    probability q, on `clients_per_round` lanes (`poisson_capacity`), for an algorithm whose
    weights are `fjp.algorithms.with_poisson_sampling`'s. With `sampler` (a
    `fedjax_pals.ClientSampler`), that sampler draws each round's clients instead; the
    algorithm should carry its weights link (`sampler.with_weights(algorithm, S, n)`).

    This is `run_trainings` with one run.
    """
    run = TrainingRun(
        algorithm,
        model,
        dataset,
        partition,
        training,
        rounds=rounds,
        seed=seed,
        eval_every=eval_every,
        clients_per_round=clients_per_round,
        checkpointer=checkpointer,
        on_evaluation=on_evaluation,
        on_round=on_round,
        max_train_loss=max_train_loss,
        update_state=update_state,
        sampling_rate=sampling_rate,
        client_sets=client_sets,
        sampler=sampler,
    )
    (outcome,) = run_trainings([run], backend=backend, chunk_size=chunk_size)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome
