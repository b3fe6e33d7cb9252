"""A run's per-client record (evaluation.per_client): what results.json and TensorBoard hold of
every training client's accuracy on its own examples, and the personalised models after training.

At every evaluation the global model is tested on each client's own test set and validated on
its own validation set (`TrainingRun.evaluate_clients`, one jitted pass over all clients).
The record keeps the latest per-client accuracies and, per client, those of the evaluation
where *its* validation accuracy was best (earliest on ties): each client's early stopping on
its own data, as the run's target is stopped on the target's validation set. Tables compare
methods at these (`per_client_accuracy_at_best_val`), so that a run whose target is a client
(`evaluation.client_as_target`) and the global model are stopped alike.

After training, `personalize` runs the modes of `evaluation.personalization` from the final
global model (fine-tuning, Ditto) or the run's initial params (local training), each client
choosing its steps and learning rate (Ditto: lambda) on its validation set
(`fedjax_pals.personalization`).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from fedjax_pals.metrics import client_accuracy_summary
from fedjax_pals.training import renumbered

# TensorBoard scalars of the per-client summary (clients/<name>), in this order.
SUMMARY_SCALARS = ("mean", "median", "worst_10", "std", "weighted_mean")


def _floats(values) -> list:
    """JSON-ready: NaN (a client without examples) as None."""
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(values, np.float64)]


def _array(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], np.float64)


class PerClientRecord:
    """The per-client part of one run's record (see the module docstring)."""

    def __init__(self, client_sizes: np.ndarray, sets_summary: Mapping[str, Any]):
        self.sizes = np.asarray(client_sizes, np.float64)
        self.sets_summary = dict(sets_summary)
        m = len(self.sizes)
        self.latest = np.full(m, np.nan)
        self.latest_val = np.full(m, np.nan)
        self.best_val = np.full(m, -np.inf)
        self.at_best_val = np.full(m, np.nan)
        self.best_round = np.zeros(m, np.int64)
        self.personalization: dict = {}

    def resume(self, previous: Mapping[str, Any] | None) -> None:
        """What the launches before this one recorded (results.json)."""
        if not previous or "per_client_accuracy" not in previous:
            return
        try:
            self.latest = _array(previous["per_client_accuracy"])
            self.latest_val = _array(previous["per_client_val_accuracy"])
            self.at_best_val = _array(previous["per_client_accuracy_at_best_val"])
            self.best_round = np.asarray(previous["per_client_best_val_round"], np.int64)
            best = _array(previous["per_client_best_val_accuracy"])
            self.best_val = np.where(np.isnan(best), -np.inf, best)
            self.personalization = dict(previous.get("personalization", {}))
        except (KeyError, TypeError, ValueError):
            return  # another version's record: start afresh, the run's own numbers go on

    def update(self, done: int, clients: Mapping[str, Any]) -> dict:
        """Records evaluation `done`'s per-client accuracies; returns its TensorBoard scalars."""
        test = np.asarray(clients["test"].accuracy, np.float64)
        val = np.asarray(clients["val"].accuracy, np.float64)
        self.latest, self.latest_val = test, val
        # A client without validation examples cannot choose: its latest evaluation counts.
        better = np.where(np.isnan(val), True, val > self.best_val)
        self.best_val = np.where(better, np.where(np.isnan(val), -np.inf, val), self.best_val)
        self.at_best_val = np.where(better, test, self.at_best_val)
        self.best_round = np.where(better, done, self.best_round)
        summary = client_accuracy_summary(test, self.sizes)
        return {f"clients/accuracy_{name}": summary[name] for name in SUMMARY_SCALARS
                if summary.get(name) is not None and np.isfinite(summary[name])}

    def results(self) -> dict:
        """results.json's per-client entries."""
        if np.all(np.isnan(self.latest)):
            return {"client_sets": self.sets_summary}
        best = np.where(np.isinf(self.best_val), np.nan, self.best_val)
        return {
            "client_sets": self.sets_summary,
            "per_client_accuracy": _floats(self.latest),
            "per_client_val_accuracy": _floats(self.latest_val),
            "per_client_summary": client_accuracy_summary(self.latest, self.sizes),
            "per_client_accuracy_at_best_val": _floats(self.at_best_val),
            "per_client_best_val_accuracy": _floats(best),
            "per_client_best_val_round": self.best_round.tolist(),
            "per_client_summary_at_best_val": client_accuracy_summary(
                self.at_best_val, self.sizes),
            **({"personalization": self.personalization} if self.personalization else {}),
        }

    def accuracies(self) -> dict[str, np.ndarray]:
        """Label -> per-client test accuracies, for the run's CDF figure."""
        shown = {"global model, each client's best round": self.at_best_val}
        for mode, record in self.personalization.items():
            shown[mode] = _array(record["per_client_accuracy"])
        return shown


