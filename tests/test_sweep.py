"""Sweeps: expansion into runs, validation before any run, resume, failures, the protocol table,
the experiment configs and the sweep / compare command lines."""

import glob
import json
import os
import re
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

import fedjax_pals as fjp
from config_files import config_module, load_config
from fedjax_pals.experiment import sweep as sweep_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sweep_config(**sweep):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 2
    config.sweep = ml_collections.ConfigDict(sweep)
    return config


def _names(config):
    return [name for name, _ in fjp.expand_sweep(config)]


# -- expansion ---------------------------------------------------------------------------------


def test_each_method_spans_only_the_grid_keys_it_uses():
    config = _sweep_config(
        seeds=(0, 1),
        methods=("fedavg", "fedprox"),
        grid=dict(training=dict(learning_rate=(0.1, 0.01)), algorithm=dict(prox_mu=(0.01, 1.0))),
    )
    names = _names(config)
    fedavg = [n for n in names if n.startswith("fedavg/")]
    fedprox = [n for n in names if n.startswith("fedprox/")]
    assert len(fedavg) == 2 * 2 and len(fedprox) == 2 * 2 * 2
    assert "fedavg/learning_rate=0.1/seed_1" in fedavg
    assert all("prox_mu" not in n for n in fedavg)
    assert "fedprox/prox_mu=1,learning_rate=0.01/seed_0" in fedprox
    runs = dict(fjp.expand_sweep(config))
    run = runs["fedprox/prox_mu=1,learning_rate=0.01/seed_0"]
    assert run.algorithm.name == "fedprox" and run.algorithm.prox_mu == 1.0
    assert run.training.learning_rate == 0.01 and run.seed == 0 and "sweep" not in run


def test_lam_and_ess_fraction_form_one_lambda_axis():
    config = _sweep_config(
        seeds=(0,),
        methods=("fedpals", "fedprox_fedpals", "fedavg"),
        grid=dict(algorithm=dict(lam=(0.0,), ess_fraction=(0.25, 0.5))),
    )
    assert _names(config) == [
        "fedpals/lam=0/seed_0",
        "fedpals/ess_fraction=0.25/seed_0",
        "fedpals/ess_fraction=0.5/seed_0",
        "fedprox_fedpals/lam=0/seed_0",
        "fedprox_fedpals/ess_fraction=0.25/seed_0",
        "fedprox_fedpals/ess_fraction=0.5/seed_0",
        "fedavg/seed_0",
    ]
    runs = dict(fjp.expand_sweep(config))
    assert runs["fedpals/ess_fraction=0.5/seed_0"].algorithm.lam is None
    assert runs["fedprox_fedpals/lam=0/seed_0"].algorithm.weights == "fedpals"


def test_method_keys_of_adaptive_lambda_and_unknown_target_set_their_fedpals_variant():
    config = _sweep_config(
        seeds=(0,),
        methods=("fedpals", "fedpals_adaptive", "fedpals_unknown_t_em", "fedavg"),
        grid=dict(algorithm=dict(lam=(0.5,))),
    )
    runs = {name: fjp.validate_config(run) for name, run in fjp.expand_sweep(config)}
    plain = runs["fedpals/lam=0.5/seed_0"].algorithm
    adaptive = runs["fedpals_adaptive/lam=0.5/seed_0"].algorithm
    unknown = runs["fedpals_unknown_t_em/lam=0.5/seed_0"].algorithm
    assert plain.lam_schedule is None and plain.target_estimation is None
    assert adaptive.name == "fedpals" and adaptive.lam_schedule == "hypergradient"
    assert unknown.name == "fedpals" and unknown.target_estimation == "em"
    assert runs["fedavg/seed_0"].algorithm.target_estimation is None
    assert len({fjp.config_digest(run) for run in runs.values()}) == 4


def test_methods_written_as_one_comma_separated_string_are_refused_with_the_literal_to_write():
    # --config.sweep.methods=fedavg,fedpals reaches the sweep as one key with commas in it.
    config = _sweep_config(seeds=(0,), methods=("fedavg,fedpals",))
    with pytest.raises(fjp.ConfigError, match=re.escape(
            "--config.sweep.methods=\"('fedavg', 'fedpals')\"")):
        fjp.expand_sweep(config)


def test_task_axes_are_table_rows_crossed_or_zipped():
    config = fjp.default_config()
    config.sweep = ml_collections.ConfigDict(
        dict(
            methods=("fedavg",),
            axes=dict(training=dict(local_epochs=(1, 2, 5), rounds=(150, 75, 30))),
            zip_axes=True,
        )
    )
    runs, _ = sweep_lib._runs(config)
    assert [
        (r.resolved["training"]["local_epochs"], r.resolved["training"]["rounds"]) for r in runs
    ] == [
        (1, 150),
        (2, 75),
        (5, 30),
    ]
    assert runs[1].name == "local_epochs=2,rounds=75/fedavg/seed_0"
    assert runs[1].row == "Fashion-MNIST C=3 (local_epochs=2, rounds=75)"
    config.sweep.zip_axes = False
    assert len(fjp.expand_sweep(config)) == 9


