"""An optional MLflow copy of a run's metrics (`pip install "fedjax_pals[mlflow]"`, never required).

`MetricWriter(..., mlflow_tracking_uri=uri)` sends what it writes to MLflow as well: the
flattened config as the run's params (unset ones left out), the scalars as metrics at their
round (names as in TensorBoard: `target/accuracy`, `server/ess`, ...; NaN and inf included).
Histograms (alpha) stay in TensorBoard: MLflow has no histogram type.

One MLflow run per workdir, in the experiment `fedjax_pals` unless named otherwise: a run is
found again by its tag `fedjax_pals.workdir` (the absolute path), so a resumed or extended
run logs into the run it started (MLflow params cannot change: an extended run's new
`training.rounds` is the tag `fedjax_pals.now.training.rounds`). MLflow keeps every value
logged, so the rounds a resumed run re-does after its last checkpoint appear twice at their
step (TensorBoard and metrics.jsonl drop the first copy; MLflow cannot).

The URI is MLflow's: `file:///abs/mlruns` (MLflow 3 refuses its file store unless
MLFLOW_ALLOW_FILE_STORE=true is set), `sqlite:///mlflow.db` (the full `mlflow` package),
`http://host:5000` (a tracking server).
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

WORKDIR_TAG = "fedjax_pals.workdir"
DEFAULT_EXPERIMENT = "fedjax_pals"


class MlflowError(RuntimeError):
    """MLflow is not installed, or its tracking store refuses the run."""


class MlflowWriter:
    """Logs params and scalars of the run in `workdir` to the MLflow tracking store at `uri`."""

    def __init__(self, uri: str, workdir: str, *, experiment: str = DEFAULT_EXPERIMENT):
        if not isinstance(uri, str) or not uri:
            raise MlflowError(f"mlflow_tracking_uri must be a non-empty string, got {uri!r}.")
        try:
            import mlflow
        except ImportError as error:
            raise MlflowError(
                f"mlflow_tracking_uri={uri!r} needs MLflow, which is not installed: "
                'pip install "fedjax_pals[mlflow]" (mlflow-skinny), or leave the URI unset.'
            ) from error
        self._entities = mlflow.entities
        path = os.path.abspath(os.fspath(workdir))
        try:
            self.client = mlflow.MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id if found else self.client.create_experiment(experiment)
            )
            runs = self.client.search_runs(
                [experiment_id],
                filter_string=f"tags.`{WORKDIR_TAG}` = '{path}'",
                max_results=1,
            )
            self.run_id = (
                runs[0].info.run_id
                if runs
                else self.client.create_run(
                    experiment_id, run_name=path, tags={WORKDIR_TAG: path}
                ).info.run_id
            )
        except mlflow.exceptions.MlflowException as error:
            raise MlflowError(f"MLflow at {uri!r} cannot take this run: {error}") from error

    def write_hparams(self, flat: Mapping[str, Any]) -> None:
        """Params not yet logged; one MLflow cannot change (an extended run's
        training.rounds) goes to the tag `fedjax_pals.now.<name>` instead."""
        logged = self.client.get_run(self.run_id).data.params
        values = {name: str(value) for name, value in flat.items() if value is not None}
        params = [self._entities.Param(k, v) for k, v in values.items() if k not in logged]
        for start in range(0, len(params), 100):  # MLflow's batch limit for params
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        for name, value in values.items():
            if name in logged and logged[name] != value:
                self.client.set_tag(self.run_id, f"fedjax_pals.now.{name}", value)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [
            self._entities.Metric(name, float(value), now, step) for name, value in scalars.items()
        ]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
