"""train_and_evaluate: what a run writes, resume after a kill at any moment, data errors before
training, divergence, and build_task for every algorithm."""

import dataclasses
import glob
import json
import os
import re

import jax
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import task as task_lib
from fedjax_pals.experiment import train as train_lib

CONFIG = {
    "dataset": {"name": "synthetic"},
    "training": {"rounds": 6, "eval_every": 2, "batch_size": 8, "learning_rate": 0.05},
}
RESULT_KEYS = (
    "config config_digest dataset_source partition alpha ess alpha_round_1 ess_round_1 "
    "total_examples clients_per_round backend engine rounds target_accuracy target_macro_f1 "
    "val_accuracy val_macro_f1 train_loss wall_seconds final_target_accuracy "
    "final_target_macro_f1 best_val_round target_accuracy_at_best_val "
    "target_macro_f1_at_best_val macro_f1_classes program_runs program_mates "
    # What FedPALS' monitor reports of its weights (`Method.monitor`).
    "lam projection_distance projection_distance_s"
).split()


def _config(**training):
    return {**CONFIG, "training": {**CONFIG["training"], **training}}


_TRAINING_RUN = train_lib.TrainingRun


class Killed(BaseException):
    """A kill -9 stand-in: nothing after it runs, no except-clause catches it."""


def _instrument(monkeypatch, kill=None):
    """Wraps the training loop of train_and_evaluate: counts the rounds it trains and, with
    kill=(where, round), stops the process there. Returns the list of trained rounds."""
    trained = []
    real = _TRAINING_RUN

    def wrapper(*args, on_round, on_evaluation, checkpointer, **kwargs):
        where, at = kill or (None, None)

        def round_hook(done, loss):
            trained.append(done)
            on_round(done, loss)
            if where == "after_round" and done == at:
                raise Killed

        def evaluation_hook(done, metrics, history):
            on_evaluation(done, metrics, history)
            if where == "after_results" and done == at:
                raise Killed  # results.json and metrics written, the checkpoint not

        class Saver:
            def save(self, state, history):
                if where == "while_saving" and int(state.round) == at:
                    # Orbax writes into a temporary directory renamed when complete.
                    partial = os.path.join(checkpointer.directory, f"{at}.orbax-checkpoint-tmp-1")
                    os.makedirs(os.path.join(partial, "state"))
                    raise Killed
                checkpointer.save(state, history)
                if where == "after_checkpoint" and int(state.round) == at:
                    raise Killed

            def restore(self, template):
                return checkpointer.restore(template)

        return real(
            *args,
            on_round=round_hook,
            on_evaluation=evaluation_hook,
            checkpointer=Saver(),
            **kwargs,
        )

    monkeypatch.setattr(train_lib, "TrainingRun", wrapper)
    return trained


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    results = fjp.train_and_evaluate(_config(), str(workdir), quiet=True)
    return workdir, results