def test_run_digests_are_config_digest():
    config = _sweep_config(
        seeds=(0, 3), methods=("fedpals", "afl"), grid=dict(algorithm=dict(afl_step=(0.1, 1.0)))
    )
    runs, _ = sweep_lib._runs(config)
    assert len(runs) == 6
    for run in runs:
        assert run.digest == fjp.config_digest(run.config)
    assert len({run.digest for run in runs}) == len(runs)


def test_every_run_is_validated_before_any_run_starts(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(fjp.experiment.train, "train_and_evaluate_many", lambda *a, **k: calls.append(a))
    config = _sweep_config(seeds=(0,), methods=("fedavg",), axes=dict(training=dict(rounds=(2, 0))))
    with pytest.raises(
        fjp.ConfigError,
        match=r"sweep run rounds=0/fedavg/seed_0: config\.training\.rounds must be an integer",
    ):
        fjp.run_sweep(config, str(tmp_path / "w"))
    assert calls == [] and not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "sweep, match",
    [
        (dict(seeds=(0,), colour="red"), r"config\.sweep\.colour is not a sweep key"),
        (dict(seeds=()), r"config\.sweep\.seeds must be a non-empty tuple"),
        (dict(seeds=(0, 0)), r"config\.sweep\.seeds has repeated seeds"),
        (
            dict(seeds=(-1,)),
            r"config\.sweep\.seeds\[\.\.\.\] must be integers in \[0, 2\*\*32 - 1\], got -1",
        ),
        (dict(methods=("fedbest",)), r"unknown method 'fedbest'"),
        (dict(methods=("afl_fedpals",)), r"only the client-side methods"),
        (
            dict(grid=dict(training=dict(learning_rat=(0.1,)))),
            r"config\.sweep\.grid\.training\.learning_rat: 'training\.learning_rat' is not a "
            r"config key \(did you mean 'training\.learning_rate'\?\)",
        ),
        (dict(grid=dict(training=dict(learning_rate=()))), r"must be a non-empty tuple"),
        (dict(axes=dict(seed=(0, 1))), r"config\.sweep\.axes\.seed cannot be an axis"),
        (
            dict(axes=dict(training=dict(rounds=(1, 2), batch_size=(8,))), zip_axes=True),
            r"zip_axes=True needs axes of equal length",
        ),
        (dict(selection="best"), r"config\.sweep\.selection must be one of"),
        (dict(figures=("pie",)), r"'pie' is not a figure"),
        (dict(figures=("accuracy_vs_axis",)), r"'accuracy_vs_axis' needs task axes"),
        (
            dict(axes=dict(training=dict(rounds=(1, 2))), x_axis="epsilon"),
            r"config\.sweep\.x_axis='epsilon' is not a task axis; the axes are \['rounds'\]",
        ),
    ],
)
def test_bad_sweep_sections_are_refused_naming_the_key(sweep, match):
    with pytest.raises(fjp.ConfigError, match=match):
        fjp.expand_sweep(_sweep_config(**sweep))


def test_a_config_without_a_sweep_section_is_refused():
    with pytest.raises(fjp.ConfigError, match="config.sweep is missing"):
        fjp.expand_sweep(fjp.default_config())


# -- running, with a stand-in for train_and_evaluate ------------------------------------------

# Hand-made histories: (val per round, test per round) by (method, learning rate, seed).
HISTORIES = {
    ("fedavg", 0.1, 0): ([0.50, 0.60], [0.40, 0.45]),
    ("fedavg", 0.1, 1): ([0.70, 0.65], [0.66, 0.30]),
    ("fedavg", 0.01, 0): ([0.80, 0.20], [0.10, 0.10]),
    ("fedavg", 0.01, 1): ([0.20, 0.30], [0.90, 0.90]),
    ("fedpals", 0.1, 0): ([0.90, 0.95], [0.85, 0.93]),
    ("fedpals", 0.1, 1): ([0.80, 0.70], [0.75, 0.60]),
    ("fedpals", 0.01, 0): ([0.10, 0.20], [0.99, 0.99]),
    ("fedpals", 0.01, 1): ([0.10, 0.20], [0.99, 0.99]),
}


