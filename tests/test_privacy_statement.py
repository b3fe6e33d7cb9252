"""A config's privacy statement without training (fedjax_pals/dp_statement.py,
experiments/privacy.py): its numbers against a run's results.json and against dp-accounting
computed here, the launcher, and epsilon in a DP run's final line and the sweep's table."""

import json
import logging
import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import progress, protocol
from fedjax_pals.experiment.protocol import RunRecord
from config_files import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DELTA = 1e-5


def _config(dataset="fashion_mnist", rounds=10, num_clients=None, per_round=None,
            poisson=None, **algorithm):
    config = fjp.default_config()
    config.dataset.name = dataset
    if num_clients is not None:
        config.partition.num_clients = num_clients
    config.training.rounds = rounds
    config.training.clients_per_round = per_round
    if poisson is not None:
        config.training.client_sampling = "poisson"
        config.training.client_fraction = poisson
    for key, value in algorithm.items():
        config.algorithm[key] = value
    return config


def _dp_accounting_epsilon(sigma, rounds, delta, *, num_clients, per_round, poisson=None):
    """epsilon of DP-FedAvg's rounds by dp-accounting's RDP accountant, built here from the
    accounting's statement (fedjax_pals/accounting.py's docstring), not through it."""
    import dp_accounting
    from dp_accounting import rdp

    relation = dp_accounting.NeighboringRelation
    gaussian = dp_accounting.GaussianDpEvent
    if poisson is not None:
        one, neighbours = dp_accounting.PoissonSampledDpEvent(poisson, gaussian(sigma)), \
            relation.ADD_OR_REMOVE_ONE
    elif per_round == num_clients:
        one, neighbours = gaussian(sigma), relation.ADD_OR_REMOVE_ONE
    else:  # replacing one client moves the aggregate by twice the sensitivity: sigma / 2
        one = dp_accounting.SampledWithoutReplacementDpEvent(num_clients, per_round,
                                                             gaussian(sigma / 2))
        neighbours = relation.REPLACE_ONE
    accountant = rdp.RdpAccountant(neighboring_relation=neighbours)
    # The Poisson-subsampled Gaussian's RDP does not converge at a few orders near 1, each
    # left out with a warning; the bound from the others stands.
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        accountant.compose(dp_accounting.SelfComposedDpEvent(one, rounds))
    finally:
        absl.setLevel(level)
    return accountant.get_epsilon(delta)


# -- the statement's numbers -------------------------------------------------------------------


@pytest.mark.parametrize("sampling, shape", [
    ("every_client", dict(num_clients=21)),
    ("without_replacement", dict(num_clients=101, per_round=20)),
    ("poisson", dict(num_clients=101, poisson=0.2)),
])
def test_a_given_sigma_spends_what_dp_accounting_computes_for_the_runs_sampling(sampling, shape):
    statement = fjp.privacy_statement(
        _config(rounds=12, dp_clip_norm=0.5, dp_noise_multiplier=1.3, **shape))
    u = statement.updates
    assert (u.sampling, u.noise_multiplier, u.calibrated, u.rounds, u.delta) == (
        sampling, 1.3, False, 12, DELTA)
    assert u.num_clients == shape["num_clients"] - 1  # the last client is the target
    expected = _dp_accounting_epsilon(
        1.3, 12, DELTA, num_clients=u.num_clients,
        per_round=shape.get("per_round", u.num_clients), poisson=shape.get("poisson"))
    assert u.epsilon == pytest.approx(expected, rel=1e-9)
    # zero-out (the noise sigma C max alpha): dp-accounting's REPLACE_SPECIAL, whose epsilon
    # equals add/remove's for these events (the helper accounts under ADD_OR_REMOVE_ONE)
    assert u.neighbouring_relation == "zero_out"
    assert u.neighbouring == ("REPLACE_ONE" if sampling == "without_replacement"
                              else "REPLACE_SPECIAL")
    assert f"(epsilon, delta) = ({u.epsilon:.4g}, 1e-05)" in statement.text()
    # Poisson sampling's noise is scaled to the weights over every client, / q.
    assert ("max_i alpha_i / q)^2" in statement.text()) == (sampling == "poisson")


