"""`train_and_evaluate(config, workdir)`: one run from its config, resumable, in its workdir.

The order of work is chosen so that every mistake costs as little as possible:

1. the config is validated and resolved, once (milliseconds, no data: `resolve_config`);
2. the workdir is created, checked writable and locked; a run it already holds must have
   the same config (else refused, naming the differing keys, unless `overwrite`);
3. the task is built (data, partition, lambda, algorithm, model: `build_task`), so data
   errors come before training and before `overwrite` deletes anything;
4. training resumes from the latest checkpoint (or starts); at every evaluation the metrics
   go to TensorBoard and metrics.jsonl, results.json is rewritten, then the checkpoint is
   saved (config and digest inside it); curves.png is drawn at the end.

A run killed at any moment and started again with the same config continues from its last
checkpoint and computes bit-identical results (only `wall_seconds` differs).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging

from fedjax_pals.algorithms import registry, server_chain
from fedjax_pals.sampling import EveryClient, PoissonSampling, WithoutReplacement
from fedjax_pals.algorithms.base import state_mismatch
from fedjax_pals.data.datasets import dataset_label
from fedjax_pals.engine import resolve_backend
from fedjax_pals.experiment import diskspace, mlflow_writer
from fedjax_pals.experiment.config import (
    RUNS_PER_PROGRAM,
    ResolvedConfig,
    as_dict,
    per_run_state_keys,
    per_run_state_presence_keys,
    resolve_config,
)
from fedjax_pals.experiment.engine_record import engine_segments
from fedjax_pals.experiment.per_client import PerClientRecord, personalize
from fedjax_pals.experiment.plots import plot_client_accuracy_cdf, plot_curves, with_dataset
from fedjax_pals.experiment.interruption import ACTIVITY, uninterrupted
from fedjax_pals.experiment.progress import Progress, percent
from fedjax_pals.experiment.task import build_resolved_task
from fedjax_pals.experiment.workdir import RESULTS_FILE, Workdir, write_json
from fedjax_pals.experiment.writers import HPARAMS_FILE, MetricWriter
from fedjax_pals.metrics import MACRO_F1_CLASSES
from fedjax_pals.runtime import is_main_process
from fedjax_pals.training import TrainingHistory, TrainingRun, run_trainings, training_group_key


def _sync(name: str) -> None:
    """A barrier across processes (a no-op in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _read_results(path: str) -> dict | None:
    """A run's results.json so far, or None if there is none it can read."""
    try:
        with open(path) as f:
            results = json.load(f)
    except (OSError, ValueError):
        return None
    return results if isinstance(results, dict) else None


# A per-client run's figure: the distribution of its clients' accuracies.
CLIENTS_FIGURE = "client_accuracy.png"

# TensorBoard charts (Custom Scalars) whose curves share one plot: tag regexes, matched at a
# tag's start (so "$" ends each: "target/accuracy" alone would draw accuracy_at_best_val too).
CHARTS = {
    "accuracy (target, validation)": ["target/accuracy$", "val/accuracy$"],
    "macro-F1 (target, validation)": ["target/macro_f1$", "val/macro_f1$"],
    "loss (train, target, validation)": ["train/loss$", "target/loss$", "val/loss$"],
    "alpha per client (server weights)": [r"server/alpha/client_\d+$"],
    "per-client test accuracy (evaluation.per_client)": [
        "clients/accuracy_mean$", "clients/accuracy_median$", "clients/accuracy_worst_10$",
        "clients/accuracy_weighted_mean$"],
}
# TensorBoard's HParams dashboard: its metric columns (the headline first; each its last value)
# and the hyperparameters it shows by default (it orders them by name): the method key, the
# seed, FedPALS' lambda (either way of giving it) and the learning rate.
HPARAMS_METRICS = {
    "target/accuracy_at_best_val": "target test accuracy at the best-validation round (so far)",
    "target/accuracy": "target test accuracy, last evaluation",
    "val/accuracy": "target validation accuracy, last evaluation",
    "target/macro_f1": "target test macro-F1, last evaluation",
}
# Shown by default in the HParams table, with what the registrations declare shown
# (`hyperparameter(..., shown=True)`: FedPALS' lam and ess_fraction).
HPARAMS_SHOWN = ("method", "seed", "training.learning_rate")
# Written when they change (`MetricWriter`'s changed_only): what is reported of the server is
# constant for most runs, and would be flat lines (alpha's histogram and ESS, FedPALS' lambda
# and d(T,S), what a monitor reports, unless adaptive lambda, T's re-estimation or a part of
# the clients per round change them). Alpha per client is written every round: the "alpha
# per client" chart draws it as lines.
CHANGED_ONLY = r"server/(?!alpha/client_).*"
# Per-client (per-class) scalars of alpha (of T's estimate) for at most this many clients.
PER_CLIENT_SCALARS = 20


def _indexed(prefix: str, values) -> dict:
    """{f"{prefix}_{i}": v}, i zero-padded so that the scalars sort in index order."""
    width = len(str(len(values) - 1))
    return {f"{prefix}_{i:0{width}d}": v for i, v in enumerate(values)}


def _chained(updates: list[tuple[str, Callable]]) -> Callable | None:
    """One `TrainingRun` state update from the features' `(name, Monitor.update_state)` (None
    when there are none). Each replacement is checked against the state it was given (its
    structure, shapes and dtypes): another one would fail in the compiled round as a long
    traceback naming neither the feature nor the leaf, and another dtype would train silently."""
    if not updates:
        return None
    # A TaskError (a ValueError): the feature does not fit this run, which the launchers print
    # as one `error:` line and a sweep reports as "failed" with this message.
    from fedjax_pals.experiment.task import TaskError

    def update(round_index, state_of):
        new = None
        for name, one in updates:
            given = state_of if new is None else (lambda s=new: s)
            replaced = one(round_index, given)
            if replaced is not None:
                problem = state_mismatch(replaced, given())
                if problem is not None:
                    raise TaskError(
                        f"feature {name!r}: its Monitor.update_state returned {problem} "
                        f"(before round {round_index + 1})."
                    )
                new = replaced
        return new

    return update


def below_chance_note(done: int, scores: Any) -> str | None:
    """Why an evaluation's target accuracy is below chance (a uniform guess over the classes of
    the target's test labels, 1 / K_T), when most of the model's predictions fall on one class:
    which class, how many of the target's examples it takes and how few of them hold it. An
    early model is often near-constant (the synthetic task's untrained logistic regression on
    inputs far from the origin predicts one class almost everywhere), and a constant model
    scores that class's share of the target, 0 for a class the target lacks. None otherwise
    (or without the counts: `metrics.Scores.predicted`, `support`)."""
    predicted, support = getattr(scores, "predicted", None), getattr(scores, "support", None)
    if predicted is None or support is None or not np.sum(support):
        return None
    total, present = float(np.sum(support)), int(np.count_nonzero(support))
    chance = 1.0 / present
    top = int(np.argmax(predicted))
    share = predicted[top] / max(float(np.sum(predicted)), 1.0)
    if not scores["accuracy"] < chance or share < 0.5:
        return None
    return (
        f"  round {done}: target acc {percent(scores['accuracy'])} is below chance "
        f"({percent(chance)}, T's {present} classes) because the model predicts class {top} for "
        f"{percent(share)} of the target's test examples, of which {percent(support[top] / total)}"
        f" are class {top} (an early model is often near-constant)"
    )


class _TrackedCheckpointer:
    """The run's checkpointer, its saves uncut by a signal and recorded in `ACTIVITY` (the round
    an interrupted command resumes from)."""

    def __init__(self, checkpointer, key: str, after_save: Callable[[], None] | None = None):
        self._checkpointer, self._key, self._after_save = checkpointer, key, after_save

    def save(self, state, history) -> None:
        with uninterrupted():
            self._checkpointer.save(state, history)
            ACTIVITY.run_saved(self._key, history.rounds[-1] if history.rounds else None)
        if self._after_save is not None:
            self._after_save()

    def __getattr__(self, name: str):
        return getattr(self._checkpointer, name)


class _PreparedRun:
    """One run between preparation and its results: its workdir, writer, progress and loop.

    Preparation does steps 1-3 of the module docstring and opens the run's
    resources (lock, metric writer, progress bar, checkpointer) in `self.stack`;
    `finish` writes the final results and closes them.
    """

    def __init__(
        self,
        config: Any,
        workdir,
        *,
        overwrite: bool,
        quiet: bool,
        mlflow_tracking_uri=None,
        mlflow_experiment=None,
        run_name=None,
    ):
        if not isinstance(overwrite, bool):
            raise TypeError(f"overwrite must be True or False, got {overwrite!r}.")
        # The one resolution of the run's config (a ResolvedConfig is taken as it is), which
        # the workdir, the task and the writers take as they are.
        resolved = resolve_config(config)
        self.config = resolved.config
        self.main = main = is_main_process()
        quiet = quiet or not main
        if main and mlflow_writer.tracking_uri(mlflow_tracking_uri) is not None:
            # Before the workdir is made and the data read: a missing MLflow or an unreachable
            # store is one line in seconds, not after the loading (or minutes of retries).
            mlflow_writer.check_store(mlflow_tracking_uri)
        self.stack = stack = contextlib.ExitStack()
        try:
            self.workdir = wd = stack.enter_context(Workdir(workdir, resolved, lock=main))
            # What an interrupted command says of this run (`interruption.interruption_message`).
            self.key = wd.path
            ACTIVITY.run_prepared(self.key, os.fspath(workdir), self.config.training.rounds)
            if not overwrite:
                # Every process reads (and so raises) alike: their orbax barriers line up.
                ACTIVITY.run_saved(self.key, wd.check_reusable())
                if wd.fallback_note and main:
                    logging.warning("%s", wd.fallback_note)
            self.task = task = build_resolved_task(self.config)
            if main and overwrite:
                removed = wd.clear()
                if removed and not quiet:
                    logging.info("overwrite: removed %s from %s", ", ".join(removed), wd.path)
            # Recorded before any is created: the record is what a later --overwrite deletes.
            wd.record_launch()
            _sync("fedjax_pals.train_and_evaluate.workdir_ready")
            checkpointer = wd.checkpointer()
            stack.callback(checkpointer.close)
            start_round = checkpointer.check_identity() or 0
            ACTIVITY.run_starts(self.key, start_round)
            summary = task.summary
            self.backend = resolve_backend(self.config.engine.backend, task.model)
            rounds = self.config.training.rounds
            self.method = resolved.method  # as a sweep names it ("fedprox_fedpals")
            self.title = f"{resolved.label} on {task.partition.description}"
            # The figures' title names the data set too (the description may already).
            self.figure_title = with_dataset(self.title, dataset_label(self.config.dataset.name))
            previous = _read_results(wd.file(RESULTS_FILE)) if start_round else None
            segments, engine_warning = engine_segments(previous, start_round, self.backend)
            if engine_warning and main:
                logging.warning("%s: %s", wd.path, engine_warning)
            self.header = {
                "config": resolved.plain,
                "config_digest": resolved.digest,
                **summary,
                "backend": self.backend,
                "engine": segments,  # the backend and devices each round ran on
            }
            self.writer = writer = stack.enter_context(
                MetricWriter(
                    wd.path,
                    enabled=main,
                    resume_step=start_round,
                    mlflow_tracking_uri=mlflow_tracking_uri,
                    mlflow_experiment=mlflow_experiment,
                    mlflow_run_name=run_name,
                    record=wd.record,
                    changed_only=CHANGED_ONLY,
                )
            )
            hparams = {"method": self.method, **resolved.plain}
            shown = (*HPARAMS_SHOWN[:2], *registry.shown_hyperparameters(), *HPARAMS_SHOWN[2:])
            writer.write_hparams(hparams, HPARAMS_METRICS, shown=shown)
            writer.write_layout(CHARTS)
            self.progress = progress = stack.enter_context(
                Progress(
                    rounds,
                    desc=f"{resolved.label} seed {self.config.seed}",  # "FedAdam+FedPALS seed 0"
                    initial=start_round,
                    quiet=quiet,
                    first_step_compiles=True,
                )
            )
            # What the run's method (and the lender of its weights) and its features report
            # while it trains: the method's first (a feature's scalars override them).
            monitors = [("server_weights", registry.ServerWeightsMonitor(task))] + [
                (owner.name, owner.monitor(hp, task))
                for owner, hp in (*task.methods, *task.features) if owner.monitor
            ]
            self.monitors = [monitor for _, monitor in monitors]
            headlines = [line for monitor in self.monitors if (line := monitor.headline())]
            progress.write(
                # The first line names the data set ("Fashion-MNIST: FedPALS on sparsity ..."),
                # as the figures' titles do; then what the method reports (FedPALS' lambda).
                f"{self.figure_title}: "
                + "".join(f"{line}, " for line in headlines)
                + f"{rounds} rounds, backend {self.backend}"
                + (f", resuming after round {start_round}" if start_round else "")
            )
            if task.sampling_rate is not None:  # another estimator: say so under the first line
                progress.write(
                    f"  Poisson sampling: each client a round with probability "
                    f"{task.sampling_rate:g} on {task.clients_per_round} lanes; a drawn "
                    "client's update weighs alpha_i / q (the fixed-denominator estimator)"
                )
            if task.sampler is not None and not isinstance(task.sampler, BUILT_IN_SAMPLERS):
                progress.write(f"  client sampling: "
                               f"{task.sampler.describe(task.partition.num_clients)}")
            # What the server does with the round's updates, in the order it does it.
            progress.write(f"  server chain: {server_chain.describe(task.algorithm)}")
            for monitor in self.monitors:
                if previous:  # what the launches before this one recorded
                    monitor.resume(previous, start_round)
                line = monitor.header()
                if line:
                    progress.write(f"  {line}")
            updates = [(name, m.update_state) for name, m in monitors if m.update_state is not None]
            self.clients = None
            if task.client_sets is not None:
                self.clients = PerClientRecord(
                    task.partition.client_sizes, task.client_sets.summary())
                self.clients.resume(previous)
            self.run = TrainingRun(
                task.algorithm,
                task.model,
                task.dataset,
                task.partition,
                task.training,
                rounds=rounds,
                seed=self.config.seed,
                eval_every=self.config.training.eval_every,
                clients_per_round=task.clients_per_round,
                sampling_rate=task.sampling_rate,
                sampler=task.sampler,
                checkpointer=_TrackedCheckpointer(checkpointer, self.key, self._show_evaluation),
                on_evaluation=self._on_evaluation,
                on_round=self._on_round,
                update_state=_chained(updates),
                client_sets=task.client_sets,
            )
        except BaseException:
            if hasattr(self, "key"):  # ended (with an error): not where an interrupt stops
                ACTIVITY.run_ended(self.key)
            stack.close()
            raise

    def results_of(self, history: TrainingHistory, state: Any = None) -> dict:
        """results.json: the header, the history and what the run's monitors report of
        `state`: the server's weights in use now (`registry.ServerWeightsMonitor`; round 1's
        stay as alpha_round_1), the method's report (FedPALS' lambda and d(T, S)) and the
        features' (written at every evaluation too: a run killed after one resumes with their
        records, `Monitor.resume`)."""
        best = history.best_val_index()
        results = {
            **self.header,
            **history.to_dict(),
            "final_target_accuracy": history.target_accuracy[-1],
            "final_target_macro_f1": history.target_macro_f1[-1],
            "best_val_round": history.rounds[best],
            "target_accuracy_at_best_val": history.target_accuracy[best],
            "target_macro_f1_at_best_val": history.target_macro_f1[best],
            "macro_f1_classes": MACRO_F1_CLASSES,  # what every macro-F1 above averages over
            # The runs its program trained together (this launch): wall_seconds is the
            # program's, so a run's share of it is wall_seconds / program_runs.
            "program_runs": getattr(self, "program_runs", 1),
            # The other runs of its program (a sweep's run names; [] alone): a run's numbers
            # do not depend on them (docs/measurements/batch_mates.md), but a reader can check.
            "program_mates": getattr(self, "program_mates", []),
        }
        if state is not None:
            for monitor in self.monitors:
                results.update(monitor.results(state))
        if self.clients is not None:
            results.update(self.clients.results())
        return results

    def _on_round(self, done: int, loss: float | None) -> None:
        with uninterrupted():  # a round's metrics are written whole
            # No train/loss for a round that drew no client (loss None): nothing trained.
            losses = {} if loss is None else {"train/loss": loss}
            self.writer.write_scalars(done, {**losses, **self._weight_scalars(done)})
        ACTIVITY.run_round(self.key, done)
        self.progress.update(1, loss=loss)

    def _weight_scalars(self, done: int) -> dict:
        """The server's weights alpha of round `done` over all clients (0 for those not taking
        part): a histogram (written when they change), per-client scalars for up to
        `PER_CLIENT_SCALARS` clients, and their effective sample size."""
        weights = getattr(self.run, "last_weights", None)
        if weights is None or not self.main:
            return {}
        sizes = np.asarray(self.task.partition.client_sizes, np.float64)
        alpha = np.zeros(len(sizes))
        ids = self.run.participants(done - 1)
        drawn = ids < len(sizes)  # Poisson sampling's lanes no client drew carry the id M
        alpha[ids[drawn]] = np.asarray(weights, np.float64)[drawn]
        self.writer.write_histogram(done, "server/alpha", alpha)
        spread = np.sum(alpha * alpha / sizes)  # 0: a Poisson round that drew no client
        scalars = {"server/ess": float(1.0 / spread) if spread > 0 else 0.0}
        if len(alpha) <= PER_CLIENT_SCALARS:
            scalars.update(_indexed("server/alpha/client", alpha))
        return scalars

    def _server_scalars(self) -> dict:
        """At an evaluation: what the run's method and features report (FedPALS' lambda and
        d(T, S), adaptive lambda's current lambda, T's estimate and its error, ...)."""
        scalars = {}
        for monitor in self.monitors:
            scalars.update(monitor.scalars(self.run.state))
        return scalars

    def _on_evaluation(self, done: int, metrics: dict, history: TrainingHistory) -> None:
        with uninterrupted():  # the evaluation's metrics and results.json are written whole
            self._write_evaluation(done, metrics, history)
        # Shown once the round's checkpoint is saved (`_show_evaluation`): a Ctrl-C after the
        # line resumes from the round it names.
        self._evaluated = {
            "target acc": percent(metrics["test"]["accuracy"]),
            "val acc": percent(metrics["val"]["accuracy"]),
        }
        for monitor in self.monitors:
            self._evaluated.update(monitor.progress(self.run.state))
        self._accuracies = (metrics["test"]["accuracy"], metrics["val"]["accuracy"])
        # A run's first evaluation far below chance says why, under its line.
        self._note = below_chance_note(done, metrics["test"]) if len(history.rounds) == 1 else None

    def _show_evaluation(self) -> None:
        evaluated, self._evaluated = getattr(self, "_evaluated", None), None
        if evaluated is not None:
            self.progress.update(0, **evaluated)
            if getattr(self, "_note", None):
                self.progress.write(self._note)
            if getattr(self, "on_shown", None) is not None:  # its group's line (`_train_group`)
                self.on_shown(self, self._accuracies)

    def _write_evaluation(self, done: int, metrics: dict, history: TrainingHistory) -> None:
        test, val = metrics["test"], metrics["val"]
        scalars = {
            "target/accuracy": test["accuracy"],
            "target/macro_f1": test["macro_f1"],
            "target/loss": test["loss"],
            "val/accuracy": val["accuracy"],
            "val/macro_f1": val["macro_f1"],
            "val/loss": val["loss"],
            # The headline, as results.json has it at this evaluation.
            "target/accuracy_at_best_val": history.target_accuracy[history.best_val_index()],
        }
        if self.main:
            scalars.update(self._server_scalars())
        if self.clients is not None and "clients" in metrics:
            scalars.update(self.clients.update(done, metrics["clients"]))
            self.writer.write_histogram(done, "clients/accuracy", self.clients.latest)
        self.writer.write_scalars(done, scalars)
        self.writer.flush()
        if self.main:
            write_json(self.workdir.file(RESULTS_FILE), self.results_of(history, self.run.state))

    def _personalize(self, state) -> None:
        """evaluation.personalization's modes from the final state, once: a run resumed after
        them keeps what results.json recorded (`PerClientRecord.resume`)."""
        wanted = self.config.evaluation.personalization
        if self.clients is None or not wanted:
            return
        done = int(state.round)  # a run extended by more rounds personalises its new model
        missing = [mode for mode in wanted
                   if self.clients.personalization.get(mode, {}).get("round") != done]
        if not missing:
            return
        evaluation = {**self.config.evaluation.to_dict(), "personalization": tuple(missing)}
        with uninterrupted():
            self.progress.write(f"  personalisation: {', '.join(missing)} for "
                                f"{len(self.clients.sizes)} clients")
            records = personalize(self.run, state, evaluation, self.config.training.batch_size,
                                  reference=self.clients.at_best_val)
            for record in records.values():
                record["round"] = done  # the round of the model it personalised
            self.clients.personalization.update(records)

    def finish(self, outcome) -> dict | BaseException:
        """Final results (results.json, curves.png) or the run's exception; closes its resources."""
        try:
            if isinstance(outcome, BaseException):
                if isinstance(outcome, Exception):  # ended; an interrupted run is still "in" it
                    ACTIVITY.run_ended(self.key)
                return outcome
            state, history = outcome
            self._personalize(state)
            results = self.results_of(history, state)
            if self.main:
                write_json(self.workdir.file(RESULTS_FILE), results)
                plot_curves(
                    self.workdir.file("curves.png"), {self.method: results}, self.figure_title
                )
                figures = ["curves.png"]
                if self.clients is not None:
                    plot_client_accuracy_cdf(
                        self.workdir.file(CLIENTS_FIGURE), self.clients.accuracies(),
                        f"{self.figure_title}: per-client test accuracy",
                        note=f"{len(self.clients.sizes)} clients, seed {self.config.seed}")
                    figures.append(CLIENTS_FIGURE)
                # The run's files into its MLflow run (nothing without MLflow).
                files = [self.workdir.file(n) for n in (RESULTS_FILE, *figures, HPARAMS_FILE)]
                try:
                    self.writer.write_artifacts(files)
                except mlflow_writer.MlflowError as error:
                    # The run is trained and its files written: a store that takes metrics but
                    # not files (a server without artifact serving) costs only the copies.
                    logging.warning("%s: MLflow artifacts not logged: %s", self.workdir.path, error)
            ACTIVITY.run_ended(self.key)
            return results
        finally:
            self.stack.close()


def train_and_evaluate(
    config: Any,
    workdir: str | os.PathLike,
    *,
    overwrite: bool = False,
    quiet: bool = False,
    mlflow_tracking_uri: str | None = None,
    mlflow_experiment: str | None = None,
) -> dict:
    """Trains and evaluates the run described by `config` in `workdir`; returns its results.

    Args:
      config: an `ml_collections.ConfigDict` of the `default_config()` schema (or a partial
        mapping laid over it); validated and resolved before anything else happens.
      workdir: the run's directory: checkpoints/, results.json, metrics.jsonl, metrics.csv,
        TensorBoard event files, hparams.json, curves.png. A run it already holds is resumed if
        it has the same config, or extended if only a larger training.rounds differs.
      overwrite: replace a run of another config held in `workdir` (its files are deleted only
        after the new config is validated and its data loaded).
      quiet: no progress bar and no log lines.
      mlflow_tracking_uri: also log params and scalars to this MLflow tracking store
        (`pip install "fedjax_pals[mlflow]"`; one MLflow run per workdir, named by the
        workdir's name; results.json, curves.png and hparams.json its artifacts). None:
        `$MLFLOW_TRACKING_URI` where set (MLflow's variable), else no MLflow.
      mlflow_experiment: the MLflow experiment of that run (None: `$MLFLOW_EXPERIMENT_NAME`
        where set, else `fedjax_pals`). A value given wins over MLflow's variable.

    Returns:
      The results (also in results.json): config (resolved), config_digest, dataset_source,
      partition, lam, alpha, ess, total_examples, projection_distance (d(T, S) of the S the
      server's weights are solved with: label DP's release where there is one),
      projection_distance_s (where that S is: "server_label_dists" or
      "partition.client_label_dists"), clients_per_round,
      backend, engine (the backend and devices each round ran on), rounds, target_accuracy,
      target_macro_f1, val_accuracy, val_macro_f1, train_loss, wall_seconds,
      final_target_accuracy, final_target_macro_f1, best_val_round,
      target_accuracy_at_best_val, target_macro_f1_at_best_val, macro_f1_classes ("present in
      the labels": each macro-F1 is the mean F1 over the classes of the evaluated set's labels,
      `metrics.macro_f1_from_confusion`), program_runs (the runs its program
      trained together; its wall_seconds are the program's) and program_mates (the other
      runs' names); with evaluation.per_client, the
      per-client entries (docs/guide/per_client.md).

    Raises:
      ConfigError: a bad config (before any data loading).
      WorkdirError: a workdir that cannot be written, is locked by another launch, or holds
        another config's run; CheckpointError: an unreadable checkpoint (path and remedy).
      DatasetUnavailableError, TaskError: data that cannot be had, or cannot make this run.
      TrainingDivergedError: the training loss became non-finite or exploded.
    """
    ACTIVITY.reset()
    with diskspace.run_writes(workdir):  # a full disk: one error naming the path and space
        prepared = _PreparedRun(
            config,
            workdir,
            overwrite=overwrite,
            quiet=quiet,
            mlflow_tracking_uri=mlflow_tracking_uri,
            mlflow_experiment=mlflow_experiment,
        )
        try:
            (outcome,) = _train_group([prepared])
        except BaseException:
            prepared.stack.close()  # as a killed process would: the lock goes, nothing is written
            raise
        outcome = prepared.finish(outcome)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


# The samplers the header already describes (Poisson's line; every client or m of M: the
# participants a round).
BUILT_IN_SAMPLERS = (EveryClient, WithoutReplacement, PoissonSampling)


def _train_group(prepared: Sequence[_PreparedRun], *, progress: bool = False) -> list:
    """run_trainings of the prepared runs (on the first one's engine settings); with `progress`,
    one bar over the group's rounds."""
    runs = [p.run for p in prepared]
    names = [ACTIVITY.names.get(p.key, os.path.basename(str(p.workdir.path))) for p in prepared]
    for index, p in enumerate(prepared):  # recorded: its wall time is its program's
        p.program_runs = len(prepared)
        p.program_mates = names[:index] + names[index + 1:]
    ACTIVITY.run_training(p.key for p in prepared)
    engine = prepared[0].config.engine
    options = dict(backend=engine.backend, chunk_size=engine.chunk_size)
    if not progress:
        return run_trainings(runs, **options)
    first = runs[0]
    names = ", ".join(  # a sweep's run names (fedpals/seed_0), else the workdirs' own
        ACTIVITY.names.get(p.key, os.path.basename(str(p.workdir.path))) for p in prepared[:3]
    )
    more = f" +{len(runs) - 3}" if len(runs) > 3 else ""
    with Progress(
        first.rounds,
        desc=f"{len(runs)} run{'s' * (len(runs) != 1)} [{names}{more}]",
        initial=first.start_round,
        quiet=not is_main_process(),
        first_step_compiles=True,
    ) as bar:
        on_round = first.on_round

        def on_round_and_bar(done: int, loss: float) -> None:
            if on_round is not None:
                on_round(done, loss)
            bar.update(1, loss=loss)

        first.on_round = on_round_and_bar
        # An evaluation is shown (a line of its own without a terminal) once every run of the
        # group has saved its checkpoint of the round: their accuracies, `group_accuracies`.
        shown: dict[int, dict] = {}

        def on_shown(run: _PreparedRun, accuracies: tuple[float, float]) -> None:
            of_round = shown.setdefault(bar.n, {})
            of_round[id(run)] = accuracies
            if len(of_round) == len(prepared):
                del shown[bar.n]
                bar.update(0, **group_accuracies(list(of_round.values())))

        for p in prepared:
            p.on_shown = on_shown
        return run_trainings(runs, **options)


def group_accuracies(accuracies: Sequence[tuple[float, float]]) -> dict[str, str]:
    """The progress of runs trained together at one evaluation, from each run's (target test,
    validation) accuracy: {"target acc": ..., "val acc": ...}, in percent as on screen; one run's
    as it is ("84.6%"), several runs' mean and range ("mean 84.6% (80.1-86.0%)")."""
    shown = {}
    for name, values in zip(("target acc", "val acc"), np.asarray(accuracies, np.float64).T):
        if len(values) == 1:
            shown[name] = percent(values[0])
        else:
            low, high = percent(values.min()), percent(values.max())
            shown[name] = f"mean {percent(values.mean())} ({low[:-1]}-{high})"
    return shown


# A runs axis of this many runs at most per program: each holds a workdir lock, a metric
# writer and its device state while it trains. A config sets its own (`engine.runs_per_program`).
MAX_RUNS_PER_PROGRAM = RUNS_PER_PROGRAM


def program_blocks(members: Sequence[int], max_runs: int = MAX_RUNS_PER_PROGRAM) -> list[list[int]]:
    """One structure group's runs (`members`, in order) cut into the fewest blocks of at most
    `max_runs`, of sizes that differ by at most one: 60 runs are 4 x 15, not 16, 16, 16 and
    12. A block is one compiled program whose runs axis is its size, so equal blocks share
    it (the DP sweep's 60-run groups: one program instead of two)."""
    if not members:
        return []
    count = -(-len(members) // max_runs)
    size, larger = divmod(len(members), count)  # `larger` blocks of size + 1 come first
    starts = [block * size + min(block, larger) for block in range(count + 1)]
    return [list(members[start:end]) for start, end in zip(starts, starts[1:])]


def train_and_evaluate_many(
    configs: Sequence[Any],
    workdirs: Sequence[str | os.PathLike],
    *,
    overwrite: bool = False,
    quiet: bool = True,
    round_progress: bool = False,
    max_runs_per_program: int | None = None,
    on_done: Callable[[int, dict | BaseException], None] | None = None,
    mlflow_tracking_uri: str | None = None,
    mlflow_experiment: str | None = None,
    run_names: Sequence[str] | None = None,
) -> list[dict | BaseException]:
    """`train_and_evaluate` of every (config, workdir), runs that share structure trained at once.

    Runs whose configs differ only in what the engine keeps in the state
    (`config.per_run_state_keys()`: seed, lambda or ESS fraction, target perturbation, the label-DP
    release) and whose tasks share the data set are trained together on the engine's runs axis,
    at most their configs' `engine.runs_per_program` (default 16) at a time, and at most
    `max_runs_per_program` when given, in one compiled program; each run's numbers, files and
    checkpoints are those it gets alone. A failed run does not stop the others: its exception is
    returned in its place. `on_done(index, outcome)` is called as each run ends. `quiet` silences
    each run's own output; `round_progress` shows one bar over the rounds of each group trained
    together; `mlflow_tracking_uri` and `mlflow_experiment` as in `train_and_evaluate`; `run_names`
    name the MLflow runs (a sweep's run keys, e.g. fedpals/seed_0; default: the workdirs' names).
    """
    if len(configs) != len(workdirs):
        raise ValueError(f"{len(configs)} configs but {len(workdirs)} workdirs.")
    if run_names is not None and len(run_names) != len(configs):
        raise ValueError(f"{len(configs)} configs but {len(run_names)} run names.")
    k = max_runs_per_program
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"max_runs_per_program must be None or an integer >= 1, got {k!r}.")
    outcomes: list = [None] * len(configs)

    def done(index: int, outcome) -> None:
        if isinstance(outcome, BaseException):
            outcome = diskspace.run_disk_full(outcome, workdirs[index])
        outcomes[index] = outcome
        if on_done is not None:
            on_done(index, outcome)

    groups: dict = {}
    resolved: dict[int, ResolvedConfig] = {}
    for index, config in enumerate(configs):
        try:
            resolved[index] = resolve_config(config)
        except Exception as error:  # noqa: BLE001 - reported in its place
            done(index, error)
            continue
        groups.setdefault(structure_group_key(resolved[index].config), []).append(index)
    for indices in groups.values():
        # One group shares its engine section (`structure_group_key`), so its runs agree.
        per_program = resolved[indices[0]].config.engine.runs_per_program
        if max_runs_per_program is not None:
            per_program = min(per_program, max_runs_per_program)
        for chunk in program_blocks(indices, per_program):
            prepared = {}
            try:
                for index in chunk:
                    try:
                        prepared[index] = _PreparedRun(
                            resolved[index],
                            workdirs[index],
                            overwrite=overwrite,
                            quiet=quiet,
                            mlflow_tracking_uri=mlflow_tracking_uri,
                            mlflow_experiment=mlflow_experiment,
                            run_name=run_names[index] if run_names is not None else None,
                        )
                    except Exception as error:  # noqa: BLE001
                        done(index, error)
                lockstep: dict = {}  # by `training_group_key` (`structure_group_key` pre-grouped)
                for index, run in prepared.items():
                    engine = run.config.engine
                    key = training_group_key(
                        run.run, backend=engine.backend, chunk_size=engine.chunk_size
                    )
                    lockstep.setdefault(key, []).append(index)
                for members in lockstep.values():
                    try:
                        results = _train_group(
                            [prepared[i] for i in members], progress=round_progress
                        )
                    except BaseException as error:
                        for i in members:
                            prepared[i].finish(error)
                        if not isinstance(error, Exception):
                            raise
                        for i in members:
                            done(i, error)
                        continue
                    # The whole group has ended: finished first, then reported, so that a
                    # report knows which of its group-mates are still to come
                    # (`ACTIVITY.ended_unreported`: no sweep ETA over runs already done).
                    finished = [(i, prepared[i].finish(outcome))
                                for i, outcome in zip(members, results)]
                    for position, (i, outcome) in enumerate(finished):
                        ACTIVITY.ended_unreported = len(finished) - position - 1
                        done(i, outcome)
                    ACTIVITY.ended_unreported = 0
            except BaseException:
                # Interrupted (or a bug): every run of the chunk lets go of its lock and writer,
                # as a killed process would; what they wrote stays and they resume from it.
                for run in prepared.values():
                    run.stack.close()
                raise
    return outcomes


def structure_group_key(resolved: ml_collections.ConfigDict) -> str:
    """The config without its per-run state (`config.per_run_state_keys()`; of the
    `per_run_state_presence_keys()` only whether they are set is kept): equal for runs that can
    share one compiled program (a cheap grouping by config alone; `training_group_key` decides).
    The shard assignment (`shards.assign_shards`) keeps such runs together."""
    plain = as_dict(resolved)
    for key in per_run_state_keys():
        *path, name = key.split(".")
        section = plain
        for part in path:
            section = section.get(part) or {}
        if name in section:
            value = section.pop(name)
            if key in per_run_state_presence_keys():
                section[name] = value is not None
    return json.dumps(plain, sort_keys=True, default=str)