def _evaluation_examples(run) -> tuple:
    """One array of the clients' validation (train split) and test (test split) examples, and
    their indices into it: what the personalisation evaluates on."""
    sets = run.client_sets
    val_used, val_indices = renumbered(sets.val_indices, sets.val_sizes)
    test_used, test_indices = renumbered(sets.test_indices, sets.test_sizes)
    train, test = run.dataset.train, run.dataset.test
    x = np.concatenate([np.asarray(train.x)[val_used], np.asarray(test.x)[test_used]])
    y = np.concatenate([np.asarray(train.y)[val_used], np.asarray(test.y)[test_used]])
    return x, y, val_indices, test_indices + len(val_used)


def personalization_key(seed: int, mode: str):
    """The minibatch schedule's key of a mode: a function of the run's seed and the mode."""
    import jax
    import zlib

    return jax.random.fold_in(jax.random.PRNGKey(seed), zlib.crc32(mode.encode()) & 0x7FFFFFFF)


def personalize(run, state, evaluation: Mapping[str, Any], batch_size: int,
                reference: np.ndarray) -> dict:
    """The modes of `evaluation.personalization` for a finished run (a `TrainingRun` with client
    sets; `state` its final state): mode -> its record for results.json."""
    from fedjax_pals import personalization as lib

    sets, out = run.client_sets, {}
    eval_x, eval_y, val_indices, test_indices = _evaluation_examples(run)
    data = (run.dataset.train.x, run.dataset.train.y, run.partition.client_indices,
            run.partition.client_sizes, eval_x, eval_y, val_indices, sets.val_sizes,
            test_indices, sets.test_sizes)
    modes = lib.registered_personalizations()
    for name in evaluation["personalization"] or ():
        context = lib.PersonalizationContext(
            apply_fn=run.model.apply, global_params=run.algorithm.eval_params(state),
            initial_params=run.initial_params(), data=data, evaluation=evaluation,
            learning_rate=run.training.learning_rate, batch_size=batch_size,
            key=personalization_key(run.seed, name))
        started = time.perf_counter()
        result = modes[name].personalize(context)
        if not isinstance(result, lib.PersonalizationResult):
            raise TypeError(f"personalisation {name!r} returned {type(result).__name__}, not a "
                            "fjp.PersonalizationResult.")
        accuracy = np.asarray(result.chosen_test_accuracy, np.float64)
        out[name] = {
            "per_client_accuracy": _floats(accuracy),
            "summary": client_accuracy_summary(accuracy, run.partition.client_sizes,
                                               reference=reference),
            "chosen": {
                "steps": np.asarray(result.chosen_steps).tolist(),
                "learning_rate": np.asarray(result.chosen_learning_rate).tolist(),
                "prox": np.asarray(result.chosen_prox).tolist(),
            },
            "client_steps": int(result.client_steps),
            "wall_seconds": time.perf_counter() - started,
            "grid": {"learning_rates": np.asarray(result.learning_rates).tolist(),
                     "steps": np.asarray(result.steps).tolist(),
                     "prox": np.asarray(result.prox).tolist()},
        }
    return out
