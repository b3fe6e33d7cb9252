"""Per-client evaluation through the run and the sweep: every training client's accuracy on its own
examples (evaluation.per_client), the personalised models after training
(evaluation.personalization), every client as its own target (sweep.each_client) and the
per-client report."""

import json
import os

import jax
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import config as config_lib
from fedjax_pals.experiment import per_client, per_client_report
from fedjax_pals.experiment import sweep as sweep_lib

SYNTHETIC = {"dataset": {"name": "synthetic"},
             "training": {"rounds": 3, "eval_every": 1, "batch_size": 8, "learning_rate": 0.05}}


def _config(**evaluation):
    return {**SYNTHETIC, "evaluation": {"per_client": True, **evaluation}}


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"random inputs drawn with seed {seed}")
    return np.random.default_rng(seed)


def _numpy_accuracy(params, x, y):
    """A logistic regression's accuracy in float64, and the smallest margin between the top two
    logits (a float32 run may only disagree on an example within rounding of a tie)."""
    w = np.asarray(params["params"]["Dense_0"]["kernel"] if "params" in params
                   else params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(params["params"]["Dense_0"]["bias"] if "params" in params
                   else params["Dense_0"]["bias"], np.float64)
    logits = np.asarray(x, np.float64) @ w + b
    top2 = np.sort(logits, axis=1)[:, -2:]
    return float(np.mean(logits.argmax(1) == y)), float(np.min(top2[:, 1] - top2[:, 0]))


def test_a_runs_per_client_accuracies_equal_a_float64_numpy_evaluation_of_its_model():
    task = fjp.build_task(_config())
    seen = {}
    state, _ = fjp.run_training(
        task.algorithm, task.model, task.dataset, task.partition, task.training, rounds=2,
        seed=0, client_sets=task.client_sets,
        on_evaluation=lambda done, metrics, history: seen.update({done: metrics["clients"]}))
    params = jax.device_get(task.algorithm.eval_params(state))
    sets, data = task.client_sets, task.dataset
    for kind, split in (("val", data.train), ("test", data.test)):
        indices, sizes = getattr(sets, f"{kind}_indices"), getattr(sets, f"{kind}_sizes")
        got = seen[2][kind]
        for i in range(task.partition.num_clients):
            rows = indices[i, : sizes[i]]
            expected, margin = _numpy_accuracy(params, split.x[rows], split.y[rows])
            assert margin > 1e-4, "an example within rounding of a tie: draw another set"
            assert got.accuracy[i] == pytest.approx(expected, abs=1e-12)
            assert int(got.count[i]) == len(rows)


def test_the_record_keeps_each_clients_best_validation_round_and_resumes_from_results(rng):
    m, evaluations = int(rng.integers(3, 9)), int(rng.integers(2, 7))
    sizes = rng.integers(5, 50, m)
    record = per_client.PerClientRecord(sizes, {"description": "test"})
    vals = rng.integers(0, 5, (evaluations, m)) / 4.0  # ties on purpose
    vals[:, 0] = np.nan  # a client without validation examples: its latest evaluation counts
    tests = rng.random((evaluations, m))
    for e in range(evaluations):
        clients = {kind: fjp.ClientEvaluation(None, None, None, values[e])
                   for kind, values in (("val", vals), ("test", tests))}
        scalars = record.update(e + 1, clients)
    best = np.nanargmax(np.where(np.isnan(vals), -1, vals), axis=0)  # earliest on ties
    best[0] = evaluations - 1
    results = record.results()
    np.testing.assert_allclose(results["per_client_accuracy_at_best_val"],
                               tests[best, np.arange(m)])
    np.testing.assert_array_equal(results["per_client_best_val_round"], best + 1)
    assert results["per_client_summary"] == fjp.client_accuracy_summary(tests[-1], sizes)
    assert scalars["clients/accuracy_mean"] == pytest.approx(np.mean(tests[-1]))
    resumed = per_client.PerClientRecord(sizes, {"description": "test"})
    resumed.resume(json.loads(json.dumps(results)))
    assert resumed.results() == json.loads(json.dumps(results))


def test_train_and_evaluate_records_per_client_results_and_personalises_once(
        tmp_path, monkeypatch):
    config = _config(personalization=("fine_tuning", "local"), fine_tuning_steps=(0, 2),
                     local_steps=(2, 4))
    results = fjp.train_and_evaluate(config, tmp_path / "run", quiet=True)
    m = results["partition"]["num_clients"]
    assert len(results["per_client_accuracy"]) == m == len(results["per_client_val_accuracy"])
    assert results["per_client_summary_at_best_val"] == fjp.client_accuracy_summary(
        results["per_client_accuracy_at_best_val"], results["partition"]["client_sizes"])
    assert set(results["personalization"]) == {"fine_tuning", "local"}
    fine_tuning = results["personalization"]["fine_tuning"]
    assert fine_tuning["chosen"]["steps"][0] in (0, 2) and fine_tuning["client_steps"] > 0
    assert os.path.exists(tmp_path / "run" / "client_accuracy.png")
    # Training is done and personalised: a second launch computes neither again.
    calls = []
    monkeypatch.setattr(fjp.experiment.train, "personalize",
                        lambda *a, **k: calls.append(1) or {})
    again = fjp.train_and_evaluate(config, tmp_path / "run", quiet=True)
    assert calls == [] and again["personalization"] == results["personalization"]


def test_evaluation_keys_are_checked_and_off_by_default_outside_the_identity():
    default = config_lib.validate_config(SYNTHETIC)
    assert all(value is None for value in default.evaluation.values())
    assert "evaluation" not in config_lib.config_identity(default)
    on = config_lib.validate_config(_config(client_as_target=1))
    assert on.evaluation.per_client and on.evaluation.client_as_target == 1
    assert config_lib.validate_config({**SYNTHETIC, "evaluation": {"personalization": (
        "ditto",)}}).evaluation.per_client  # personalisation switches it on
    for bad, message in (
        ({"client_as_target": 2}, "client_as_target"),  # the synthetic task's 2 clients
        ({"personalization": ("finetune",)}, "personalization"),
        ({"personalization": ("ditto",), "fine_tuning_steps": (5, 2)}, "increasing"),
        ({"client_val_fraction": 1.0}, "client_val_fraction"),
        ({"client_test_size": 0}, "client_test_size"),
    ):
        with pytest.raises(fjp.ConfigError, match=message):
            config_lib.validate_config(_config(**bad))


def _each_client_sweep(**sweep):
    return {**_config(), "sweep": {"methods": ("fedavg", "fedpals"), "seeds": (0, 1),
                                   "each_client": True, **sweep}}


def test_each_client_expands_the_methods_that_use_t_once_per_client():
    runs = sweep_lib.expand(_each_client_sweep()).runs
    names = [run.name for run in runs]
    assert names == ["fedavg/seed_0", "fedavg/seed_1", "fedpals/client_0/seed_0",
                     "fedpals/client_0/seed_1", "fedpals/client_1/seed_0",
                     "fedpals/client_1/seed_1"]
    for run in runs:
        assert run.resolved["evaluation"]["client_as_target"] == run.client
        assert config_lib.config_digest(run.config) == run.digest
    with pytest.raises(fjp.ConfigError, match="protocol"):
        sweep_lib.expand(_each_client_sweep(protocol=True))


def test_each_client_runs_train_as_one_block_equal_to_each_run_alone_and_report(tmp_path):
    together = fjp.run_sweep(_each_client_sweep(), str(tmp_path / "together"), quiet=True)
    alone = fjp.run_sweep({**_each_client_sweep(), "engine": {"runs_per_program": 1}},
                          str(tmp_path / "alone"), quiet=True)
    assert set(together["runs"].values()) == {"done"}
    read = lambda where, name: json.load(open(tmp_path / where / "runs" / name / "results.json"))
    for name in together["runs"]:
        a, b = read("together", name), read("alone", name)
        assert a["target_accuracy"] == b["target_accuracy"]
        assert a["per_client_accuracy"] == b["per_client_accuracy"]
        if "client_" in name:
            client = int(name.split("client_")[1].split("/")[0])
            dists = a["partition"]["client_label_dists"]
            assert a["partition"]["target_label_dist"] == pytest.approx(dists[client])
            # Its target's sets are the client's own.
            assert a["partition"]["n_test"] == a["client_sets"]["test_sizes"][client]
            assert a["partition"]["n_val"] == a["client_sets"]["val_sizes"][client]
    (table,) = together["per_client"].values()  # one row
    per_client_row = table["FedPALS per client"]
    for seed in (0, 1):
        expected = [read("together", f"fedpals/client_{j}/seed_{seed}")[
            "target_accuracy_at_best_val"] for j in range(2)]
        assert per_client_row["per_client_accuracy"][str(seed)] == expected
        fedavg = read("together", f"fedavg/seed_{seed}")
        assert table["FedAvg"]["per_client_accuracy"][str(seed)] == fedavg[
            "per_client_accuracy_at_best_val"]
    assert os.path.exists(tmp_path / "together" / per_client_report.TABLE_FILE)
    assert os.path.exists(tmp_path / "together" / per_client_report.CDF_FIGURE)


def test_report_statistics_are_numpys_over_clients_then_seeds(rng):
    m = int(rng.integers(5, 30))
    sizes = rng.integers(10, 100, m).astype(float)
    cells = {label: {seed: {"accuracy": rng.random(m), "sizes": sizes, "client_steps": 10.0,
                            "wall_seconds": 1.0} for seed in (0, 1, 2)}
             for label in ("FedAvg", "FedPALS per client")}
    table = per_client_report.per_client_table({"row": cells})["row"]
    for label in cells:
        accuracies = np.stack([cells[label][s]["accuracy"] for s in (0, 1, 2)])
        worst = np.sort(accuracies, axis=1)[:, : int(np.ceil(m / 10))].mean(axis=1)
        summary = table[label]["summary"]
        for key, per_seed in (("mean", accuracies.mean(1)), ("worst_10", worst),
                              ("std", accuracies.std(1)), ("variance", accuracies.var(1)),
                              ("weighted_mean", accuracies @ sizes / sizes.sum())):
            assert summary[key]["mean"] == pytest.approx(per_seed.mean())
            assert summary[key]["std"] == pytest.approx(per_seed.std())
    improved = np.mean(np.stack([cells["FedPALS per client"][s]["accuracy"]
                                 > cells["FedAvg"][s]["accuracy"] for s in (0, 1, 2)]), axis=1)
    assert table["FedPALS per client"]["summary"]["improved_share"]["mean"] == pytest.approx(
        improved.mean())
    assert "improved_share" not in table["FedAvg"]["summary"]


def test_an_each_client_sweep_in_shards_collects_the_unsharded_per_client_report(tmp_path):
    config = _each_client_sweep(seeds=(0,))
    workdir = str(tmp_path / "sharded")
    shards = fjp.assign_shards(sweep_lib.expand(config).runs, 2)
    assert sorted(set(shards)) == [0, 1]
    for index in range(2):
        fjp.run_shard(config, workdir, f"{index}/2", quiet=True)
    collected = fjp.collect_sweep(workdir)
    whole = fjp.run_sweep(config, str(tmp_path / "whole"), quiet=True)
    (sharded_table,), (whole_table,) = (collected["per_client"].values(),
                                        whole["per_client"].values())
    for label in ("FedAvg", "FedPALS per client"):
        assert (sharded_table[label]["per_client_accuracy"]
                == whole_table[label]["per_client_accuracy"])
    assert os.path.exists(os.path.join(workdir, per_client_report.TABLE_FILE))


def test_runs_differing_only_in_the_client_that_is_the_target_share_one_compiled_program():
    from fedjax_pals.experiment import train as train_lib

    groups, engines = set(), set()
    for client in (0, 1):
        resolved = fjp.validate_config(_config(client_as_target=client))
        task = fjp.build_task(resolved)
        run = fjp.training.TrainingRun(
            task.algorithm, task.model, task.dataset, task.partition, task.training, rounds=2,
            seed=0, client_sets=task.client_sets)
        groups.add(train_lib.structure_group_key(resolved))
        engines.add(fjp.training.training_group_key(run))
        np.testing.assert_allclose(task.partition.target_label_dist,
                                   task.partition.client_label_dists[client])
    assert len(groups) == 1 and len(engines) == 1


def test_personalisations_are_registered_values_checked_where_registered():
    assert list(fjp.registered_personalizations())[:3] == ["fine_tuning", "ditto", "local"]
    with pytest.raises(TypeError, match="takes a fedjax_pals.Personalization"):
        fjp.register_personalization(lambda context: None)
    with pytest.raises(ValueError, match="already registered"):
        fjp.register_personalization(fjp.Personalization("ditto", lambda context: None))
    with pytest.raises(ValueError, match="Python identifier"):
        fjp.Personalization("fine tuning", lambda context: None)
    with pytest.raises(fjp.ConfigError, match=r"personalization\[0\] must be one of"):
        config_lib.validate_config(_config(personalization="nope"))
    local = fjp.registered_personalizations()["local"]
    assert local.row("FedAvg") == "local only" and fjp.registered_personalizations()[
        "ditto"].row("FedAvg") == "FedAvg + Ditto"


def test_a_per_client_run_is_extended_by_more_rounds_despite_its_recorded_lists(tmp_path):
    # results.json records the evaluation section's tuples (grids, modes) as lists: the same
    # values, so a larger training.rounds alone extends the run instead of refusing it.
    config = _config(personalization=("fine_tuning",), fine_tuning_steps=(0, 1))
    first = fjp.train_and_evaluate({**config, "training": {**SYNTHETIC["training"], "rounds": 1}},
                                   tmp_path / "run", quiet=True)
    extended = fjp.train_and_evaluate(config, tmp_path / "run", quiet=True)
    assert extended["rounds"][0] == first["rounds"][0] and extended["rounds"][-1] == 3
    # ... and personalises its new final model, not the first launch's.
    assert first["personalization"]["fine_tuning"]["round"] == 1
    assert extended["personalization"]["fine_tuning"]["round"] == 3
