"""An optional MLflow copy of a run's metrics (`pip install "fedjax_pals[mlflow]"`, never required).

`MetricWriter(..., mlflow_tracking_uri=uri)` sends what it writes to MLflow as well: the
flattened config (and the method key) as the run's params (unset ones left out), the scalars
as metrics at their round (names as in TensorBoard: `target/accuracy`, `server/ess`, ...; NaN
and inf included), and at the end of the run its results.json, curves.png and hparams.json as
artifacts. Histograms (alpha) stay in TensorBoard: MLflow has no histogram type.

One MLflow run per workdir, in the experiment `fedjax_pals` unless named otherwise
(`--mlflow_experiment`, or MLflow's variable `MLFLOW_EXPERIMENT_NAME`). The run is named short:
a sweep's run by its key in the sweep (`fedpals/seed_0`), a single run by its workdir's name;
it is found again by its tag `fedjax_pals.workdir` (the absolute path), so a resumed or
extended run logs into the run it started, renamed if an earlier version named it by that
path. MLflow params cannot change: an extended run's new `training.rounds` is the tag
`fedjax_pals.now.training.rounds`. MLflow keeps every value logged, so the rounds a resumed
run re-does after its last checkpoint appear twice at their step (TensorBoard and
metrics.jsonl drop the first copy; MLflow cannot).

MLflow's environment variables are honoured where the run's own setting is not given: with
no `--mlflow_tracking_uri` (`mlflow_tracking_uri=None`), a non-empty `MLFLOW_TRACKING_URI`
turns the MLflow copy on and names the store; with no `--mlflow_experiment`
(`mlflow_experiment=None`), a non-empty `MLFLOW_EXPERIMENT_NAME` names the experiment. A value
given to the launcher or the function wins over the variable (`tracking_uri`,
`experiment_name`).

The URI is MLflow's: `file:///abs/mlruns` (MLflow 3 refuses its file store unless
MLFLOW_ALLOW_FILE_STORE=true is set), `sqlite:///mlflow.db` (the full `mlflow` package),
`http://host:5000` (a tracking server).

Opening the store is bounded: MLflow's defaults retry an unreachable server for minutes
(7 retries, backoff factor 2, a 120 s timeout per request), so `check_store` and the writer's
first requests run with 2 retries, backoff factor 1 and a 10 s timeout (about 3 s for a refused
connection, about 35 s for a host that never answers) unless the user has set MLflow's
`MLFLOW_HTTP_REQUEST_*` variables. `train_and_evaluate` calls `check_store` before it reads any
data; the run's later logging keeps MLflow's own retries (a server busy for a moment).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator, Mapping

WORKDIR_TAG = "fedjax_pals.workdir"
DEFAULT_EXPERIMENT = "fedjax_pals"
# MLflow's own variables, read where the run does not set the value itself.
TRACKING_URI_VARIABLE = "MLFLOW_TRACKING_URI"
EXPERIMENT_VARIABLE = "MLFLOW_EXPERIMENT_NAME"

# MLflow's request settings while the store is opened (see the module docstring).
CONNECT_SETTINGS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


class MlflowError(RuntimeError):
    """MLflow is not installed, or its tracking store cannot be reached or refuses the run."""


def tracking_uri(uri: str | None) -> str | None:
    """The tracking store a run logs to: `uri` where given (`--mlflow_tracking_uri`, the
    `mlflow_tracking_uri` argument), else `$MLFLOW_TRACKING_URI` where set and non-empty, else
    None: no MLflow. The given value wins over the variable."""
    if uri is not None:
        return uri
    return os.environ.get(TRACKING_URI_VARIABLE) or None


def experiment_name(experiment: str | None) -> str:
    """The MLflow experiment a run logs into: `experiment` where given (`--mlflow_experiment`,
    the `mlflow_experiment` argument), else `$MLFLOW_EXPERIMENT_NAME` where set and non-empty,
    else `DEFAULT_EXPERIMENT` ("fedjax_pals"). The given value wins over the variable."""
    if experiment is not None:
        return experiment
    return os.environ.get(EXPERIMENT_VARIABLE) or DEFAULT_EXPERIMENT


def _import_mlflow(given: Any):
    """MLflow and the URI: `given`, or $MLFLOW_TRACKING_URI where `given` is None; the errors
    name where the URI came from."""
    uri = tracking_uri(given)
    where = (f"mlflow_tracking_uri={uri!r}" if given is not None
             else f"{TRACKING_URI_VARIABLE}={uri!r} (from the environment)")
    unset = "leave the URI unset" if given is not None else f"unset {TRACKING_URI_VARIABLE}"
    if given is None and uri is None:
        raise MlflowError(
            f"no MLflow tracking store: give mlflow_tracking_uri, or set {TRACKING_URI_VARIABLE}."
        )
    if not isinstance(uri, str) or not uri:
        raise MlflowError(f"mlflow_tracking_uri must be a non-empty string, got {uri!r}.")
    try:
        import mlflow
    except ImportError as error:
        raise MlflowError(
            f"{where} needs MLflow, which is not installed: "
            f'pip install "fedjax_pals[mlflow]" (mlflow-skinny), or {unset}.'
        ) from error
    return mlflow, uri


@contextlib.contextmanager
def _bounded_requests() -> Iterator[None]:
    # MLflow reads these variables at every request; the user's own settings win.
    added = [name for name in CONNECT_SETTINGS if name not in os.environ]
    os.environ.update({name: CONNECT_SETTINGS[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= 240 else text[:237] + "..."


@contextlib.contextmanager
def _store_errors(mlflow, uri: str, doing: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        with _bounded_requests():
            yield
    # requests' errors are OSErrors; MLflow wraps most of them in MlflowException.
    except (mlflow.exceptions.MlflowException, OSError) as error:
        raise MlflowError(
            f"MLflow at {uri!r} {doing} ({_first_line(error)}; gave up after "
            f"{time.monotonic() - started:.0f} s): start the tracking server, fix the URI, "
            "or leave it unset."
        ) from error


def check_store(uri: str | None) -> None:
    """Raises `MlflowError` (one line) unless MLflow is installed and the tracking store at
    `uri` (None: `$MLFLOW_TRACKING_URI`, `tracking_uri`) answers; bounded in time (module
    docstring). Creates nothing in the store."""
    mlflow, uri = _import_mlflow(uri)
    with _store_errors(mlflow, uri, "cannot be reached"):
        mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


class MlflowWriter:
    """Logs params and scalars of the run in `workdir` to the MLflow tracking store at `uri`,
    in the MLflow experiment `experiment`. None for either: MLflow's variable
    (`MLFLOW_TRACKING_URI`, `MLFLOW_EXPERIMENT_NAME`) where set, else no store (an error) and
    the experiment `fedjax_pals`; a value given wins over the variable."""

    def __init__(
        self,
        uri: str | None,
        workdir: str,
        *,
        experiment: str | None = None,
        run_name: str | None = None,
    ):
        mlflow, uri = _import_mlflow(uri)
        experiment = experiment_name(experiment)
        self.uri, self.experiment = uri, experiment
        if not isinstance(experiment, str) or not experiment:
            raise MlflowError(
                f"the MLflow experiment must be a non-empty name, got {experiment!r}."
            )
        self._entities = mlflow.entities
        self._store_errors = lambda doing: _store_errors(mlflow, uri, doing)
        path = os.path.abspath(os.fspath(workdir))
        run_name = run_name or os.path.basename(path) or path
        with _store_errors(mlflow, uri, "cannot take this run"):
            self.client = mlflow.MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id if found else self.client.create_experiment(experiment)
            )
            runs = self.client.search_runs(
                [experiment_id], filter_string=f"tags.`{WORKDIR_TAG}` = '{path}'", max_results=1
            )
            if runs:
                self.run_id = runs[0].info.run_id
                if runs[0].info.run_name == path:  # named by its absolute path (earlier versions)
                    self.client.update_run(self.run_id, name=run_name)
            else:
                self.run_id = self.client.create_run(
                    experiment_id, run_name=run_name, tags={WORKDIR_TAG: path}
                ).info.run_id

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
        now, metric = int(time.time() * 1000), self._entities.Metric
        metrics = [metric(name, float(value), now, step) for name, value in scalars.items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def write_artifacts(self, paths) -> None:
        """Copies each file of `paths` into the run's artifacts (again: replaced)."""
        with self._store_errors("cannot take the run's artifacts"):
            for path in paths:
                self.client.log_artifact(self.run_id, path)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
