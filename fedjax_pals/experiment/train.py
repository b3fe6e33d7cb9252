"""`train_and_evaluate(config, workdir)`: one run from its config, resumable, in its workdir.

The order of work is chosen so that every mistake costs as little as possible:

1. the config is validated and resolved (milliseconds, no data: `validate_config`);
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

from fedjax_pals.algorithms import TargetReestimation, lam_report
from fedjax_pals.engine import resolve_backend
from fedjax_pals.experiment import diskspace, mlflow_writer
from fedjax_pals.experiment.config import ConfigError, as_dict, config_digest, validate_config
from fedjax_pals.experiment.engine_record import engine_segments
from fedjax_pals.experiment.plots import plot_curves
from fedjax_pals.experiment.progress import Progress
from fedjax_pals.experiment.task import build_task, task_summary
from fedjax_pals.experiment.workdir import OWN_FILES, RESULTS_FILE, Workdir, write_json
from fedjax_pals.experiment.writers import MetricWriter
from fedjax_pals.runtime import is_main_process
from fedjax_pals.training import (
    TrainingHistory,
    TrainingRun,
    run_trainings,
    training_group_key,
)


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


def _has_sweep(config: Any) -> bool:
    if isinstance(config, ml_collections.ConfigDict):
        return "sweep" in config and bool(config.sweep)
    return isinstance(config, dict) and bool(config.get("sweep"))


# TensorBoard charts (Custom Scalars) whose curves share one plot.
CHARTS = {
    "accuracy (target, validation)": ["target/accuracy", "val/accuracy"],
    "macro-F1 (target, validation)": ["target/macro_f1", "val/macro_f1"],
    "loss (train, target, validation)": ["train/loss", "target/loss", "val/loss"],
}
# Per-client (per-class) scalars of alpha (of T's estimate) for at most this many clients.
PER_CLIENT_SCALARS = 20


def _indexed(prefix: str, values) -> dict:
    """{f"{prefix}_{i}": v}, i zero-padded so that the scalars sort in index order."""
    width = len(str(len(values) - 1))
    return {f"{prefix}_{i:0{width}d}": v for i, v in enumerate(values)}


class _PreparedRun:
    """One run between preparation and its results: its workdir, writer, progress and loop.

    Preparation does steps 1-3 of the module docstring and opens the run's
    resources (lock, metric writer, progress bar, checkpointer) in `self.stack`;
    `finish` writes the final results and closes them.
    """

    def __init__(
        self, config: Any, workdir, *, overwrite: bool, quiet: bool, mlflow_tracking_uri=None
    ):
        if _has_sweep(config):
            raise ConfigError(
                "config.sweep is set: this config describes a sweep of runs; run it with "
                "fjp.run_sweep (python -m experiments.sweep), or delete config.sweep for one run."
            )
        if not isinstance(overwrite, bool):
            raise TypeError(f"overwrite must be True or False, got {overwrite!r}.")
        resolved = validate_config(config)
        digest = config_digest(resolved)
        self.config, self.plain = resolved, as_dict(resolved)
        self.main = main = is_main_process()
        quiet = quiet or not main
        if main and mlflow_tracking_uri is not None:
            # Before the workdir is made and the data read: a missing MLflow or an unreachable
            # store is one line in seconds, not after the loading (or minutes of retries).
            mlflow_writer.check_store(mlflow_tracking_uri)
        self.stack = stack = contextlib.ExitStack()
        try:
            self.workdir = wd = stack.enter_context(Workdir(workdir, resolved, digest, lock=main))
            if not overwrite:
                # Every process reads (and so raises) alike: their orbax barriers line up.
                wd.check_reusable()
                if wd.fallback_note and main:
                    logging.warning("%s", wd.fallback_note)
            self.task = task = build_task(resolved)
            if main and overwrite:
                removed = wd.clear()
                if removed and not quiet:
                    logging.info("overwrite: removed %s from %s", ", ".join(removed), wd.path)
            # Recorded before any is created: the record is what a later --overwrite deletes.
            wd.record(*OWN_FILES)
            _sync("fedjax_pals.train_and_evaluate.workdir_ready")
            checkpointer = wd.checkpointer()
            stack.callback(checkpointer.close)
            start_round = checkpointer.check_identity() or 0
            summary = task_summary(task)
            self.backend = resolve_backend(resolved.engine.backend, task.model)
            rounds = resolved.training.rounds
            self.title = f"{resolved.algorithm.name} on {task.partition.description}"
            segments, engine_warning = engine_segments(
                _read_results(wd.file(RESULTS_FILE)) if start_round else None,
                start_round,
                self.backend,
            )
            if engine_warning and main:
                logging.warning("%s: %s", wd.path, engine_warning)
            self.header = {
                "config": self.plain,
                "config_digest": digest,
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
                    record=wd.record,
                )
            )
            self.progress = progress = stack.enter_context(
                Progress(
                    rounds,
                    desc=f"{resolved.algorithm.name} seed {resolved.seed}",
                    initial=start_round,
                    quiet=quiet,
                    first_step_compiles=True,
                )
            )
            writer.write_hparams(self.plain)
            writer.write_layout(CHARTS)
            lam = "-" if summary["lam"] is None else f"{summary['lam']:.4g}"
            progress.write(
                f"{self.title}: lam={lam} ESS={summary['ess']:.0f}/{summary['total_examples']} "
                f"d(T,S)={summary['projection_distance']:.4g}, {rounds} rounds, backend "
                f"{self.backend}" + (f", resuming after round {start_round}" if start_round else "")
            )
            self.reestimation = None
            if resolved.algorithm.target_estimation is not None:
                self.reestimation = TargetReestimation(
                    task.algorithm,
                    task.model,
                    task.dataset,
                    task.partition,
                    every=resolved.algorithm.target_estimation_every,
                    method=resolved.algorithm.target_estimation,
                    seed=resolved.seed,
                )
            self.run = TrainingRun(
                task.algorithm,
                task.model,
                task.dataset,
                task.partition,
                task.training,
                rounds=rounds,
                seed=resolved.seed,
                eval_every=resolved.training.eval_every,
                clients_per_round=task.clients_per_round,
                checkpointer=checkpointer,
                on_evaluation=self._on_evaluation,
                on_round=self._on_round,
                update_state=self.reestimation,
            )
        except BaseException:
            stack.close()
            raise

    def results_of(self, history: TrainingHistory) -> dict:
        best = history.best_val_index()
        return {
            **self.header,
            **history.to_dict(),
            "final_target_accuracy": history.target_accuracy[-1],
            "final_target_macro_f1": history.target_macro_f1[-1],
            "best_val_round": history.rounds[best],
            "target_accuracy_at_best_val": history.target_accuracy[best],
            "target_macro_f1_at_best_val": history.target_macro_f1[best],
        }

    def _on_round(self, done: int, loss: float) -> None:
        self.writer.write_scalars(done, {"train/loss": loss, **self._weight_scalars(done)})
        self.progress.update(1, loss=loss)

    def _weight_scalars(self, done: int) -> dict:
        """The server's weights alpha of round `done` over all clients (0 for those not taking
        part): a histogram, per-client scalars for up to `PER_CLIENT_SCALARS` clients, and
        their effective sample size."""
        weights = getattr(self.run, "last_weights", None)
        if weights is None or not self.main:
            return {}
        sizes = np.asarray(self.task.partition.client_sizes, np.float64)
        alpha = np.zeros(len(sizes))
        alpha[self.run.participants(done - 1)] = np.asarray(weights, np.float64)
        self.writer.write_histogram(done, "server/alpha", alpha)
        scalars = {"server/ess": float(1.0 / np.sum(alpha * alpha / sizes))}
        if len(alpha) <= PER_CLIENT_SCALARS:
            scalars.update(_indexed("server/alpha/client", alpha))
        return scalars

    def _server_scalars(self) -> dict:
        """At an evaluation: the lambda in use, d(T, S), and T's estimate and its error."""
        state = self.run.state
        scalars = {}
        data = state.algorithm_state
        if isinstance(data, dict) and "lam_history" in data:  # the hypergradient schedule
            lam = np.asarray(jax.device_get(data["lam_history"]), np.float64)
            done = lam[np.isfinite(lam)]
            if done.size:
                scalars["server/lambda"] = float(done[-1])
        elif self.task.lam is not None:
            scalars["server/lambda"] = float(self.task.lam)
        distance = self.header["projection_distance"]
        if self.reestimation is not None:
            from fedjax_pals.server_weights import projection_distance

            estimate, error = self._target_estimate(jax.device_get(state))
            distance = float(projection_distance(self.task.partition.client_label_dists, estimate))
            scalars["server/target_estimate_l1_error"] = error
            if estimate.size <= PER_CLIENT_SCALARS:
                scalars.update(_indexed("server/target_estimate/class", estimate))
        if distance is not None:
            scalars["server/projection_distance"] = float(distance)
        return scalars

    def _target_estimate(self, state) -> tuple[np.ndarray, float]:
        """The server's estimate of T (T unknown) and its L1 distance to the true T."""
        estimate = np.asarray(self.reestimation.current(state), np.float64)
        truth = np.asarray(self.task.partition.target_label_dist, np.float64)
        return estimate, float(np.abs(estimate - truth).sum())

    def _on_evaluation(self, done: int, metrics: dict, history: TrainingHistory) -> None:
        self.writer.write_scalars(
            done,
            {
                "target/accuracy": metrics["test"]["accuracy"],
                "target/macro_f1": metrics["test"]["macro_f1"],
                "target/loss": metrics["test"]["loss"],
                "val/accuracy": metrics["val"]["accuracy"],
                "val/macro_f1": metrics["val"]["macro_f1"],
                "val/loss": metrics["val"]["loss"],
                **(self._server_scalars() if self.main else {}),
            },
        )
        self.writer.flush()
        if self.main:
            write_json(self.workdir.file(RESULTS_FILE), self.results_of(history))
        self.progress.update(0, acc=metrics["test"]["accuracy"], val=metrics["val"]["accuracy"])

    def finish(self, outcome) -> dict | BaseException:
        """Final results (results.json, curves.png) or the run's exception; closes its resources."""
        try:
            if isinstance(outcome, BaseException):
                return outcome
            state, history = outcome
            results = self.results_of(history)
            if isinstance(state.algorithm_state, dict) and "lam_history" in state.algorithm_state:
                results.update(lam_report(jax.device_get(state)))  # adaptive lambda
            if self.reestimation is not None:  # T unknown: the server's last estimate of it
                estimate, error = self._target_estimate(state)
                results["target_estimate"] = estimate.tolist()
                results["target_estimate_l1_error"] = error
                # Rounds where the model did not identify T (kept), in this process.
                results["target_estimation_skipped_rounds"] = [
                    r for r, _ in self.reestimation.skipped
                ]
            if self.main:
                write_json(self.workdir.file(RESULTS_FILE), results)
                plot_curves(
                    self.workdir.file("curves.png"),
                    {self.config.algorithm.name: results},
                    self.title,
                )
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
        (`pip install "fedjax_pals[mlflow]"`; one MLflow run per workdir). None: no MLflow.

    Returns:
      The results (also in results.json): config (resolved), config_digest, dataset_source,
      partition, lam, alpha, ess, total_examples, projection_distance, clients_per_round,
      backend, engine (the backend and devices each round ran on), rounds, target_accuracy,
      target_macro_f1, val_accuracy, val_macro_f1, train_loss, wall_seconds,
      final_target_accuracy, final_target_macro_f1, best_val_round,
      target_accuracy_at_best_val, target_macro_f1_at_best_val.

    Raises:
      ConfigError: a bad config (before any data loading).
      WorkdirError: a workdir that cannot be written, is locked by another launch, or holds
        another config's run; CheckpointError: an unreadable checkpoint (path and remedy).
      DatasetUnavailableError, TaskError: data that cannot be had, or cannot make this run.
      TrainingDivergedError: the training loss became non-finite or exploded.
    """
    with diskspace.run_writes(workdir):  # a full disk: one error naming the path and space
        prepared = _PreparedRun(
            config,
            workdir,
            overwrite=overwrite,
            quiet=quiet,
            mlflow_tracking_uri=mlflow_tracking_uri,
        )
        engine = prepared.config.engine
        try:
            (outcome,) = _train_group([prepared], engine.backend, engine.chunk_size)
        except BaseException:
            prepared.stack.close()  # as a killed process would: the lock goes, nothing is written
            raise
        outcome = prepared.finish(outcome)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _train_group(
    prepared: Sequence[_PreparedRun], backend: str, chunk_size: int, *, progress: bool = False
) -> list:
    """run_trainings of the prepared runs; with `progress`, one bar over the group's rounds."""
    runs = [p.run for p in prepared]
    if not progress:
        return run_trainings(runs, backend=backend, chunk_size=chunk_size)
    first = runs[0]
    names = ", ".join(os.path.basename(str(p.workdir.path)) for p in prepared[:3])
    more = f" +{len(runs) - 3}" if len(runs) > 3 else ""
    with Progress(
        first.rounds,
        desc=f"{len(runs)} run(s) [{names}{more}]",
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
        return run_trainings(runs, backend=backend, chunk_size=chunk_size)


# A runs axis of this many runs at most per program: each holds a workdir lock, a metric
# writer and its device state while it trains.
MAX_RUNS_PER_PROGRAM = 16


def train_and_evaluate_many(
    configs: Sequence[Any],
    workdirs: Sequence[str | os.PathLike],
    *,
    overwrite: bool = False,
    quiet: bool = True,
    round_progress: bool = False,
    max_runs_per_program: int = MAX_RUNS_PER_PROGRAM,
    on_done: Callable[[int, dict | BaseException], None] | None = None,
    mlflow_tracking_uri: str | None = None,
) -> list[dict | BaseException]:
    """`train_and_evaluate` of every (config, workdir), runs that share structure trained at once.

    Runs whose configs differ only in what the engine keeps in the state (seed,
    lambda or ESS fraction, target perturbation) and whose tasks share the data
    set are trained together on the engine's runs axis, `max_runs_per_program`
    at a time, in one compiled program; each run's numbers, files and
    checkpoints are those it gets alone. A failed run does not stop the others:
    its exception is returned in its place. `on_done(index, outcome)` is called
    as each run ends. `quiet` silences each run's own output; `round_progress`
    shows one bar over the rounds of each group trained together; `mlflow_tracking_uri` as
    in `train_and_evaluate`.
    """
    if len(configs) != len(workdirs):
        raise ValueError(f"{len(configs)} configs but {len(workdirs)} workdirs.")
    if (
        isinstance(max_runs_per_program, bool)
        or not isinstance(max_runs_per_program, int)
        or max_runs_per_program < 1
    ):
        raise ValueError(
            f"max_runs_per_program must be an integer >= 1, got {max_runs_per_program!r}."
        )
    outcomes: list = [None] * len(configs)

    def done(index: int, outcome) -> None:
        if isinstance(outcome, BaseException):
            outcome = diskspace.run_disk_full(outcome, workdirs[index])
        outcomes[index] = outcome
        if on_done is not None:
            on_done(index, outcome)

    groups: dict = {}
    for index, config in enumerate(configs):
        try:
            key = structure_group_key(validate_config(config))
        except Exception as error:  # noqa: BLE001 - reported in its place
            done(index, error)
            continue
        groups.setdefault(key, []).append(index)
    for indices in groups.values():
        for start in range(0, len(indices), max_runs_per_program):
            chunk = indices[start : start + max_runs_per_program]
            prepared = {}
            for index in chunk:
                try:
                    prepared[index] = _PreparedRun(
                        configs[index],
                        workdirs[index],
                        overwrite=overwrite,
                        quiet=quiet,
                        mlflow_tracking_uri=mlflow_tracking_uri,
                    )
                except Exception as error:  # noqa: BLE001
                    done(index, error)
            # `_structure_of` is a cheap pre-grouping by config; `training_group_key` decides.
            lockstep: dict = {}
            for index, run in prepared.items():
                engine = run.config.engine
                key = training_group_key(
                    run.run, backend=engine.backend, chunk_size=engine.chunk_size
                )
                lockstep.setdefault(key, []).append(index)
            for members in lockstep.values():
                engine = prepared[members[0]].config.engine
                try:
                    results = _train_group(
                        [prepared[i] for i in members],
                        engine.backend,
                        engine.chunk_size,
                        progress=round_progress,
                    )
                except BaseException as error:
                    for i in members:
                        prepared[i].finish(error)
                    if not isinstance(error, Exception):
                        raise
                    for i in members:
                        done(i, error)
                    continue
                for i, outcome in zip(members, results):
                    done(i, prepared[i].finish(outcome))
    return outcomes


def structure_group_key(resolved: ml_collections.ConfigDict) -> str:
    """The config with what the engine holds in the state removed: equal for runs that can share
    one compiled program (a cheap grouping by config alone; `training_group_key` decides). The
    shard assignment (`shards.assign_shards`) keeps such runs together."""
    plain = as_dict(resolved)
    plain.pop("seed", None)
    for key in ("lam", "ess_fraction", "target_perturbation"):
        plain.get("algorithm", {}).pop(key, None)
    return json.dumps(plain, sort_keys=True, default=str)