class FakeTraining:
    """Writes results.json as train_and_evaluate does, from HISTORIES; raises on demand."""

    def __init__(self, errors=None):
        self.calls = []
        self.errors = errors or {}

    def __call__(self, config, workdir, *, overwrite=False, quiet=False):
        resolved = fjp.validate_config(config)
        key = (resolved.algorithm.name, resolved.training.learning_rate, resolved.seed)
        self.calls.append(key)
        if key in self.errors:
            raise self.errors[key]
        val, test = HISTORIES[key]
        rounds = list(range(1, resolved.training.rounds + 1))
        results = {
            "config": resolved.to_dict(),
            "config_digest": fjp.config_digest(resolved),
            "rounds": rounds,
            "val_accuracy": val[: len(rounds)],
            "target_accuracy": test[: len(rounds)],
            "target_macro_f1": [t / 2 for t in test[: len(rounds)]],
            "best_val_round": rounds[int(np.argmax(val[: len(rounds)]))],
            "target_accuracy_at_best_val": test[int(np.argmax(val[: len(rounds)]))],
            "projection_distance": 0.0,
        }
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "results.json"), "w") as f:
            json.dump(results, f)
        return results

    def many(self, configs, workdirs, *, overwrite=False, quiet=True, on_done=None, **kwargs):
        """As train_and_evaluate_many: each run's results or exception, on_done as runs end."""
        outcomes = []
        for index, (config, workdir) in enumerate(zip(configs, workdirs)):
            try:
                outcome = self(config, workdir, overwrite=overwrite, quiet=quiet)
            except Exception as error:  # noqa: BLE001
                outcome = error
            outcomes.append(outcome)
            if on_done is not None:
                on_done(index, outcome)
        return outcomes

    def install(self, monkeypatch):
        monkeypatch.setattr(fjp.experiment.train, "train_and_evaluate_many", self.many)
        return self


def _two_method_sweep():
    return _sweep_config(
        seeds=(0, 1),
        methods=("fedpals", "fedavg"),
        grid=dict(training=dict(learning_rate=(0.1, 0.01))),
    )


def test_the_table_is_the_protocol_applied_to_the_runs(tmp_path, monkeypatch):
    FakeTraining().install(monkeypatch)
    summary = fjp.run_sweep(_two_method_sweep(), str(tmp_path), quiet=True)
    assert set(summary["runs"].values()) == {"done"}
    cells = summary["table"]["rows"][0]["cells"]
    # FedAvg: lr 0.1 has mean best-val 0.65 (rounds 2 and 1), lr 0.01 0.55: lr 0.1; test at the
    # best-val rounds: seed 0 round 2 -> 0.45, seed 1 round 1 -> 0.66.
    assert cells["fedavg"]["selected"] == [["learning_rate", 0.1]]
    assert cells["fedavg"]["mean"] == pytest.approx(np.mean([0.45, 0.66]))
    assert cells["fedavg"]["std"] == pytest.approx(np.std([0.45, 0.66]))
    # FedPALS: lr 0.1 (mean val 0.875) over lr 0.01 (0.2, but the best test accuracy).
    assert cells["fedpals"]["mean"] == pytest.approx(np.mean([0.93, 0.75]))
    text = (tmp_path / "table.md").read_text()
    assert "| Synthetic | **84.0 ± 9.0** | 55.5 ± 10.5 |" in text
    assert summary["markdown"] == text.rstrip("\n")
    with open(tmp_path / "table.json") as f:
        assert json.load(f)["rows"][0]["cells"]["fedavg"]["per_seed"][1]["round"] == 1
    assert (tmp_path / "comparison.png").stat().st_size > 1000
    assert os.path.isfile(
        tmp_path / "runs" / "fedpals" / "learning_rate=0.1" / "seed_1" / "results.json"
    )


def test_a_sweep_resumes_without_redoing_finished_runs(tmp_path, monkeypatch):
    fake = FakeTraining()
    fake.install(monkeypatch)
    fjp.run_sweep(_two_method_sweep(), str(tmp_path), quiet=True)
    assert len(fake.calls) == 8
    # One run killed before its last round: only it runs again.
    path = tmp_path / "runs" / "fedavg" / "learning_rate=0.01" / "seed_1" / "results.json"
    results = json.loads(path.read_text())
    results["rounds"] = results["rounds"][:1]
    path.write_text(json.dumps(results))
    fake.calls.clear()
    summary = fjp.run_sweep(_two_method_sweep(), str(tmp_path), quiet=True)
    assert fake.calls == [("fedavg", 0.01, 1)]
    assert list(summary["runs"].values()).count("skipped") == 7
    assert summary["table"]["rows"][0]["cells"]["fedavg"]["mean"] == pytest.approx(0.555)


def test_runs_of_another_config_are_refused_before_anything_runs(tmp_path, monkeypatch):
    fake = FakeTraining()
    fake.install(monkeypatch)
    fjp.run_sweep(_two_method_sweep(), str(tmp_path), quiet=True)
    fake.calls.clear()
    changed = _two_method_sweep()
    changed.training.batch_size = 8
    with pytest.raises(
        fjp.ConfigError, match=r"8 run\(s\) in .* hold another configuration.*batch_size"
    ):
        fjp.run_sweep(changed, str(tmp_path), quiet=True)
    assert fake.calls == []
    fjp.run_sweep(changed, str(tmp_path), quiet=True, overwrite=True)
    assert len(fake.calls) == 8