def test_sigma_0_clips_without_noise_and_guarantees_nothing():
    statement = fjp.privacy_statement(_config(dp_clip_norm=0.5, dp_noise_multiplier=0.0))
    u = statement.updates
    assert u.epsilon == float("inf") and u.event is None and u.neighbouring is None
    text = " ".join(statement.text().split())
    assert "guarantee: none (epsilon = inf at delta = 1e-05)" in text
    assert "nothing the server learns from them is private" in text
    assert "The guarantee covers every round" not in text


def test_a_target_epsilon_calibrates_the_smallest_sigma_dp_accounting_allows():
    statement = fjp.privacy_statement(
        _config(rounds=25, num_clients=51, dp_clip_norm=1.0, dp_target_epsilon=4.0))
    u = statement.updates
    assert u.calibrated and u.target_epsilon == 4.0
    spent = lambda sigma: _dp_accounting_epsilon(sigma, 25, DELTA, num_clients=50, per_round=50)
    # Within the target, and the least such sigma to the calibration's accuracy (1e-3).
    assert spent(u.noise_multiplier) <= 4.0 < spent(u.noise_multiplier / 1.002)
    assert u.epsilon == pytest.approx(spent(u.noise_multiplier), rel=1e-9)
    assert f"calibrated to epsilon 4 at delta 1e-05 over the run's 25 rounds" in " ".join(
        statement.text().split())


def test_label_dp_states_its_mechanism_noise_and_unit():
    laplace = fjp.privacy_statement(_config(label_dp_epsilon=0.5)).labels
    assert (laplace.epsilon, laplace.delta, laplace.mechanism) == (0.5, None, "laplace")
    assert laplace.noise_std == pytest.approx(2**0.5 * 2 / 0.5)  # Lap(2 / epsilon): std sqrt2 b
    statement = fjp.privacy_statement(
        _config(label_dp_epsilon=1.0, label_dp_mechanism="gaussian", label_dp_delta=1e-6))
    assert statement.updates is None and statement.private
    gaussian = statement.labels
    assert gaussian.noise_std == pytest.approx(
        fjp.privacy.gaussian_sigma(1.0, 1e-6, 2**0.5), rel=1e-12)
    text = " ".join(statement.text().split())
    assert "(epsilon, delta) = (1, 1e-06) per example" in text
    assert "DP on model updates: not applied" in text
    # FedAvg reads no S: nothing is released, and the statement says the key has no effect.
    fedavg = fjp.privacy_statement(_config(name="fedavg", label_dp_epsilon=1.0))
    assert not fedavg.private and "has no effect" in fedavg.text()


def test_a_config_without_dp_says_none_is_applied():
    statement = fjp.privacy_statement(_config())
    assert not statement.private and statement.updates is None and statement.labels is None
    assert "No differential privacy is applied" in statement.text()
    assert "No differential privacy" not in fjp.privacy_statement(
        _config(dp_clip_norm=1.0, dp_noise_multiplier=2.0)).text()


def test_the_statement_reads_no_data_and_builds_no_model(monkeypatch):
    from fedjax_pals import models
    from fedjax_pals.experiment import task

    def refuse(*args, **kwargs):
        raise AssertionError("the statement loaded data or built a model")

    for module, name in ((task, "load_data"), (task, "_load"), (task, "build_resolved_task"),
                         (models, "make_model")):
        monkeypatch.setattr(module, name, refuse)
    statement = fjp.privacy_statement(
        _config(num_clients=101, per_round=10, dp_clip_norm=1.0, dp_noise_multiplier=1.0))
    assert statement.updates.epsilon > 0


def test_a_budget_no_sigma_meets_is_the_configs_error():
    with pytest.raises(fjp.ConfigError, match="dp_target_epsilon"):
        fjp.privacy_statement(_config(rounds=10**5, dp_clip_norm=1.0, dp_target_epsilon=1e-6))


