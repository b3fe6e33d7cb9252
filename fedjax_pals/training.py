"""The federated training loop: rounds, client sampling, evaluation, checkpoints.

Everything random derives from one seed: the initial params, each round's
client sample (a function of the seed and the round alone) and each round's
client data order (the round key folded with the client id). The same seed
and configuration therefore give identical results, and a run resumed from
a checkpoint continues exactly as if it had never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals.algorithms import FederatedAlgorithm, ServerState, init_server_state
from fedjax_pals.data import Dataset, FederatedPartition
from fedjax_pals.engine import DeviceData, LocalTraining, device_data, round_engine
from fedjax_pals.metrics import make_evaluator
from fedjax_pals.models import Model

_INIT_STREAM, _ROUND_STREAM, _SAMPLING_STREAM = 0, 1, 2


def sample_participants(
    seed: int, round_index: int, num_clients: int, clients_per_round: int | None
) -> np.ndarray:
    """The sorted client ids taking part in round `round_index`.

    Depends only on (seed, round_index): reproducible, and independent of what
    happened in earlier rounds. None or num_clients means every client.
    """
    if clients_per_round is None or clients_per_round == num_clients:
        return np.arange(num_clients, dtype=np.int32)
    if not 1 <= clients_per_round <= num_clients:
        raise ValueError(
            f"clients_per_round must be in [1, {num_clients}], got {clients_per_round}."
        )
    key = jax.random.fold_in(
        jax.random.fold_in(jax.random.PRNGKey(seed), _SAMPLING_STREAM), round_index
    )
    chosen = jax.random.choice(key, num_clients, (clients_per_round,), replace=False)
    return np.sort(np.asarray(chosen, np.int32))


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
    train_loss: list = dataclasses.field(default_factory=list)  # one per trained round
    wall_seconds: float = 0.0

    def best_val_index(self) -> int:
        """The evaluation with the best validation accuracy (earliest on ties)."""
        return int(np.argmax(self.val_accuracy))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _evaluate(evaluators, params) -> dict:
    return {name: evaluate(params) for name, evaluate in evaluators.items()}


def _save_checkpoint(path: str, state: ServerState, history: TrainingHistory) -> None:
    # Write then rename, so a run killed mid-write leaves the last good checkpoint.
    payload = flax.serialization.msgpack_serialize(
        {
            "state": flax.serialization.to_state_dict(jax.device_get(state)),
            "history": json.dumps(history.to_dict()),
        }
    )
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(payload)
    os.replace(tmp, path)


def _load_checkpoint(path: str, template: ServerState) -> tuple[ServerState, TrainingHistory]:
    with open(path, "rb") as f:
        raw = flax.serialization.msgpack_restore(f.read())
    state = flax.serialization.from_state_dict(template, raw["state"])
    return state, TrainingHistory(**json.loads(raw["history"]))


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
    strategy: str = "auto",
    chunk_size: int = 64,
    checkpoint_path: str | None = None,
    on_evaluation: Callable[[int, dict, TrainingHistory], None] | None = None,
) -> tuple[ServerState, TrainingHistory]:
    """Trains `algorithm` for `rounds` rounds and evaluates the global model.

    Every `eval_every` rounds (and after the last) the model of
    `algorithm.eval_params` is evaluated on the target validation and test sets
    (accuracy and macro-F1) and `on_evaluation(round, metrics, history)` is called. With
    `checkpoint_path`, the state and history are saved at every evaluation and
    an existing checkpoint is resumed from.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}.")
    if eval_every < 1:
        raise ValueError(f"eval_every must be >= 1, got {eval_every}.")
    num_clients = partition.num_clients
    clients_per_round = clients_per_round or num_clients
    sample_participants(seed, 0, num_clients, clients_per_round)  # validates the count

    data: DeviceData = device_data(
        dataset.train.x,
        dataset.train.y,
        partition.client_indices,
        partition.client_sizes,
        partition.client_label_dists,
    )
    engine = round_engine(algorithm, model, training, strategy=strategy, chunk_size=chunk_size)
    evaluators = {
        "val": make_evaluator(
            model.apply,
            dataset.train.x[partition.target_val_indices],
            dataset.train.y[partition.target_val_indices],
            model.num_classes,
        ),
        "test": make_evaluator(
            model.apply,
            dataset.test.x[partition.target_test_indices],
            dataset.test.y[partition.target_test_indices],
            model.num_classes,
        ),
    }
    root = jax.random.PRNGKey(seed)
    params = model.init(jax.random.fold_in(root, _INIT_STREAM))
    state = init_server_state(algorithm, params, num_clients)
    history = TrainingHistory()
    if checkpoint_path and os.path.exists(checkpoint_path):
        state, history = _load_checkpoint(checkpoint_path, state)

    round_root = jax.random.fold_in(root, _ROUND_STREAM)
    started = time.perf_counter() - history.wall_seconds
    for r in range(int(state.round), rounds):
        participants = sample_participants(seed, r, num_clients, clients_per_round)
        state, round_metrics = engine.run_round(
            data, state, participants, jax.random.fold_in(round_root, r)
        )
        loss = float(jnp.sum(round_metrics["train_loss"] * round_metrics["weights"]))
        if not np.isfinite(loss):
            raise FloatingPointError(
                f"training diverged in round {r + 1} (weighted train loss {loss}); "
                "lower the learning rate."
            )
        history.train_loss.append(loss)
        done = r + 1
        if done % eval_every == 0 or done == rounds:
            metrics = _evaluate(evaluators, algorithm.eval_params(state))
            history.rounds.append(done)
            history.target_accuracy.append(metrics["test"]["accuracy"])
            history.target_macro_f1.append(metrics["test"]["macro_f1"])
            history.val_accuracy.append(metrics["val"]["accuracy"])
            history.val_macro_f1.append(metrics["val"]["macro_f1"])
            history.wall_seconds = time.perf_counter() - started
            if checkpoint_path:
                _save_checkpoint(checkpoint_path, state, history)
            if on_evaluation is not None:
                on_evaluation(done, {**metrics, "train_loss": loss}, history)
    history.wall_seconds = time.perf_counter() - started
    return state, history