def _metrics(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def test_a_run_writes_its_results_metrics_checkpoints_and_plot(uninterrupted):
    workdir, results = uninterrupted
    with open(workdir / "results.json") as f:
        saved = json.load(f)
    assert list(saved) == RESULT_KEYS
    assert saved == json.loads(json.dumps(results))
    assert saved["rounds"] == [2, 4, 6] and len(saved["train_loss"]) == 6
    assert saved["config"] == fjp.validate_config(_config()).to_dict()
    assert saved["config_digest"] == fjp.config_digest(_config())
    assert saved["config"]["partition"]["num_clients"] == 3  # what the synthetic task used
    assert saved["final_target_accuracy"] == saved["target_accuracy"][-1]
    assert saved["best_val_round"] in saved["rounds"]
    assert abs(sum(saved["alpha"]) - 1) < 1e-5 and saved["lam"] == 0.0
    assert saved["backend"] in fjp.engine.BACKENDS
    lines = _metrics(workdir)
    assert [line["step"] for line in lines if "train/loss" in line] == [1, 2, 3, 4, 5, 6]
    assert [line["step"] for line in lines if "target/accuracy" in line] == [2, 4, 6]
    assert {k for line in lines if "target/accuracy" in line for k in line} == {
        "step",
        "target/accuracy",
        "target/macro_f1",
        "target/loss",
        "val/accuracy",
        "val/macro_f1",
        "val/loss",
        "target/accuracy_at_best_val",
        "server/lambda",
        "server/projection_distance",
    }
    headline = [line["target/accuracy_at_best_val"] for line in lines if "target/accuracy" in line]
    assert headline[-1] == saved["target_accuracy_at_best_val"]
    # The server's weights: per-client scalars (M = 2) every round; their histogram, the ESS,
    # lambda and d(T,S), constant for this run, once.
    alphas = [line["server/alpha"] for line in lines if "server/alpha" in line]
    assert len(alphas) == 1 and alphas[0] == pytest.approx(saved["alpha"], abs=1e-6)
    first = {"server/ess": 1, "server/lambda": 2, "server/projection_distance": 2}  # round, eval
    for constant, step in first.items():
        assert [line["step"] for line in lines if constant in line] == [step], constant
    per_client = [line for line in lines if "server/alpha/client_0" in line]
    assert [line["step"] for line in per_client] == [1, 2, 3, 4, 5, 6]
    assert per_client[0]["server/ess"] == pytest.approx(saved["ess"], rel=1e-5)
    assert len(saved["alpha"]) == 2
    assert [per_client[0][f"server/alpha/client_{i}"] for i in range(2)] == pytest.approx(
        saved["alpha"], abs=1e-6
    )
    evaluation = next(line for line in lines if "target/accuracy" in line)
    assert evaluation["server/lambda"] == saved["lam"] == 0.0
    assert evaluation["server/projection_distance"] == saved["projection_distance"]
    with open(workdir / "hparams.json") as f:
        hparams = json.load(f)
    assert hparams["training.learning_rate"] == 0.05
    assert hparams["algorithm.prox_mu"] is None  # unset: null, not the string "None"
    # Event files in the workdir itself: TensorBoard names the run by the workdir's path.
    assert glob.glob(str(workdir / "events.out.tfevents.*"))
    assert not os.path.exists(workdir / "tensorboard")
    with open(workdir / "metrics.csv") as f:
        rows = f.read().splitlines()
    assert rows[0] == "step,name,value" and "1,train/loss," in rows[1]
    assert os.path.getsize(workdir / "curves.png") > 1000
    checkpoints = fjp.experiment.checkpoints.Checkpointer(workdir / "checkpoints")
    assert checkpoints.steps() == [4, 6]
    assert checkpoints.read_identity() == {
        "config_digest": saved["config_digest"],
        "config": saved["config"],
    }


def test_a_finished_run_is_not_trained_again(uninterrupted, monkeypatch):
    workdir, results = uninterrupted
    trained = _instrument(monkeypatch)
    again = fjp.train_and_evaluate(_config(), str(workdir), quiet=True)
    assert trained == []
    assert {k: v for k, v in again.items() if k != "wall_seconds"} == {
        k: v for k, v in results.items() if k != "wall_seconds"
    }


# (where the process dies, in which round, the round of the checkpoint it leaves)
KILLS = [
    ("after_round", 1, None),  # before the first checkpoint
    ("after_results", 4, 2),  # results.json and metrics at round 4, checkpoint still at 2
    ("while_saving", 4, 2),  # a half-written checkpoint
    ("after_checkpoint", 4, 4),
    ("after_round", 5, 4),
]


@pytest.mark.integration
@pytest.mark.parametrize("where, at, checkpoint", KILLS)
def test_a_run_killed_at_any_moment_resumes_bit_identically(
    where, at, checkpoint, uninterrupted, tmp_path, monkeypatch
):
    _, expected = uninterrupted
    workdir = str(tmp_path / "run")
    _instrument(monkeypatch, kill=(where, at))
    with pytest.raises(Killed):
        fjp.train_and_evaluate(_config(), workdir, quiet=True)
    assert fjp.experiment.checkpoints.Checkpointer(os.path.join(workdir, "checkpoints")).latest_round() == checkpoint

    trained = _instrument(monkeypatch)
    resumed = fjp.train_and_evaluate(_config(), workdir, quiet=True)
    # Only the rounds after the checkpoint are trained again: the state really came from it.
    assert trained == list(range((checkpoint or 0) + 1, 7))
    for key in RESULT_KEYS:
        if key != "wall_seconds":
            assert resumed[key] == expected[key], key
    assert _metrics(workdir) == _metrics(uninterrupted[0])  # every round logged once, same numbers
    assert not [p for p in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in p]


def test_ess_fraction_sets_lambda(tmp_path):
    results = fjp.train_and_evaluate(
        _config(rounds=1, eval_every=1) | {"algorithm": {"ess_fraction": 0.95}},
        str(tmp_path),
        quiet=True,
    )
    assert results["lam"] > 0 and results["config"]["algorithm"]["lam"] is None
    assert abs(results["ess"] / results["total_examples"] - 0.95) < 1e-3


@pytest.fixture
def no_training(monkeypatch):
    monkeypatch.setattr(
        train_lib, "run_trainings", lambda *a, **k: pytest.fail("training was reached")
    )


def test_an_unreachable_ess_fraction_fails_before_training(tmp_path, no_training):
    # Two clients of 40 and 18 examples: alpha^0 = (.5, .5) already has ESS = 0.856 N.
    config = _config() | {"algorithm": {"ess_fraction": 0.5}}
    with pytest.raises(fjp.TaskError, match=r"ESS fraction 0\.5 is out of range.*\[0\.856"):
        fjp.train_and_evaluate(config, str(tmp_path), quiet=True)


def test_a_target_test_set_too_small_to_measure_fails_before_training(
    tmp_path, monkeypatch, no_training
):
    small = fjp.synthetic_label_shift_task(0.5, seed=0, num_test=40)
    monkeypatch.setattr(task_lib, "load_data", lambda config: small)
    with pytest.raises(
        fjp.TaskError, match=r"target test set has only 40 examples.*fewer than 100"
    ):
        fjp.train_and_evaluate(_config(), str(tmp_path), quiet=True)


def test_an_exploding_loss_is_divergence_not_a_result(tmp_path):
    # Logistic regression at learning rate 1e6 trains to a loss of ~1e5 with finite numbers.
    with pytest.raises(fjp.TrainingDivergedError, match=r"diverged in round 1: .*learning rate"):
        fjp.train_and_evaluate(_config(learning_rate=1e6), str(tmp_path), quiet=True)


def test_quiet_prints_nothing_and_otherwise_a_progress_bar(tmp_path, capfd, monkeypatch):
    from fedjax_pals.experiment import progress

    fjp.train_and_evaluate(_config(rounds=1, eval_every=1), str(tmp_path / "q"), quiet=True)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    # Not quiet, in a log file (not a terminal): the run's line and a line per evaluation, no bar.
    fjp.train_and_evaluate(_config(rounds=1, eval_every=1), str(tmp_path / "log"))
    out, err = capfd.readouterr()
    # (Indented lines are notes under a line: this run's round 1 is below chance, and says why.)
    lines = [line for line in err.splitlines() if not line.startswith("  ")]
    assert "FedPALS on synthetic label shift" in lines[0] and "%|" not in err
    assert lines[1].startswith("FedPALS seed 0: round 1/1, target acc ") and len(lines) == 2
    # In a terminal: the bar instead of the lines.
    monkeypatch.setattr(progress, "_is_terminal", lambda stream: True)
    fjp.train_and_evaluate(_config(rounds=1, eval_every=1), str(tmp_path / "loud"))
    out, err = capfd.readouterr()
    assert "FedPALS on synthetic label shift" in err and "1/1" in err and "%|" in err
    assert "round 1/1, target acc" not in err


@pytest.mark.parametrize("name", fjp.registered_methods())
def test_build_task_makes_every_algorithm(name):
    config = {"dataset": {"name": "synthetic"}, "algorithm": {"name": name}}
    task = fjp.build_task(config)
    assert task.algorithm.name.startswith(name)
    assert task.model.num_classes == 3 and task.clients_per_round == 2
    assert (task.context.lam is not None) == (name == "fedpals")
    # What the run's method reports while it trains is its own registration's (FedPALS').
    assert [m.name for m, _ in task.methods] == [name]
    if name == "oracle":  # clients resampled to T (App. B.5)
        np.testing.assert_allclose(
            task.partition.client_label_dists, np.tile(task.target_label_dist, (2, 1)), atol=0.05
        )


def test_a_perturbed_target_reaches_the_weights_but_not_the_evaluation():
    exact = fjp.build_task({"dataset": {"name": "synthetic"}})
    noisy = fjp.build_task(
        {"dataset": {"name": "synthetic"}, "algorithm": {"target_perturbation": 0.5}}
    )
    truth = exact.partition.target_label_dist
    np.testing.assert_array_equal(exact.target_label_dist, truth)
    expected = fjp.algorithms.target_perturbation.perturb_label_dist(truth, 0.5, 0)
    np.testing.assert_allclose(noisy.target_label_dist, expected)
    state = fjp.init_server_state(noisy.algorithm, noisy.model.init(jax.random.PRNGKey(0)), 2)
    np.testing.assert_allclose(state.weighting_state.target_label_dist, expected, rtol=1e-6)
    np.testing.assert_array_equal(
        noisy.partition.target_test_indices, exact.partition.target_test_indices
    )


def _fmnist_config(seed, lam):
    return {
        "seed": seed,
        "dataset": {"name": "fashion_mnist"},
        "algorithm": {"name": "fedpals", "lam": lam},
        "model": "logistic_regression",
        "training": {"rounds": 2, "batch_size": 64, "learning_rate": 0.05},
    }


@pytest.mark.integration
def test_runs_of_one_structure_train_together_and_give_their_solo_results(tmp_path, monkeypatch):
    try:
        fjp.load_fashion_mnist()
    except fjp.DatasetUnavailableError:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    # Two runs that differ in seed and lambda (one program), and one with another batch size.
    configs = [_fmnist_config(0, 0.0), _fmnist_config(1, 2.0)]
    configs.append({**_fmnist_config(0, 0.0), "training": {"rounds": 2, "batch_size": 32}})
    solo = [
        fjp.train_and_evaluate(c, str(tmp_path / f"solo{i}"), quiet=True)
        for i, c in enumerate(configs)
    ]
    groups = []
    real = train_lib.run_trainings
    monkeypatch.setattr(
        train_lib, "run_trainings", lambda runs, **kw: groups.append(len(runs)) or real(runs, **kw)
    )
    together = fjp.train_and_evaluate_many(
        configs, [str(tmp_path / f"many{i}") for i in range(len(configs))]
    )
    assert sorted(groups) == [1, 2]  # another batch size is another program
    for alone, with_others in zip(solo, together):
        np.testing.assert_allclose(with_others["train_loss"], alone["train_loss"], rtol=1e-5)
        np.testing.assert_allclose(
            with_others["target_accuracy"], alone["target_accuracy"], atol=1e-3
        )
        assert with_others["config_digest"] == alone["config_digest"]


def _program_sizes(monkeypatch) -> list[int]:
    """The runs of each program `train_and_evaluate_many` starts, in order; none is trained (each
    program raises, and its runs report the error)."""
    sizes = []

    def recorded(runs, **_):
        sizes.append(len(runs))
        raise RuntimeError("not trained: only the program's size is asked")

    monkeypatch.setattr(train_lib, "run_trainings", recorded)
    return sizes


@pytest.mark.parametrize("runs_per_program, programs", [(None, [3]), (2, [2, 1]), (1, [1, 1, 1])])
def test_engine_runs_per_program_caps_the_runs_of_one_program(
    tmp_path, monkeypatch, runs_per_program, programs
):
    # Three seeds share a structure: one program unless the config caps it (on one H200 16 runs
    # of a conv net were 2.5x slower per run than one alone: docs/measurements/gpu.md).
    engine = {} if runs_per_program is None else {"engine": {"runs_per_program": runs_per_program}}
    configs = [{**_config(rounds=2), **engine, "seed": seed} for seed in range(3)]
    sizes = _program_sizes(monkeypatch)
    outcomes = fjp.train_and_evaluate_many(configs, [tmp_path / str(i) for i in range(3)])
    assert sizes == programs and all(isinstance(o, RuntimeError) for o in outcomes)
    sizes.clear()  # the caller's cap, where lower, wins
    fjp.train_and_evaluate_many(configs, [tmp_path / str(i) for i in range(3)],
                                max_runs_per_program=1)
    assert sizes == [1, 1, 1]
    # Not part of a run's identity: the same run whatever the programs it shares.
    alone = {**_config(rounds=2), "seed": 0}
    digests = {fjp.experiment.config.config_digest(c) for c in (configs[0], alone)}
    assert len(digests) == 1


def test_engine_runs_per_program_above_16_puts_more_runs_in_one_program(tmp_path, monkeypatch):
    configs = [{**_config(rounds=2), "engine": {"runs_per_program": 20}, "seed": s}
               for s in range(18)]
    sizes = _program_sizes(monkeypatch)
    fjp.train_and_evaluate_many(configs, [tmp_path / str(i) for i in range(18)])
    assert sizes == [18]


def test_engine_runs_per_program_must_be_a_positive_integer():
    for bad in (0, -1, 2.5, "4"):
        with pytest.raises(ValueError, match="engine.runs_per_program"):
            fjp.validate_config({**CONFIG, "engine": {"runs_per_program": bad}})


def test_synthetic_runs_differing_only_in_lambda_or_seed_share_one_runs_axis():
    settings = [(0.0, 0), (0.5, 0), (0.0, 1)]
    tasks = [
        fjp.build_task({"dataset": {"name": "synthetic"}, "algorithm": {"lam": lam}, "seed": seed})
        for lam, seed in settings
    ]
    assert tasks[0].dataset is tasks[1].dataset  # one lambda's data is another's
    assert tasks[0].dataset is not tasks[2].dataset  # a seed draws its own
    runs = [
        fjp.training.TrainingRun(
            t.algorithm, t.model, t.dataset, t.partition, t.training, rounds=2, seed=seed
        )
        for t, (_, seed) in zip(tasks, settings)
    ]
    assert len({fjp.training.training_group_key(run) for run in runs}) == 1


def _dp_config(epsilon, seed=0, **algorithm):
    return {
        "seed": seed,
        "dataset": {"name": "synthetic"},
        "algorithm": {"name": "fedpals", "label_dp_epsilon": epsilon, **algorithm},
        "training": {"rounds": 2},
    }


def test_the_config_grouping_is_the_engines_for_the_per_run_state_keys():
    # structure_group_key (config.per_run_state_keys()) groups these runs exactly as the engine
    # does (training_group_key): the label-DP release's epsilon, mechanism and delta are values
    # in the state like the seed and lambda; whether a release is made at all is structure.
    configs = [
        _dp_config(None),
        _dp_config(None, seed=1, lam=2.0),
        _dp_config(1.0),
        _dp_config(0.1),
        _dp_config(0.01, seed=1),
        _dp_config(1.0, lam=2.0),
        _dp_config(1.0, label_dp_mechanism="gaussian", label_dp_delta=1e-5),
        _dp_config(0.1, label_dp_mechanism="gaussian", label_dp_delta=1e-3),
    ]
    by_config, by_engine = {}, {}
    for i, config in enumerate(configs):
        resolved = fjp.validate_config(config)
        task = fjp.build_task(resolved)
        run = fjp.training.TrainingRun(
            task.algorithm,
            task.model,
            task.dataset,
            task.partition,
            task.training,
            rounds=2,
            seed=resolved.seed,
            clients_per_round=task.clients_per_round,
        )
        by_config.setdefault(train_lib.structure_group_key(resolved), []).append(i)
        by_engine.setdefault(fjp.training.training_group_key(run), []).append(i)
    assert list(by_config.values()) == list(by_engine.values()) == [[0, 1], [2, 3, 4, 5, 6, 7]]


def _two_client_projection_distance(dists, target):
    """min over the simplex of ||T - a S_1 - (1 - a) S_2||^2, in closed form (M = 2, float64)."""
    s1, s2, t = (np.asarray(v, np.float64) for v in (dists[0], dists[1], target))
    gap = np.dot(s1 - s2, s1 - s2)  # 0: one point (a release can make S_1 = S_2)
    a = np.clip(np.dot(t - s2, s1 - s2) / gap, 0.0, 1.0) if gap > 0 else 0.0
    residual = t - a * s1 - (1 - a) * s2
    return float(residual @ residual)


def test_the_reported_projection_distance_is_that_of_the_s_the_weights_are_solved_with(
    tmp_path, capsys
):
    # The synthetic task at delta = 1: T = [0, .5, .5] lies outside Conv(S), d(T, S) = 0.375.
    exact = task_lib.build_task(_dp_config(None) | {"dataset": {"name": "synthetic",
                                                                 "synthetic_delta": 1.0}})
    private = task_lib.build_task(_dp_config(0.5) | {"dataset": {"name": "synthetic",
                                                                  "synthetic_delta": 1.0}})
    truth = exact.partition.target_label_dist
    exact_d = _two_client_projection_distance(exact.partition.client_label_dists, truth)
    released = np.asarray(private.server_label_dists)
    private_d = _two_client_projection_distance(released, truth)
    assert abs(private_d - exact_d) > 1e-3  # the release moves S, and with it d(T, S)
    from fedjax_pals.algorithms.fedpals import FedPalsMonitor

    report = FedPalsMonitor(None, exact).results(None)
    assert report["projection_distance"] == pytest.approx(exact_d, rel=1e-5)
    assert report["projection_distance_s"] == "partition.client_label_dists"
    report = FedPalsMonitor(None, private).results(None)
    assert report["projection_distance"] == pytest.approx(private_d, rel=1e-5)
    assert report["projection_distance_s"] == "server_label_dists"
    summary = task_lib.task_summary(private)
    np.testing.assert_allclose(summary["server_label_dists"], released)
    # The partition's own d(T, S) stays that of the exact S_i.
    assert summary["partition"]["projection_distance"] == pytest.approx(exact_d, rel=1e-5)
    # The run's first line says which S its d(T, S) is of.
    config = _dp_config(0.5) | {"dataset": {"name": "synthetic", "synthetic_delta": 1.0}}
    prepared = train_lib._PreparedRun(config, str(tmp_path), overwrite=False, quiet=False)
    prepared.stack.close()
    header = capsys.readouterr().err.splitlines()[0]
    assert f"d(T,S)={private_d:.4g} (S: label DP's release)," in header, header


def test_a_runs_curves_figure_is_titled_with_its_data_set(tmp_path, monkeypatch):
    titles = []
    monkeypatch.setattr(train_lib, "plot_curves", lambda path, curves, title: titles.append(title))
    # The synthetic task's description names it already; under another label the title says it.
    monkeypatch.setattr(train_lib, "dataset_label", lambda name: "Gaussian blobs")
    fjp.train_and_evaluate(_config(rounds=1, eval_every=1), str(tmp_path), quiet=True)
    (title,) = titles
    assert title.startswith("Gaussian blobs: FedPALS on synthetic label shift"), title


def test_runs_trained_together_print_their_accuracies_at_every_evaluation(tmp_path, capsys):
    # Without a terminal (stderr is captured here), one line per evaluation for the group, with
    # the accuracies the guide promises: their mean and range over the group's runs.
    configs = [_config(rounds=2, eval_every=1) | {"seed": seed} for seed in (0, 1)]
    workdirs = [str(tmp_path / f"run{seed}") for seed in (0, 1)]
    outcomes = fjp.train_and_evaluate_many(configs, workdirs, round_progress=True)
    lines = capsys.readouterr().err.splitlines()
    for at, done in enumerate((1, 2)):
        accuracies = [(o["target_accuracy"][at], o["val_accuracy"][at]) for o in outcomes]
        shown = train_lib.group_accuracies(accuracies)
        expected = (f"2 runs [run0, run1]: round {done}/2, target acc {shown['target acc']}, "
                    f"val acc {shown['val acc']}, loss ")
        assert [line for line in lines if line.startswith(expected)], (expected, lines)


def test_the_accuracies_of_runs_trained_together_are_their_mean_and_range():
    assert train_lib.group_accuracies([(0.846, 0.841)]) == {
        "target acc": "84.6%", "val acc": "84.1%"}
    assert train_lib.group_accuracies([(0.80, 0.5), (0.90, 0.7), (0.86, 0.6)]) == {
        "target acc": "mean 85.3% (80.0-90.0%)", "val acc": "mean 60.0% (50.0-70.0%)"}


def _scores(accuracy, predicted, support):
    scores = fjp.metrics.Scores(accuracy=accuracy)
    scores.predicted, scores.support = np.asarray(predicted), np.asarray(support)
    return scores


def test_an_evaluation_below_chance_says_which_class_the_model_predicts():
    note = train_lib.below_chance_note(1, _scores(0.003, [1979, 6, 15], [0, 1000, 1000]))
    assert note == (
        "  round 1: target acc 0.3% is below chance (50.0%, T's 2 classes) because the model "
        "predicts class 0 for 99.0% of the target's test examples, of which 0.0% are class 0 "
        "(an early model is often near-constant)")
    # At or above chance, or predictions spread over the classes: nothing to explain.
    assert train_lib.below_chance_note(1, _scores(0.5, [2000, 0, 0], [1000, 1000, 0])) is None
    assert train_lib.below_chance_note(1, _scores(0.2, [700, 700, 600], [1000, 1000, 0])) is None
    assert train_lib.below_chance_note(1, fjp.metrics.Scores(accuracy=0.0)) is None  # no counts


def test_a_run_whose_first_model_is_far_below_chance_says_why(tmp_path, capsys):
    # The synthetic task at delta = 1 (T = [0, .5, .5]), seed 0: the untrained logistic
    # regression on inputs far from the origin predicts class 0 almost everywhere, and one round
    # does not change that: 0.3 % where a guess gets 50 %.
    config = _config(rounds=1, eval_every=1) | {
        "dataset": {"name": "synthetic", "synthetic_delta": 1.0}}
    results = fjp.train_and_evaluate(config, str(tmp_path))
    lines = capsys.readouterr().err.splitlines()
    (note,) = [line for line in lines if "is below chance" in line]
    assert note.startswith(f"  round 1: target acc {100 * results['target_accuracy'][0]:.1f}%")
    assert "(50.0%, T's 2 classes) because the model predicts class 0 for" in note
    assert note.endswith("of which 0.0% are class 0 (an early model is often near-constant)")


def test_a_label_dp_epsilon_sweep_trains_its_runs_in_one_program(tmp_path, monkeypatch):
    # 3 epsilons x 1 seed (and the exact S, another program: its state holds no release).
    configs = [_dp_config(epsilon) for epsilon in (1.0, 0.1, 0.01, None)]
    calls = []  # (runs, the round engine) of each program the runs went through
    real = train_lib.run_trainings

    def counting(runs, **kw):
        engines = [fjp.engine.round_engine(r.algorithm, r.model, r.training, **kw) for r in runs]
        calls.append((len(runs), engines))
        return real(runs, **kw)

    monkeypatch.setattr(train_lib, "run_trainings", counting)
    outcomes = fjp.train_and_evaluate_many(
        configs, [str(tmp_path / f"run{i}") for i in range(len(configs))]
    )
    assert all(isinstance(outcome, dict) for outcome in outcomes), outcomes
    assert sorted(runs for runs, _ in calls) == [1, 3]
    dp_engines = next(engines for runs, engines in calls if runs == 3)
    (exact_engine,) = next(engines for runs, engines in calls if runs == 1)
    assert all(engine is dp_engines[0] for engine in dp_engines)  # one compiled round
    assert dp_engines[0] is not exact_engine
    # The epsilons' releases differ (the state differs), so do their weights and d(T, S).
    assert len({json.dumps(o["alpha"]) for o in outcomes[:3]}) == 3
    for outcome in outcomes[:3]:
        assert outcome["projection_distance_s"] == "server_label_dists"
        assert outcome["projection_distance"] == pytest.approx(_two_client_projection_distance(
            outcome["server_label_dists"], outcome["partition"]["target_label_dist"]), rel=1e-5)


@pytest.mark.parametrize(
    "algorithm",
    [
        {"lam_schedule": "hypergradient", "ess_fraction": 0.5},
        {"target_estimation": "em", "target_estimation_every": 1},
    ],
    ids=["hypergradient", "estimated_T"],
)
def test_the_metrics_carry_lambda_in_use_and_the_estimate_of_T(tmp_path, algorithm):
    config = _config(rounds=3, eval_every=1) | {"algorithm": algorithm}
    results = fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    lines = _metrics(tmp_path)
    evaluations = [line for line in lines if "target/accuracy" in line]
    assert [line["step"] for line in evaluations] == [1, 2, 3]

    def last(name):  # written when it changes (and once more at the end if it changed)
        return [line[name] for line in lines if name in line][-1]

    if "lam_schedule" in algorithm:
        # The lambda each round used, as recorded by the schedule, at each change; it changed,
        # so its curve runs to the last round.
        lam = [(line["step"], line["server/lambda"]) for line in lines if "server/lambda" in line]
        assert lam[0][0] == 1 and lam[-1][0] == 3
        for step, value in lam:
            assert value == pytest.approx(results["lam_per_round"][step - 1], rel=1e-6)
    else:
        assert last("server/target_estimate_l1_error") == pytest.approx(
            results["target_estimate_l1_error"], rel=1e-6
        )
        estimate = [last(f"server/target_estimate/class_{k}") for k in range(3)]
        assert estimate == pytest.approx(results["target_estimate"], abs=1e-6)
        assert last("server/projection_distance") >= 0.0


def test_an_interrupted_run_says_the_round_it_reached_and_resumes_from_its_last_checkpoint(
    uninterrupted, tmp_path, monkeypatch, capsys
):
    import signal

    from fedjax_pals.experiment import interruption, progress

    _, expected = uninterrupted
    workdir = str(tmp_path / "run")
    real = _TRAINING_RUN

    def interrupted_after_round_3(*args, on_round, **kwargs):
        def hook(done, loss):
            on_round(done, loss)
            if done == 3:  # SIGTERM while round 4 trains (as `handle_signals` raises it)
                raise interruption.Interrupted(signal.SIGTERM)

        return real(*args, on_round=hook, **kwargs)

    monkeypatch.setattr(train_lib, "TrainingRun", interrupted_after_round_3)
    with pytest.raises(interruption.Interrupted):
        fjp.train_and_evaluate(_config(), workdir)  # not quiet: stderr is no terminal here
    assert interruption.interruption_message(signal.SIGTERM) == (
        f"interrupted (SIGTERM) in round 4/6 of {workdir}; the same command resumes from round 2 "
        "(the last checkpoint)."
    )
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("  ")]
    accuracy = progress.percent(expected["target_accuracy"][0])
    assert lines[1].startswith(f"FedPALS seed 0: round 2/6, target acc {accuracy}, val acc ")
    assert " ETA " in lines[1] and len(lines) == 2  # the header, then one line per evaluation

    trained = _instrument(monkeypatch)  # the lock was let go: the same call resumes
    resumed = fjp.train_and_evaluate(_config(), workdir, quiet=True)
    assert trained == [3, 4, 5, 6]
    assert resumed["target_accuracy"] == expected["target_accuracy"]
    assert interruption.ACTIVITY.last_start == 2  # what experiments.run's last line says