def test_the_statement_equals_what_runs_record(tmp_path):
    """Three short real runs (the synthetic task's 2 clients, 2 rounds): every client with a
    calibrated sigma and label DP, 1 of 2 clients without replacement, Poisson sampling."""
    configs = [
        _config("synthetic", rounds=2, dp_clip_norm=0.5, dp_target_epsilon=6.0,
                label_dp_epsilon=2.0),
        _config("synthetic", rounds=2, per_round=1, dp_clip_norm=0.5, dp_noise_multiplier=0.9),
        _config("synthetic", rounds=2, poisson=0.5, dp_clip_norm=0.5, dp_target_epsilon=3.0),
    ]
    workdirs = [tmp_path / str(i) for i in range(len(configs))]
    results = fjp.train_and_evaluate_many(configs, workdirs)
    for config, workdir, result in zip(configs, workdirs, results):
        assert not isinstance(result, BaseException), result
        with open(workdir / "results.json") as f:
            recorded = json.load(f)
        u = fjp.privacy_statement(config).updates
        assert recorded["dp_epsilon"] == u.epsilon  # the same accountant, to the bit
        assert recorded["dp_noise_multiplier"] == u.noise_multiplier
        assert recorded["dp_delta"] == u.delta and recorded["dp_clip_norm"] == u.clip_norm
        line = progress.result_line(recorded, 1.0)
        assert f"DP epsilon {u.epsilon:.4g} at delta 1e-05 (per client)" in line
    labels = fjp.privacy_statement(configs[0]).labels
    assert recorded is not None and labels.epsilon == 2.0
    with open(workdirs[0] / "results.json") as f:
        first = json.load(f)
    assert first["config"]["algorithm"]["label_dp_epsilon"] == labels.epsilon
    assert "label DP epsilon 2 (per example)" in progress.result_line(first, 1.0)
    # Both releases per client, as the statement states them (Laplace label DP: group privacy
    # over n_i examples plus the updates' epsilon); without label DP, S_i is not protected.
    level = fjp.privacy_statement(configs[0]).client_level
    sizes = np.asarray(first["partition"]["client_sizes"], np.float64)
    assert first["dp_client_level"]["status"] == "stated"
    assert first["dp_client_level"]["epsilon_max"] == pytest.approx(
        level.epsilon(int(sizes.max())), rel=1e-12)
    assert first["dp_client_level"]["epsilon_median"] == pytest.approx(
        level.updates_epsilon + np.median(sizes) * level.label_epsilon_per_example, rel=1e-12)
    assert recorded["dp_client_level"]["status"] == "not protected"


# -- the final line and the sweep's table -------------------------------------------------------


RESULTS = {"final_target_accuracy": 0.8523, "best_val_round": 48,
           "target_accuracy_at_best_val": 0.856}


def test_a_dp_runs_final_line_states_its_epsilon_and_a_plain_runs_does_not():
    dp = {**RESULTS, "dp_epsilon": 7.99612, "dp_delta": 1e-5}
    assert progress.result_line(dp, 9.0) == (
        "final target accuracy 85.2%; at best val (round 48) 85.6%; DP epsilon 7.996 at delta "
        "1e-05 (per client); 9.0 s this launch"
    )
    plain = {**RESULTS, "config": {"algorithm": {"label_dp_epsilon": None}}}
    assert progress.result_line(plain, 9.0) == (
        "final target accuracy 85.2%; at best val (round 48) 85.6%; 9.0 s this launch"
    )
    gaussian = {**RESULTS, "config": {"algorithm": {"label_dp_epsilon": 0.5,
                                                    "label_dp_delta": 1e-6}}}
    assert "; label DP epsilon 0.5 at delta 1e-06 (per example); 9.0 s" in progress.result_line(
        gaussian, 9.0)