def test_an_x_axis_of_only_none_draws_no_curve_and_the_sweep_finishes(tmp_path, monkeypatch):
    FakeTraining().install(monkeypatch)
    config = _sweep_config(
        seeds=(0, 1),
        methods=("fedavg",),
        grid=dict(training=dict(learning_rate=(0.1,))),
        axes=dict(algorithm=dict(label_dp_epsilon=(None,))),
        figures=("accuracy_vs_axis",),
        x_axis="label_dp_epsilon",
    )
    summary = fjp.run_sweep(config, str(tmp_path), quiet=True)
    assert set(summary["runs"].values()) == {"done"}
    assert "accuracy_vs_axis" not in summary["files"]
    assert not glob.glob(str(tmp_path / "accuracy_vs_*.png"))


def test_failed_runs_are_reported_and_left_out_of_the_selection(tmp_path, monkeypatch):
    fake = FakeTraining(
        errors={
            ("fedavg", 0.1, 1): fjp.TrainingDivergedError("loss 1e9 > 23"),
            ("fedpals", 0.1, 0): ValueError(
                "ESS fraction 0.1 is out of range: for these clients and target the reachable "
                "fractions are [0.8, 1]"
            ),
            ("fedpals", 0.01, 0): RuntimeError("disk full"),
        }
    )
    fake.install(monkeypatch)
    summary = fjp.run_sweep(_two_method_sweep(), str(tmp_path), quiet=True)
    assert summary["runs"]["fedavg/learning_rate=0.1/seed_1"] == "diverged"
    assert summary["runs"]["fedpals/learning_rate=0.1/seed_0"] == "unreachable"
    assert summary["runs"]["fedpals/learning_rate=0.01/seed_0"] == "failed"
    assert "disk full" in summary["errors"]["fedpals/learning_rate=0.01/seed_0"]
    error_file = tmp_path / "runs" / "fedpals" / "learning_rate=0.01" / "seed_0" / "error.txt"
    assert "RuntimeError: disk full" in error_file.read_text()
    cells = summary["table"]["rows"][0]["cells"]
    # FedAvg lr 0.1 lost a seed: lr 0.01 is the only eligible point; FedPALS has none.
    assert cells["fedavg"]["selected"] == [["learning_rate", 0.01]]
    assert cells["fedpals"]["selected"] is None
    assert "| Synthetic | n/a | **50.0 ± 40.0** |" in summary["markdown"]
    assert "not eligible: 1 diverged, 1 failed, 1 unreachable" in summary["markdown"]


def test_a_sweep_executes_its_runs_through_one_function(tmp_path, monkeypatch):
    batches = []
    fake = FakeTraining()

    def execute(configs, workdirs, **kwargs):
        batches.append(list(workdirs))
        return [fake(c, w) for c, w in zip(configs, workdirs)]

    monkeypatch.setattr(sweep_lib, "execute_runs", execute)
    fjp.run_sweep(_two_method_sweep(), str(tmp_path), quiet=True)
    assert len(batches) == 1 and len(batches[0]) == 8


def test_without_a_terminal_a_sweep_prints_a_line_per_run_and_says_what_it_skips(
    tmp_path, monkeypatch, capsys
):
    FakeTraining().install(monkeypatch)
    fjp.run_sweep(_two_method_sweep(), str(tmp_path))  # stderr is no terminal under pytest
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(
        "[1/8] fedpals/learning_rate=0.1/seed_0: target acc 93.0% at best val (round 2), "
        "sweep ETA "
    )
    last = "[8/8] fedavg/learning_rate=0.01/seed_1: target acc 90.0% at best val (round 2)"
    assert lines[7] == last
    assert len(lines) == 8
    # One run killed before its last round: the others are skipped, and it says so.
    path = tmp_path / "runs" / "fedavg" / "learning_rate=0.01" / "seed_1" / "results.json"
    results = json.loads(path.read_text())
    results["rounds"] = results["rounds"][:1]
    path.write_text(json.dumps(results))
    fjp.run_sweep(_two_method_sweep(), str(tmp_path))
    assert capsys.readouterr().err.splitlines() == [
        "sweep: skipping 7 finished runs of 8",
        last,
    ]
    fjp.run_sweep(_two_method_sweep(), str(tmp_path))
    assert capsys.readouterr().err == "sweep: skipping 8 finished runs of 8; nothing to train\n"


@pytest.mark.integration
def test_an_interrupted_sweep_names_its_run_and_the_same_call_resumes_it(
    tmp_path, monkeypatch, capsys
):
    import signal

    from fedjax_pals.experiment import interruption
    from fedjax_pals.experiment import train as train_lib

    config = _sweep_config(seeds=(0,), methods=("fedavg", "fedpals"))
    config.training.update(rounds=4, eval_every=2, batch_size=8, learning_rate=0.05)
    real = train_lib.TrainingRun
    made, trained = [], []

    def training_run(*args, on_round, **kwargs):
        made.append(len(made))
        second = len(made) == 2

        def hook(done, loss):
            trained.append((len(made), done))
            on_round(done, loss)
            if second and done == 3:  # Ctrl-C while the second run trains its round 4
                raise interruption.Interrupted(signal.SIGINT)

        return real(*args, on_round=hook, **kwargs)

    monkeypatch.setattr(train_lib, "TrainingRun", training_run)
    with pytest.raises(interruption.Interrupted):
        fjp.run_sweep(config, str(tmp_path), quiet=True)
    assert interruption.interruption_message(signal.SIGINT) == (
        "interrupted (SIGINT) in round 4/4 of run fedpals/seed_0, with 1 of 2 runs finished; "
        "the same command resumes the sweep, this run from round 2 (the last checkpoint)."
    )
    made.clear(), trained.clear()
    summary = fjp.run_sweep(config, str(tmp_path))  # the sweep's and the run's locks were let go
    assert summary["runs"] == {"fedavg/seed_0": "skipped", "fedpals/seed_0": "done"}
    assert trained == [(1, 3), (1, 4)]  # from the checkpoint of round 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "sweep: skipping 1 finished run of 2"
    assert err[-1].startswith("[2/2] fedpals/seed_0: target acc ")