@pytest.mark.parametrize("max_runs", [1, 3, 16])
def test_program_blocks_are_the_fewest_of_at_most_max_runs_with_sizes_within_one(max_runs):
    from fedjax_pals.experiment.train import program_blocks

    assert program_blocks(list(range(60)), 16) == [list(range(s, s + 15)) for s in (0, 15, 30, 45)]
    for n in range(0, 70):
        members = [3 * i + 1 for i in range(n)]
        blocks = program_blocks(members, max_runs)
        assert [i for block in blocks for i in block] == members
        assert len(blocks) == -(-n // max_runs)  # the fewest
        sizes = [len(block) for block in blocks]
        assert all(0 < size <= max_runs for size in sizes)
        assert not sizes or max(sizes) - min(sizes) <= 1


# -- per-run keys, declared on the hyperparameters: one generated case per key ------------------

# What makes the owner of a per-run key use it (with the rest at their defaults it may resolve
# to None): the method, and other keys. A per-run key not listed here runs under FedPALS with
# only itself set; if it then resolves to None, its case fails asking for an entry.
_PER_RUN_SETTINGS = {
    "feddisco_a": {"name": "feddisco"},
    "feddisco_b": {"name": "feddisco"},
    "label_dp_mechanism": {"label_dp_epsilon": 1.0},
    "label_dp_delta": {"label_dp_epsilon": 1.0, "label_dp_mechanism": "gaussian"},
    "dp_clip_norm": {"dp_noise_multiplier": 1.0},
    "dp_noise_multiplier": {"dp_clip_norm": 1.0},
    "dp_delta": {"dp_clip_norm": 1.0, "dp_noise_multiplier": 1.0},
    "dp_target_epsilon": {"dp_clip_norm": 1.0},
    # add_remove: fixed weights and every client every round (FedAvg on the 2 clients)
    "dp_neighbouring_relation": {"name": "fedavg", "dp_clip_norm": 1.0,
                                 "dp_noise_multiplier": 1.0},
    "dp_accountant": {"dp_clip_norm": 1.0, "dp_noise_multiplier": 1.0},
    # adaptive clipping's count spends 2 sigma_b = 0.2 of the synthetic task's 2 participants
    "dp_clip_quantile": {"dp_clip_norm": 1.0, "dp_noise_multiplier": 0.1},
    **{key: {"target_estimation": "bbse_constrained"} for key in (
        "target_estimation_every", "target_estimation_rho", "target_gate_sigma_min",
        "target_gate_min_recall", "target_damping", "target_warmup_rounds",
        "target_shrinkage", "target_estimation_model")},
    "target_estimation_concentration": {"target_estimation": "mapls"},
    "target_estimation_entropy_weight": {"target_estimation": "vrls"},
}
# Two values of a key where its bounds alone do not give two usable ones (an ESS fraction out
# of reach of the synthetic task's clients).
_PER_RUN_VALUES = {"ess_fraction": (0.9, 0.95), "target_warmup_rounds": (1, 2),
                   # The default resolves to None (the digests of earlier runs): unset vs the other.
                   "dp_neighbouring_relation": (None, "add_remove"),
                   "dp_accountant": (None, "pld")}


def _two_values(key):
    from fedjax_pals.experiment import config as config_lib

    if key in _PER_RUN_VALUES:
        return _PER_RUN_VALUES[key]
    default, check, _ = config_lib._algorithm_keys()[key]
    if check.kind == "choice":
        return tuple(c for c in check.choices if c is not None)[:2]
    if check.kind == "bool":
        return (False, True)
    low = 0.0 if check.low is None else float(check.low)
    high = low + 2.0 if check.high is None else float(check.high)
    values = (low + 0.3 * (high - low), low + 0.6 * (high - low))
    return tuple(int(round(v)) + 1 for v in values) if check.kind == "integer" else values


def _per_run_keys():
    from fedjax_pals.experiment import config as config_lib

    return [k.partition(".")[2] for k in config_lib.per_run_state_keys()
            if k.startswith("algorithm.")]  # evaluation.client_as_target: test_per_client.py


@pytest.mark.parametrize("key", _per_run_keys())
def test_runs_differing_only_in_a_per_run_key_share_one_compiled_program(key):
    settings = {"name": "fedpals", **_PER_RUN_SETTINGS.get(key, {})}
    groups, engines = set(), set()
    for value in _two_values(key):
        config = {
            "dataset": {"name": "synthetic"},
            "algorithm": {**settings, key: value},
            "training": {"rounds": 2},
        }
        resolved = fjp.validate_config(config)
        assert resolved.algorithm[key] == value, f"{key}: add what makes it used to _PER_RUN_SETTINGS"
        task = fjp.build_task(resolved)
        run = fjp.training.TrainingRun(
            task.algorithm, task.model, task.dataset, task.partition, task.training, rounds=2,
            seed=resolved.seed, clients_per_round=task.clients_per_round,
        )
        groups.add(train_lib.structure_group_key(resolved))
        engines.add(fjp.training.training_group_key(run))
    assert len(groups) == 1, f"{key}: the sweep's grouping splits runs that differ only in it"
    assert len(engines) == 1, f"{key}: declared per-run, but the engine compiles it in"


def test_feddisco_s_a_and_b_are_per_run_keys():
    # In FedDisco's state (FedDiscoState), so a sweep over them is one program per rest.
    assert {"feddisco_a", "feddisco_b"} <= set(_per_run_keys())
    assert "feddisco_metric" not in _per_run_keys()  # it picks the function: compiled in


def test_a_run_resolves_its_config_once(tmp_path, monkeypatch):
    # The digest, the workdir and the task take the resolved config as it is.
    from fedjax_pals.experiment import config as config_lib

    calls = []
    real = config_lib._validate
    monkeypatch.setattr(
        config_lib, "_validate", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    config = _config(rounds=1, eval_every=1)
    results = fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    assert len(calls) == 1
    assert results["config_digest"] == fjp.config_digest(config)
    # A sweep validates each grid point's config when it is expanded (one for all its seeds),
    # and its runs take them as they are: fewer validations than runs.
    calls.clear()
    sweep = {**_config(rounds=1, eval_every=1),
             "sweep": {"seeds": (0, 1), "methods": ("fedavg", "fedpals")}}
    summary = fjp.run_sweep(sweep, str(tmp_path / "sweep"), quiet=True)
    assert len(summary["runs"]) == 4 and set(summary["runs"].values()) == {"done"}
    assert len(calls) < 4


# -- what a method reports of itself (Method.monitor) ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class _ReportingHyperparameters(fjp.Hyperparameters):
    reporting_strength: float = fjp.hyperparameter(0.5, low=0.0, high=1.0, low_open=True)


class _ReportingMonitor(fjp.Monitor):
    def __init__(self, hp, task):
        self.strength = hp.reporting_strength
        self.clients = task.partition.num_clients

    def headline(self):
        return f"strength={self.strength:g} over {self.clients} clients"

    def scalars(self, state):
        return {"server/reporting_strength": self.strength}

    def results(self, state):
        return {"reporting_strength_used": self.strength}


@pytest.fixture
def reporting_method():
    fjp.register_method(fjp.Method(
        "reporting", "Reporting", lambda hp, context: fjp.fedavg(), _ReportingHyperparameters,
        client_side=True, monitor=_ReportingMonitor), replace=True)
    yield
    fjp.algorithms.registry._METHODS.pop("reporting")


def _first_line(config, tmp_path, capsys):
    prepared = train_lib._PreparedRun(config, str(tmp_path), overwrite=False, quiet=False)
    prepared.stack.close()
    return capsys.readouterr().err.splitlines()[0]


def test_a_run_shows_what_its_method_reports_and_fedavg_no_fedpals_summary(
    reporting_method, tmp_path, capsys
):
    strength = float(np.random.default_rng().choice([0.25, 0.75]))
    line = _first_line({**CONFIG, "algorithm": {"name": "reporting", "reporting_strength":
                                                strength}}, tmp_path / "a", capsys)
    assert f": strength={strength:g} over 2 clients, 6 rounds, backend " in line, line
    assert "lam=" not in line and "ESS=" not in line and "d(T,S)" not in line
    # With FedPALS' weights, the lender reports too, after the method.
    line = _first_line({**CONFIG, "algorithm": {"name": "reporting_fedpals"}}, tmp_path / "b",
                       capsys)
    assert re.search(r": strength=0\.5 over 2 clients, lam=0 ESS=\d+/\d+ d\(T,S\)=[\d.e-]+, 6 "
                     r"rounds", line), line
    line = _first_line({**CONFIG, "algorithm": {"name": "fedavg"}}, tmp_path / "c", capsys)
    assert re.search(r"FedAvg on .*: 6 rounds, backend ", line), line
    assert "lam=" not in line and "ESS=" not in line


def test_a_methods_report_reaches_results_and_tensorboard_scalars(reporting_method, tmp_path):
    config = {**CONFIG, "algorithm": {"name": "reporting"},
              "training": {**CONFIG["training"], "rounds": 2}}
    results = fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    assert results["reporting_strength_used"] == 0.5
    # No FedPALS key in a run without FedPALS' weights; its weights alpha are reported.
    assert "lam" not in results and "projection_distance" not in results
    assert abs(sum(results["alpha"]) - 1.0) < 1e-5 and results["ess"] > 0
    written = [line for line in _metrics(tmp_path) if "server/reporting_strength" in line]
    # Written when it changes: once.
    assert [line["server/reporting_strength"] for line in written] == [0.5]