def _record(method, seed, epsilon=None, row="FMNIST"):
    results = {"rounds": [1, 2], "val_accuracy": [0.5, 0.6], "target_accuracy": [0.4, 0.7],
               "target_macro_f1": [0.3, 0.6]}
    if epsilon is not None:
        results.update(dp_epsilon=epsilon, dp_delta=1e-5)
    return RunRecord(row, method, (), seed, results)


def test_the_sweep_table_shows_dp_runs_epsilon_and_no_column_without_dp():
    table = protocol.protocol_table(
        [_record("fedavg", s, 3.99871, row="eps 4") for s in (0, 1)]
        + [_record("fedavg", s, row="no DP") for s in (0, 1)])
    cell = table["rows"][0]["cells"]["fedavg"]
    assert [p["dp_epsilon"] for p in cell["per_seed"]] == [3.99871, 3.99871]
    text = protocol.table_markdown(table)
    assert "| data / split | method | selected | val acc (%) | best-val rounds | ε (δ) |" in text
    assert "| eps 4 | FedAvg | (defaults) | 60.0 | 2, 2 | 3.999 (1e-05) |" in text
    assert "| no DP | FedAvg | (defaults) | 60.0 | 2, 2 |  |" in text
    plain = protocol.table_markdown(protocol.protocol_table(
        [_record("fedavg", s) for s in (0, 1)]))
    assert "ε" not in plain and "dp_epsilon" not in json.dumps(
        protocol.protocol_table([_record("fedavg", 0)]))


# -- the launcher ---------------------------------------------------------------------------------