# -- the experiment configs ------------------------------------------------------------------

SWEEP_CONFIGS = sorted(
    os.path.basename(p)
    for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
    if os.path.basename(p) not in ("default.py", "synthetic.py", "demo.py")
)


def test_there_is_a_config_per_experiment_of_the_paper():
    paper = [name for name in SWEEP_CONFIGS if not name.startswith("beyond_")]
    assert paper == [
        "local_epochs_fig8b.py",
        "num_clients_fig9c.py",
        "synthetic_fig9.py",
        "table1_cifar10_c2.py",
        "table1_cifar10_c3.py",
        "table1_cifar10_dir01.py",
        "table1_fmnist_c2.py",
        "table1_fmnist_c3.py",
        "target_perturbation_table2.py",
    ]


@pytest.mark.parametrize("part", ["fresh", "table1", "issue", "heldout"])
@pytest.mark.parametrize("c", ["3", "2"])
def test_the_unknown_target_loops_seed_sets_are_apart_and_expand_into_their_remedies(part, c):
    module = config_module("beyond_unknown_target.py")
    # Through the command line's loader: `--config=configs/beyond_unknown_target.py:3,fresh`
    # hands get_config() one argument, as scripts/reproduce.sh runs it.
    config = load_config("beyond_unknown_target.py", f"{c},{part}")
    runs, sweep = sweep_lib._runs(config)
    seeds = module.LOOP_SEEDS
    assert sweep["seeds"] == seeds[part] and {r.seed for r in runs} == set(seeds[part])
    # The fresh seeds are none of those the defaults were chosen on, nor the issue's.
    assert not set(seeds["fresh"]) & (set(seeds["table1"]) | set(seeds["issue"]))
    assert not set(seeds["table1"]) & set(seeds["issue"])
    # The held-out check's seeds are none of the others.
    others = set(seeds["fresh"]) | set(seeds["table1"]) | set(seeds["issue"])
    assert len(seeds["heldout"]) == 20 and not set(seeds["heldout"]) & others
    algorithm = {r.method: r.resolved["algorithm"] for r in runs}
    assert algorithm["unknown_t_bbse_constrained_in_sample"]["target_shrinkage"] is None
    if part == "heldout":  # the default and the ensemble only
        assert set(algorithm) == {
            "fedavg", "fedpals", "unknown_t_bbse_constrained_in_sample",
            "unknown_t_shadow_ensemble",
        }
        ensemble = algorithm["unknown_t_shadow_ensemble"]
        assert ensemble["target_estimation_model"] == "fedavg_shadow_ensemble"
        return
    assert algorithm["unknown_t_shrunk"]["target_shrinkage"] == 0.25
    assert algorithm["unknown_t_shadow"]["target_estimation_model"] == "fedavg_shadow"
    if part == "fresh":
        ensemble = algorithm["unknown_t_shadow_ensemble"]
        assert ensemble["target_estimation_model"] == "fedavg_shadow_ensemble"
    if (part, c) == ("fresh", "3"):
        damped = algorithm["unknown_t_shadow_damped"]
        assert damped["target_estimation_model"] == "fedavg_shadow"
        assert damped["target_damping"] == module.DAMPING < 1
    assert algorithm["unknown_t_pretrained"]["target_estimation_model"] == "fedavg_pretrained"
    assert algorithm["unknown_t_bbse_constrained_in_sample"]["target_shrinkage"] is None
    if part == "fresh":  # the yardstick: T known up to App. B.6's noise, nothing estimated
        for name, (_, delta) in module.FLOOR.items():
            assert algorithm[name]["target_perturbation"] == delta
            assert algorithm[name]["target_estimation"] is None
    if "unknown_t_warmup3" in algorithm:
        assert algorithm["unknown_t_warmup3"]["target_warmup_rounds"] == 3
    with pytest.raises(ValueError, match="seeds must be"):
        module.get_config(f"{c},held_out")
    assert sweep_lib._runs(module.get_config(c))[1]["seeds"] == tuple(range(8))  # the ablation


