"""The optional MLflow writer: a missing MLflow is one clear error; with MLflow installed (the
`mlflow` extra), a run's params and metrics land in one MLflow run per workdir, resumed runs
included."""

import builtins
import json
import os
import socket
import sys
import time

import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import mlflow_writer
from fedjax_pals.experiment import train as train_lib


def _mlflow():
    # CI installs the mlflow extra and sets this, so the tests run there instead of skipping.
    if os.environ.get("FEDJAX_PALS_MLFLOW_TESTS"):
        import mlflow

        return mlflow
    return pytest.importorskip("mlflow")


def _without_mlflow(monkeypatch):
    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ImportError("No module named 'mlflow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "mlflow", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_mlflow)


def _no_task_is_built(monkeypatch):
    def build_task(config):
        raise AssertionError("the task was built (its data read) before MLflow was checked")

    monkeypatch.setattr(train_lib, "build_resolved_task", build_task)

CONFIG = {
    "dataset": {"name": "synthetic"},
    "training": {"rounds": 2, "eval_every": 1, "batch_size": 8, "learning_rate": 0.05},
}


@pytest.fixture(autouse=True)
def _mlflow_variables_unset(monkeypatch):
    """A user's own MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_NAME would change these tests."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)


def test_a_missing_mlflow_is_one_error_naming_the_extra(tmp_path, monkeypatch):
    _without_mlflow(monkeypatch)
    with pytest.raises(mlflow_writer.MlflowError, match=r"fedjax_pals\[mlflow\]"):
        fjp.experiment.MetricWriter(str(tmp_path), mlflow_tracking_uri="file:///nowhere")
    with pytest.raises(mlflow_writer.MlflowError, match="non-empty string"):
        mlflow_writer.MlflowWriter("", str(tmp_path))
    # Without the URI nothing imports MLflow.
    fjp.experiment.MetricWriter(str(tmp_path)).close()


def test_a_missing_mlflow_stops_the_run_before_its_workdir_or_data(tmp_path, monkeypatch):
    _without_mlflow(monkeypatch)
    _no_task_is_built(monkeypatch)
    workdir = tmp_path / "run"
    with pytest.raises(mlflow_writer.MlflowError, match=r"fedjax_pals\[mlflow\]"):
        fjp.train_and_evaluate(CONFIG, str(workdir), quiet=True, mlflow_tracking_uri="http://x")
    assert not workdir.exists()


def test_mlflows_variables_apply_where_the_run_sets_nothing_and_given_values_win(monkeypatch):
    assert mlflow_writer.tracking_uri(None) is None
    assert mlflow_writer.experiment_name(None) == mlflow_writer.DEFAULT_EXPERIMENT == "fedjax_pals"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from_env")
    assert mlflow_writer.tracking_uri(None) == "http://env:5000"
    assert mlflow_writer.experiment_name(None) == "from_env"
    assert mlflow_writer.tracking_uri("http://given:5000") == "http://given:5000"
    assert mlflow_writer.experiment_name("given") == "given"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # set but empty: not set
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "")
    assert mlflow_writer.tracking_uri(None) is None
    assert mlflow_writer.experiment_name(None) == "fedjax_pals"


def test_an_mlflow_tracking_uri_variable_turns_mlflow_on_and_is_named_in_its_errors(
    tmp_path, monkeypatch
):
    _without_mlflow(monkeypatch)
    _no_task_is_built(monkeypatch)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    message = (r"MLFLOW_TRACKING_URI='http://env:5000' \(from the environment\) needs MLflow, "
               r"which is not installed: .*fedjax_pals\[mlflow\].*or unset MLFLOW_TRACKING_URI")
    with pytest.raises(mlflow_writer.MlflowError, match=message):
        fjp.experiment.MetricWriter(str(tmp_path / "w"))
    workdir = tmp_path / "run"
    with pytest.raises(mlflow_writer.MlflowError, match=message):
        fjp.train_and_evaluate(CONFIG, str(workdir), quiet=True)
    assert not workdir.exists()  # checked before the workdir and the data, as a given URI
    # A URI given wins: its name in the error, not the variable's.
    with pytest.raises(mlflow_writer.MlflowError, match=r"^mlflow_tracking_uri='http://x' needs"):
        fjp.experiment.MetricWriter(str(tmp_path / "w"), mlflow_tracking_uri="http://x")


def test_mlflows_variables_name_the_store_and_experiment_of_a_run(tmp_path, monkeypatch):
    mlflow = _mlflow()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    env_uri, given_uri = (tmp_path / "env").as_uri(), (tmp_path / "given").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env_uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "env_experiment")
    fjp.experiment.MetricWriter(str(tmp_path / "a")).close()  # both from the environment
    fjp.experiment.MetricWriter(str(tmp_path / "b"), mlflow_experiment="given").close()
    fjp.experiment.MetricWriter(str(tmp_path / "c"), mlflow_tracking_uri=given_uri).close()

    def runs(uri):
        client = mlflow.MlflowClient(tracking_uri=uri)
        return sorted((e.name, os.path.basename(r.data.tags[mlflow_writer.WORKDIR_TAG]))
                      for e in client.search_experiments()
                      for r in client.search_runs([e.experiment_id]))

    assert runs(env_uri) == [("env_experiment", "a"), ("given", "b")]
    assert runs(given_uri) == [("env_experiment", "c")]


def _refused_uri() -> str:
    with socket.socket() as sock:  # a port nothing listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_an_unreachable_tracking_server_is_one_error_in_seconds_before_any_data(
    tmp_path, monkeypatch
):
    _mlflow()
    for name in mlflow_writer.CONNECT_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    _no_task_is_built(monkeypatch)
    uri, workdir = _refused_uri(), tmp_path / "run"
    started = time.monotonic()
    with pytest.raises(mlflow_writer.MlflowError) as info:
        fjp.train_and_evaluate(CONFIG, str(workdir), quiet=True, mlflow_tracking_uri=uri)
    # MLflow's own defaults retry a refused connection for minutes (7 retries, backoff 2 s);
    # the bounded open takes about 3 s, so 60 s holds on a loaded machine and fails unbounded.
    assert time.monotonic() - started < 60
    message = str(info.value)
    assert "\n" not in message and uri in message and "cannot be reached" in message
    assert not workdir.exists()
    assert not any(name in os.environ for name in mlflow_writer.CONNECT_SETTINGS)


def _history(client, run_id, name):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, name)]


@pytest.mark.integration
def test_a_run_and_its_extension_log_to_one_mlflow_run(tmp_path, monkeypatch):
    mlflow = _mlflow()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    workdir = str(tmp_path / "run")
    fjp.train_and_evaluate(CONFIG, workdir, quiet=True, mlflow_tracking_uri=uri)
    longer = {**CONFIG, "training": {**CONFIG["training"], "rounds": 3}}
    fjp.train_and_evaluate(longer, workdir, quiet=True, mlflow_tracking_uri=uri)

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(mlflow_writer.DEFAULT_EXPERIMENT)
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags[mlflow_writer.WORKDIR_TAG] == os.path.abspath(workdir)
    assert run.data.params["algorithm.name"] == "fedpals"
    assert run.data.params["training.rounds"] == "2"  # MLflow params cannot change:
    assert run.data.tags["fedjax_pals.now.training.rounds"] == "3"  # the budget reached
    assert "algorithm.lam" not in run.data.params or run.data.params["algorithm.lam"] != "None"
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        logged = [json.loads(line) for line in f]
    expected = [
        (line["step"], line["target/accuracy"]) for line in logged if "target/accuracy" in line
    ]
    assert [s for s, _ in expected] == [1, 2, 3]
    history = _history(client, run.info.run_id, "target/accuracy")
    assert [s for s, _ in history] == [s for s, _ in expected]
    assert [v for _, v in history] == pytest.approx([v for _, v in expected], rel=1e-12)
    assert run.info.status == "FINISHED"


def test_runs_are_named_short_and_found_again_by_their_path(tmp_path, monkeypatch):
    mlflow = _mlflow()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    workdir = str(tmp_path / "sweep" / "runs" / "fedpals" / "seed_0")
    writer = mlflow_writer.MlflowWriter(
        uri, workdir, experiment="label_shift", run_name="fedpals/seed_0"
    )
    writer.close()
    # A resumed run finds its MLflow run again by the path (whatever name it is given).
    again = mlflow_writer.MlflowWriter(uri, workdir, experiment="label_shift")
    assert again.run_id == writer.run_id
    client = mlflow.MlflowClient(tracking_uri=uri)
    assert client.get_experiment_by_name(mlflow_writer.DEFAULT_EXPERIMENT) is None
    run = client.get_run(writer.run_id)
    assert run.info.run_name == "fedpals/seed_0"
    assert run.data.tags[mlflow_writer.WORKDIR_TAG] == os.path.abspath(workdir)
    # A single run: its workdir's name. One named by its absolute path (earlier versions) is
    # renamed when it is resumed.
    single = str(tmp_path / "fmnist_c3")
    old = client.create_run(
        client.get_experiment_by_name("label_shift").experiment_id,
        run_name=os.path.abspath(single),
        tags={mlflow_writer.WORKDIR_TAG: os.path.abspath(single)},
    )
    resumed = mlflow_writer.MlflowWriter(uri, single, experiment="label_shift")
    assert resumed.run_id == old.info.run_id
    assert client.get_run(old.info.run_id).info.run_name == "fmnist_c3"


@pytest.mark.parametrize("launch", ["sweep", "shard"])
def test_a_sweep_passes_each_run_its_key_and_the_experiment(tmp_path, monkeypatch, launch):
    calls = []

    def many(configs, workdirs, **kwargs):
        calls.append(kwargs)
        return [RuntimeError("not trained")] * len(configs)

    monkeypatch.setattr(train_lib, "train_and_evaluate_many", many)
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.sweep = {"seeds": (0, 1), "methods": ("fedavg", "fedprox_fedpals")}
    mlflow = dict(mlflow_tracking_uri="file:///unused", mlflow_experiment="label_shift")
    if launch == "sweep":
        fjp.run_sweep(config, str(tmp_path), quiet=True, **mlflow)
    else:
        fjp.run_shard(config, str(tmp_path), "0/1", quiet=True, **mlflow)
    (kwargs,) = calls
    assert kwargs["mlflow_experiment"] == "label_shift"
    assert kwargs["run_names"] == [
        "fedavg/seed_0",
        "fedavg/seed_1",
        "fedprox_fedpals/seed_0",
        "fedprox_fedpals/seed_1",
    ]


@pytest.mark.integration
def test_a_run_logs_its_method_key_and_files_into_the_chosen_experiment(tmp_path, monkeypatch):
    mlflow = _mlflow()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    workdir = str(tmp_path / "fedprox_fedpals")
    config = {**CONFIG, "algorithm": {"name": "fedprox", "weights": "fedpals"}}
    fjp.train_and_evaluate(
        config, workdir, quiet=True, mlflow_tracking_uri=uri, mlflow_experiment="label_shift"
    )
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("label_shift")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "fedprox_fedpals"
    assert run.data.params["method"] == "fedprox_fedpals"
    artifacts = {a.path: a.file_size for a in client.list_artifacts(run.info.run_id)}
    assert set(artifacts) == {"results.json", "curves.png", "hparams.json"}
    for name, size in artifacts.items():
        assert size == os.path.getsize(os.path.join(workdir, name)), name
    with open(client.download_artifacts(run.info.run_id, "results.json", str(tmp_path))) as f:
        assert json.load(f)["config_digest"] == fjp.config_digest(config)