def _launch(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "experiments.privacy", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_the_command_prints_the_statement_of_a_config_with_overrides():
    overrides = ["--config.algorithm.dp_clip_norm=0.5", "--config.algorithm.dp_target_epsilon=8"]
    done = _launch("--config=configs/synthetic.py", *overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    config = load_config("synthetic.py")  # with the command's overrides
    config.algorithm.dp_clip_norm, config.algorithm.dp_target_epsilon = 0.5, 8.0
    expected = fjp.privacy_statement(config)
    assert done.stdout == expected.text()
    as_json = _launch("--config=configs/synthetic.py", *overrides, "--json")
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    assert json.loads(as_json.stdout)["updates"]["epsilon"] == expected.updates.epsilon


def test_the_commands_json_is_strict_with_a_null_epsilon_where_sigma_0_gives_no_guarantee():
    overrides = ["--config.algorithm.dp_clip_norm=0.5", "--config.algorithm.dp_noise_multiplier=0"]
    done = _launch("--config=configs/synthetic.py", *overrides, "--json")
    assert done.returncode == 0, done.stderr[-3000:]

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    statement = json.loads(done.stdout, parse_constant=refuse)
    assert statement["updates"]["epsilon"] is None
    assert "epsilon = inf" in statement["text"]


def test_the_command_says_no_dp_with_exit_status_0_and_a_bad_config_is_one_error_line():
    done = _launch("--config=configs/synthetic.py")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "No differential privacy is applied" in done.stdout
    bad = _launch("--config=configs/synthetic.py", "--config.algorithm.dp_target_epsilon=8")
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "dp_clip_norm" in bad.stderr


_HELP_PROBE = """
import runpy, sys
sys.argv = ["experiments.privacy", "--help"]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as exit_:
    code = exit_.code
print("exit", code, "imported", [m for m in ("jax", "fedjax_pals.experiment") if m in sys.modules],
      file=sys.stderr)
"""


def test_the_commands_help_exits_0_before_jax_is_imported():
    done = subprocess.run([sys.executable, "-c", _HELP_PROBE], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert "--config" in done.stdout and "--json" in done.stdout, done.stderr[-2000:]
    assert done.stdout.lstrip().startswith("What a run of a config guarantees")
    assert done.stderr.strip().splitlines()[-1] == "exit 0 imported []", done.stderr


def test_the_console_script_and_the_export():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["fedjax-pals-privacy"] == "fedjax_pals_experiments.privacy:entry"
    assert {"privacy_statement", "PrivacyStatement"} <= set(fjp.__all__)
    assert fjp.privacy_statement.__module__ == "fedjax_pals.dp_statement"


def test_the_guides_statement_is_what_the_library_states_for_its_command():
    """docs/guide/privacy.md shows the statement of its example's command: the ```text block
    after the ```bash block of `experiments.privacy` is `privacy_statement(...).text()` of that
    config, so that the page's output does not go stale."""
    import re
    import shlex

    with open(os.path.join(ROOT, "docs", "guide", "privacy.md")) as f:
        page = f.read()
    command, shown = re.search(
        r"```bash\n(python -m experiments\.privacy .*?)\n```\n\n```text\n(.*?)```", page,
        re.S).groups()
    args = shlex.split(command.replace("\\\n", " "))
    assert args[:4] == ["python", "-m", "experiments.privacy", "--config=configs/default.py"]
    config = fjp.default_config()
    for arg in args[4:]:
        path, _, value = arg.removeprefix("--config.").partition("=")
        section, key = path.split(".")
        config[section][key] = type(config[section][key])(value) if config[section][
            key] is not None else float(value)
    assert fjp.privacy_statement(config).text() == shown


# -- the relation, the accountant, the client-level sum (issue 58) -------------------------------


def test_the_statement_names_the_relation_and_accountant_the_run_uses():
    import dp_accounting
    from dp_accounting import pld

    statement = fjp.privacy_statement(_config(
        name="fedavg", rounds=12, num_clients=21, dp_clip_norm=0.5, dp_noise_multiplier=1.3,
        dp_neighbouring_relation="add_remove", dp_accountant="pld"))
    u = statement.updates
    assert (u.neighbouring_relation, u.neighbouring, u.accountant) == (
        "add_remove", "ADD_OR_REMOVE_ONE", "pld")
    assert u.sensitivity_factor == 2.0
    counter = pld.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    expected = counter.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(1.3), 12)).get_epsilon(DELTA)
    assert u.epsilon == pytest.approx(expected, rel=1e-9)
    text = " ".join(statement.text().split())
    assert "N(0, (2 sigma C max_i alpha_i)^2) per coordinate" in text
    assert "dp-accounting's PLD accountant" in text
    assert "dp_neighbouring_relation = add_remove" in text
    assert statement.as_dict()["updates"]["neighbouring_relation"] == "add_remove"
    plain = fjp.privacy_statement(_config(rounds=12, num_clients=21, dp_clip_norm=0.5,
                                          dp_noise_multiplier=1.3)).updates
    assert (plain.neighbouring_relation, plain.neighbouring, plain.accountant) == (
        "zero_out", "REPLACE_SPECIAL", "rdp")


def test_the_statement_says_what_is_public_and_sums_both_mechanisms_per_client():
    updates_only = fjp.privacy_statement(_config(dp_clip_norm=0.5, dp_noise_multiplier=1.3))
    text = " ".join(updates_only.text().split())
    assert "the clients' label distributions are not protected" in text
    assert "(no label DP: S_i is not protected)" in text
    assert "Central DP: the server receives every participant's raw update" in text
    assert updates_only.client_level is None
    both = fjp.privacy_statement(_config(dp_clip_norm=0.5, dp_noise_multiplier=1.3,
                                         label_dp_epsilon=1.0))
    level = both.client_level
    # basic composition of DP on updates with label DP's group privacy over n_i examples
    assert level.epsilon(54) == both.updates.epsilon + 54 * 1.0
    assert level.delta == DELTA
    text = " ".join(both.text().split())
    assert (f"(epsilon, delta) = ({both.updates.epsilon:.4g} + n_i x 1, 1e-05) for a client "
            "of n_i examples") in text
    assert both.as_dict()["client_level"]["label_epsilon_per_example"] == 1.0
    gaussian = fjp.privacy_statement(_config(dp_clip_norm=0.5, dp_noise_multiplier=1.3,
                                             label_dp_epsilon=1.0,
                                             label_dp_mechanism="gaussian"))
    assert gaussian.client_level is None
    assert "no client-level sum is stated" in " ".join(gaussian.text().split())