@pytest.mark.parametrize("name", SWEEP_CONFIGS)
def test_each_experiment_config_expands_into_valid_runs_at_the_full_budget(name):
    config = load_config(name)
    runs, sweep = sweep_lib._runs(config)
    assert runs
    if name.startswith("table1_"):
        assert sweep["seeds"] == tuple(range(8)) and sweep["methods"] == fjp.PAPER_METHODS
        assert {r.resolved["training"]["rounds"] for r in runs} == {150}
        assert sweep["row_label"] in fjp.experiment.protocol.PAPER_TABLE_1
        fedpals = {r.hparams for r in runs if r.method == "fedpals" and r.seed == 0}
        assert len(fedpals) == 3 * 5  # learning rates x (lam -> 0+, ESS 10/25/50/75 %)
    if name == "local_epochs_fig8b.py":
        budgets = {
            r.resolved["training"]["local_epochs"] * r.resolved["training"]["rounds"] for r in runs
        }
        assert min(budgets) == 150 and max(budgets) < 150 + 40
    if name == "num_clients_fig9c.py":
        participants = {
            (r.resolved["partition"]["num_clients"], r.resolved["training"]["clients_per_round"])
            for r in runs
        }
        assert participants == {(10, 9), (50, 5), (100, 10)}
    if name == "target_perturbation_table2.py":
        deltas = {r.resolved["algorithm"]["target_perturbation"] for r in runs}
        assert deltas == {0.0, 1e-3, 1e-2, 0.5}


def _tiny(config, *, methods=2):
    """The config with the smallest budget: 1 round, 1 seed, one grid point, two rows at most."""
    plain = config.to_dict()
    sweep = plain["sweep"]
    plain["training"]["rounds"] = 1
    plain["training"]["eval_every"] = 1  # at most the rounds
    if plain["dataset"]["name"] == "shakespeare":
        # LEAF's LSTM: its batch stays 32 (at 256 the vmapped backward pass of 10 clients over
        # 80 steps asked for 38 GB); two participants.
        plain["training"]["clients_per_round"] = 2
    elif plain["dataset"]["name"] != "synthetic":
        plain["training"]["batch_size"] = 256  # few local steps: small programs to compile
        if (plain["partition"].get("num_clients") or 0) > 20:
            # 1,000 clients (DP on updates) cannot share 3,000 mock examples: ten of them.
            plain["partition"]["num_clients"] = 11
            if plain["training"].get("clients_per_round"):
                plain["training"]["clients_per_round"] = 5
    sweep["seeds"] = (0,)
    sweep["methods"] = tuple(sweep["methods"][:methods])
    evaluation = plain.get("evaluation") or {}
    if evaluation.get("personalization"):  # the smallest grids: the same programs, fewer steps
        evaluation.update(fine_tuning_steps=(0, 1), local_steps=(1,), ditto_lams=(0.1,),
                          fine_tuning_learning_rates=(0.1,))
    grid = sweep.get("grid") or {}
    for section in grid.values():
        for key in list(section):
            if key == "ess_fraction":
                del section[key]  # keep lam = 0: an ESS fraction may be out of reach on mock data
            else:
                section[key] = section[key][:1]
    if "fedpals_adaptive" in sweep["methods"]:
        grid["algorithm"]["lam"] = (1.0,)  # the adaptive schedule starts from a lam > 0
    # Two points of the figure's x axis (the first axis if none is named); crossed axes
    # (not zipped) keep one point each otherwise, so that there are two rows at most.
    all_axes = [(s, key) for s, axes in (sweep.get("axes") or {}).items() for key in axes]
    x_axis = sweep.get("x_axis") or (all_axes[0][1] if all_axes else None)
    for section, axes in (sweep.get("axes") or {}).items():
        for key in axes:
            points = 2 if sweep.get("zip_axes") or key == x_axis else 1
            axes[key] = axes[key][:points]
            if key == "rounds":
                axes[key] = (1,) * len(axes[key])
            if key == "num_clients":
                axes[key] = (10, 20)[:points]
    return ml_collections.ConfigDict(plain)


def test_the_private_updates_config_has_a_poisson_sampling_variant():
    config = load_config("beyond_private_updates.py", "poisson")
    runs, _ = sweep_lib._runs(config)
    trainings = {tuple(sorted(r.resolved["training"].items())) for r in runs}
    assert len(trainings) == 1
    training = dict(trainings.pop())
    assert training["client_sampling"] == "poisson" and training["client_fraction"] == 0.1
    assert training["clients_per_round"] == fjp.training.poisson_capacity(1000, 0.1)
    plain, _ = sweep_lib._runs(load_config("beyond_private_updates.py"))
    assert len(runs) == len(plain)  # the same rows, methods, grid and seeds
    with pytest.raises(ValueError, match="the argument must be"):
        load_config("beyond_private_updates.py", "poison")


@pytest.mark.integration
@pytest.mark.parametrize(
    "name", SWEEP_CONFIGS + ["beyond_private_updates.py:poisson"]
)
def test_each_experiment_config_runs_with_tiny_overrides(name, tmp_path):
    # Compilation dominates: every method once on the headline experiment, one elsewhere.
    name, _, argument = name.partition(":")
    config = load_config(name, argument)
    # Every client as its target: FedAvg beside FedPALS, expanded over the clients.
    each_client = bool(config.sweep.get("each_client"))
    config = _tiny(config, methods=8 if name == "table1_fmnist_c3.py" else 2 if each_client
                   else 1)
    if config.dataset.name in ("leaf", "shakespeare"):
        # Natural data: the FEMNIST-shaped copy conftest.py writes, the plays scripts/setup.sh
        # fetches.
        summary = fjp.run_sweep(config, str(tmp_path / "w"), quiet=True)
    elif config.dataset.name != "synthetic":
        # Mock data in the shape of the real set (tfds.testing.mock_data), through data_dir.
        tfds = pytest.importorskip("tensorflow_datasets")
        version = {"cifar10": "3.0.2", "fashion_mnist": "3.0.1"}[config.dataset.name]
        (tmp_path / "data" / config.dataset.name / version).mkdir(parents=True)
        (tmp_path / "data" / config.dataset.name / version / "dataset_info.json").write_text("{}")
        config.dataset.data_dir = str(tmp_path / "data")
        with tfds.testing.mock_data(num_examples=3000):
            summary = fjp.run_sweep(config, str(tmp_path / "w"), quiet=True)
    else:
        summary = fjp.run_sweep(config, str(tmp_path / "w"), quiet=True)
    assert set(summary["runs"].values()) == {"done"}, summary["errors"]
    if each_client:  # the per-client report instead of the protocol's table
        (rows,) = summary["per_client"].values()
        assert {"FedAvg", "FedPALS per client", "local only"} <= set(rows)
        assert os.path.isfile(tmp_path / "w" / "per_client_cdf.png")
        return
    table = summary["table"]
    assert len(table["rows"]) == len({r for r in summary["runs"]}) // len(table["methods"])
    for row in table["rows"]:
        assert all(cell["selected"] is not None for cell in row["cells"].values())
    assert os.path.isfile(tmp_path / "w" / "table.md")
    # Every figure the config asks for is drawn.
    prefix = {"curves": "curves:", "weights": "weights:", "lambda_trajectories": "lambda:"}
    for figure in config.sweep.get("figures", ()):
        drawn = [key for key in summary["files"] if key.startswith(prefix.get(figure, figure))]
        assert drawn, f"{figure} not drawn: {sorted(summary['files'])}"
        assert all(os.path.isfile(summary["files"][key]) for key in drawn)


@pytest.mark.integration
def test_a_tiny_synthetic_sweep_end_to_end(tmp_path):
    config = _sweep_config(seeds=(0, 1), methods=("fedpals", "fedavg"), figures=("curves",))
    config.training.batch_size = 8
    config.training.learning_rate = 0.05
    summary = fjp.run_sweep(config, str(tmp_path), quiet=True)
    assert list(summary["runs"].values()) == ["done"] * 4
    row = summary["table"]["rows"][0]
    for method in ("fedpals", "fedavg"):
        tests = []
        for seed in (0, 1):
            with open(tmp_path / "runs" / method / f"seed_{seed}" / "results.json") as f:
                results = json.load(f)
            assert results["rounds"] == [1, 2]
            tests.append(results["target_accuracy_at_best_val"])
        assert row["cells"][method]["mean"] == pytest.approx(np.mean(tests))
        assert row["cells"][method]["std"] == pytest.approx(np.std(tests))
        label = fjp.method_label(method)
        assert label in summary["markdown"]
    text = (tmp_path / "table.md").read_text()
    fedpals, fedavg = row["cells"]["fedpals"], row["cells"]["fedavg"]
    cells = [
        f"{100 * fedpals['mean']:.1f} ± {100 * fedpals['std']:.1f}",
        f"{100 * fedavg['mean']:.1f} ± {100 * fedavg['std']:.1f}",
    ]
    assert any(
        line.startswith("| Synthetic |") and cells[0] in line and cells[1] in line
        for line in text.splitlines()
    )
    assert (tmp_path / "curves" / "Synthetic.png").stat().st_size > 1000
    again = fjp.run_sweep(config, str(tmp_path), quiet=True)
    assert set(again["runs"].values()) == {"skipped"}
    assert again["table"]["rows"][0]["cells"]["fedavg"]["mean"] == row["cells"]["fedavg"]["mean"]


# -- command lines ------------------------------------------------------------------------------


def _main(*args):
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


@pytest.mark.integration
def test_the_sweep_command_lists_runs_and_names_a_bad_override():
    listed = _main(
        "experiments.sweep",
        "--config=configs/synthetic_fig9.py",
        "--config.sweep.seeds=(0,1)",
        "--config.sweep.axes.dataset.synthetic_delta=(0.0,)",
        "--list",
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "synthetic_delta=0/fedpals/lam=0,learning_rate=0.05/seed_1" in listed.stdout
    assert "12 runs" in listed.stdout
    bad = _main(
        "experiments.sweep",
        "--config=configs/synthetic_fig9.py",
        "--config.sweep.grid.training.learning_rate=(0.1,-1.0)",
        "--workdir=/nonexistent/never/created",
    )
    assert bad.returncode == 1
    assert (
        "error: sweep run synthetic_delta=0/fedpals/lam=0,learning_rate=-1/seed_0: " in bad.stderr
    )
    assert "config.training.learning_rate must be a finite number > 0" in bad.stderr


@pytest.mark.integration
def test_the_compare_command_merges_sweep_tables(tmp_path):
    from fedjax_pals.experiment import protocol

    for row, value in (("A", 0.5), ("B", 0.7)):
        records = [
            protocol.RunRecord(row, method, (), 0, {
                "rounds": [1], "val_accuracy": [0.1], "target_accuracy": [accuracy],
                "target_macro_f1": [0]})
            for method, accuracy in (("fedpals", value), ("fedavg", value - 0.25))
        ]
        protocol.write_protocol_report(str(tmp_path / row), protocol.protocol_table(records),
                                       plot=False)
    done = _main(
        "experiments.compare",
        f"--tables={tmp_path / 'A'},{tmp_path / 'B'}",
        f"--workdir={tmp_path / 'AB'}",
        "--paired=fedpals",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| A | **50.0 ± 0.0** |" in done.stdout and "| B | **70.0 ± 0.0** |" in done.stdout
    with open(tmp_path / "AB" / "table.json") as f:
        assert [r["row"] for r in json.load(f)["rows"]] == ["A", "B"]
    # Every method against --paired's, seed by seed (one seed: no std, no test).
    assert "minus FedPALS', seed by seed" in done.stdout
    for row in ("A", "B"):
        line = f"| {row} | FedAvg | -25.0 | - | 0 / 1 | - | -25.0 |"
        assert line in done.stdout and line in (tmp_path / "AB" / "paired.md").read_text()
    bad = _main("experiments.compare", f"--tables={tmp_path / 'A'}",
                f"--workdir={tmp_path / 'bad'}", "--paired=oracle")
    assert bad.returncode != 0 and "--paired: the reference method 'oracle'" in bad.stderr


def test_the_default_row_label_names_each_partition_scheme():
    for scheme, label in (
        ("sparsity", "Fashion-MNIST C=3"),
        ("niid_bench_sparsity", "Fashion-MNIST C=3 (niid_bench_sparsity)"),
        ("dirichlet", "Fashion-MNIST beta=0.1"),
    ):
        config = fjp.default_config()
        config.partition.scheme = scheme
        assert sweep_lib._default_row(config) == label


def test_the_sweep_eta_is_not_printed_over_runs_that_ended_together(tmp_path, capsys):
    # FedAvg's two seeds train in one program and end together: the first one's line has no
    # ETA (it would count its group-mate as still to train), the group's last line has.
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 1
    config.sweep = ml_collections.ConfigDict(
        dict(seeds=(0, 1), methods=("fedavg", "fedprox"), protocol=False)
    )
    fjp.run_sweep(config, str(tmp_path))
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("[")]
    assert [l.split(":")[0] for l in lines] == [
        "[1/4] fedavg/seed_0", "[2/4] fedavg/seed_1", "[3/4] fedprox/seed_0",
        "[4/4] fedprox/seed_1",
    ]
    assert ["sweep ETA" in l for l in lines] == [False, True, False, False]


def test_keys_a_registration_declares_on_one_axis_form_one_axis_not_their_product():
    import dataclasses

    from fedjax_pals.algorithms import registry

    @dataclasses.dataclass(frozen=True)
    class TwoWays(fjp.Hyperparameters):
        axis_rate: float | None = fjp.hyperparameter(None, low=0.0, optional=True,
                                                     axis="axis_speed")
        axis_period: float | None = fjp.hyperparameter(None, low=0.0, low_open=True,
                                                       optional=True, axis="axis_speed")

    saved = dict(registry._FEATURES)
    try:
        fjp.register_feature(fjp.Feature(
            "axis_two_ways", "two ways", TwoWays, lambda values, facts: dict(values),
            stage="algorithm"))
        config = _sweep_config(seeds=(0,), methods=("fedavg",), grid=dict(
            algorithm=dict(axis_rate=(0.5,), axis_period=(2.0, 4.0)),
            training=dict(learning_rate=(0.1, 0.01))))
        assert _names(config) == [
            f"fedavg/{point},learning_rate={lr}/seed_0"
            for point in ("axis_rate=0.5", "axis_period=2", "axis_period=4")
            for lr in ("0.1", "0.01")
        ]
        runs = dict(fjp.expand_sweep(config))
        run = runs["fedavg/axis_period=4,learning_rate=0.01/seed_0"]
        assert run.algorithm.axis_period == 4.0 and run.algorithm.axis_rate is None
    finally:
        registry._FEATURES.clear()
        registry._FEATURES.update(saved)
        fjp.extensions.forget_registration("feature", "axis_two_ways")
