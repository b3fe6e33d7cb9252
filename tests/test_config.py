"""The config: every bad value fails with a message naming its key, before any data or workdir
is touched; the resolved config records what the run uses; the digest is the run's identity."""

import copy
import os

import ml_collections
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import task as task_lib


def _nested(path: str, value) -> dict:
    tree: dict = {}
    node = tree
    *sections, leaf = path.split(".")
    for section in sections:
        node = node.setdefault(section, {})
    node[leaf] = value
    return tree


def _merge(*trees) -> dict:
    merged: dict = {}
    for tree in trees:
        for key, value in tree.items():
            if isinstance(value, dict):
                merged[key] = _merge(merged.get(key, {}), value)
            else:
                merged[key] = value
    return merged


# (what is set, the message it must give). Each is one class of bad input.
BAD_INPUTS = [
    # wrong types
    ({"training.rounds": "5"}, r"config\.training\.rounds must be an integer in \[1, "),
    ({"training.rounds": 2.5}, r"config\.training\.rounds must be an integer"),
    ({"training.rounds": True}, r"config\.training\.rounds must be an integer"),
    ({"training.rounds": None}, r"config\.training\.rounds must be an integer.*got None"),
    ({"training.learning_rate": "0.1"}, r"config\.training\.learning_rate must be a finite"),
    ({"algorithm.fedrs_soft": "yes", "algorithm.name": "fedrs"}, r"fedrs_soft must be True or"),
    # zero / negative / NaN / inf numbers
    (
        {"training.rounds": 0},
        r"config\.training\.rounds must be an integer in \[1, 1000000\], got 0",
    ),
    ({"training.local_epochs": -1}, r"config\.training\.local_epochs must be an integer in \[1,"),
    ({"training.batch_size": 0}, r"config\.training\.batch_size must be an integer in \[1,"),
    ({"training.learning_rate": 0.0}, r"learning_rate must be a finite number > 0, got 0"),
    ({"training.learning_rate": -0.1}, r"learning_rate must be a finite number > 0, got -0\.1"),
    (
        {"training.learning_rate": float("nan")},
        r"learning_rate must be a finite number > 0, got nan",
    ),
    (
        {"training.learning_rate": float("inf")},
        r"learning_rate must be a finite number > 0, got inf",
    ),
    ({"seed": -1}, r"config\.seed must be an integer in \[0, "),
    ({"engine.chunk_size": 0}, r"config\.engine\.chunk_size must be an integer >= 1, got 0"),
    ({"training.eval_every": 0}, r"config\.training\.eval_every must be an integer in \[1, 20\]"),
    # eval_every beyond the rounds
    (
        {"training.eval_every": 21},
        r"eval_every must be an integer in \[1, 20\].*training\.rounds=20",
    ),
    # unknown names (with a suggestion)
    ({"dataset.name": "mnist"}, r"config\.dataset\.name must be one of \['fashion_mnist', "),
    ({"algorithm.name": "fedpal"}, r"algorithm\.name must be one of .*did you mean 'fedpals'"),
    (
        {"model": "resnet"},
        r"config\.model must be one of \['auto', 'lenet', 'lenet_nobias', 'logistic_regression', 'lstm_leaf'\]",
    ),
    ({"partition.scheme": "iid"}, r"config\.partition\.scheme must be one of \['sparsity', "),
    ({"engine.backend": "gpu"}, r"config\.engine\.backend must be one of \['auto', "),
    ({"algorithm.weights": "uniform"}, r"config\.algorithm\.weights must be one of \['fedavg', "),
    # contradictions
    (
        {"algorithm.lam": 1.0, "algorithm.ess_fraction": 0.5},
        r"algorithm\.lam=1 and config\.algorithm\.ess_fraction=0\.5 are both set",
    ),
    (
        {"training.clients_per_round": 3, "training.client_fraction": 0.5},
        r"clients_per_round=3 and config\.training\.client_fraction=0\.5 are both set",
    ),
    ({"algorithm.weights": "fedavg"}, r"weights='fedavg' contradicts algorithm\.name='fedpals'"),
    (
        {"algorithm.name": "scaffold", "algorithm.weights": "fedpals"},
        # Every registered client-side method, the built-ins first (iwerm, fedvls: issue 60).
        r"weights='fedpals' applies only to \['fedprox', 'fedrs', 'fedshift', 'fedlc', 'iwerm', "
        r"'fedvls'\]",
    ),
    ({"dataset.name": "synthetic", "model": "lenet"}, r"model='lenet' needs image inputs"),
    (
        {"dataset.name": "synthetic", "model": "lenet_nobias"},
        r"model='lenet_nobias' needs image inputs",
    ),
    (
        {"partition.scheme": "niid_bench_sparsity", "partition.labels_per_client": 11},
        r"labels_per_client must be an integer in \[1, 10\].*K=10",
    ),
    # lambda and ESS
    ({"algorithm.lam": -1.0}, r"config\.algorithm\.lam must be a finite number >= 0 .*, got -1"),
    (
        {"algorithm.lam": float("inf")},
        r"config\.algorithm\.lam must be a finite number >= 0.*FedAvg",
    ),
    ({"algorithm.ess_fraction": 0.0}, r"ess_fraction must be a number in \(0, 1\).*got 0"),
    ({"algorithm.ess_fraction": 1.0}, r"ess_fraction must be a number in \(0, 1\).*FedAvg"),
    ({"algorithm.ess_fraction": 1.5}, r"ess_fraction must be a number in \(0, 1\).*got 1\.5"),
    # participation: 0 is never "all", and never more than the training clients
    ({"training.clients_per_round": 0}, r"clients_per_round must be an integer in \[1, 9\].*got 0"),
    (
        {"training.clients_per_round": 10},
        r"clients_per_round must be an integer in \[1, 9\] \(the 9",
    ),
    ({"training.client_fraction": 0.0}, r"client_fraction must be a number in \(0, 1\], got 0"),
    ({"training.client_fraction": 1.5}, r"client_fraction must be a number in \(0, 1\], got 1\.5"),
    # partition
    (
        {"partition.labels_per_client": 11},
        r"labels_per_client must be an integer in \[1, 10\].*K=10",
    ),
    ({"partition.labels_per_client": 0}, r"labels_per_client must be an integer"),
    ({"partition.num_clients": 1}, r"num_clients must be an integer in \[2, 60000\].*target"),
    ({"partition.num_clients": 10**7}, r"num_clients must be an integer in \[2, 60000\]"),
    (
        {"partition.scheme": "dirichlet", "partition.dirichlet_beta": 0.0},
        r"dirichlet_beta must be a finite number > 0, got 0",
    ),
    ({"dataset.name": "synthetic", "dataset.synthetic_delta": 1.5}, r"synthetic_delta must be a"),
    # the baselines' settings
    (
        {"algorithm.name": "fedrs", "algorithm.fedrs_alpha": 0.0},
        r"fedrs_alpha must be a number in \(0, 1\]",
    ),
    (
        {"algorithm.name": "fedrs", "algorithm.fedrs_alpha": 1.5},
        r"fedrs_alpha must be a number in \(0, 1\]",
    ),
    (
        {"algorithm.name": "fedprox", "algorithm.prox_mu": -0.1},
        r"prox_mu must be a finite number >= 0",
    ),
    (
        {"algorithm.name": "fedprox", "algorithm.prox_mu": None},
        r"prox_mu is None, but fedprox needs it",
    ),
    (
        {"algorithm.name": "scaffold", "algorithm.server_lr": 0.0},
        r"server_lr must be a finite number > 0",
    ),
    (
        {"algorithm.name": "afl", "algorithm.afl_step": float("nan")},
        r"afl_step must be a finite number > 0",
    ),
    ({"algorithm.target_perturbation": -1.0}, r"target_perturbation must be a finite number >= 0"),
    # unknown keys, malformed sections
    (
        {"training.roundz": 3},
        r"config\.training\.roundz is not a known key \(did you mean 'rounds'\?\)",
    ),
    (
        {"trainig": {"rounds": 3}},
        r"config\.trainig is not a known key \(did you mean 'training'\?\)",
    ),
    ({"training": 5}, r"config\.training must be a section"),
]


def _ids(cases):
    return [",".join(f"{k}={v!r}" for k, v in setting.items())[:60] for setting, _ in cases]


@pytest.fixture
def no_data_loading(monkeypatch):
    """Fails the test if anything reaches the data (or the training)."""

    def loaded(*args, **kwargs):
        raise AssertionError("data loading was reached")

    monkeypatch.setattr(task_lib, "load_data", loaded)
    monkeypatch.setattr(fjp, "load_fashion_mnist", loaded)


@pytest.mark.parametrize("setting, message", BAD_INPUTS, ids=_ids(BAD_INPUTS))
def test_a_bad_value_fails_naming_it_before_any_data_or_workdir(
    setting, message, tmp_path, no_data_loading
):
    config = _merge(*(_nested(path, value) for path, value in setting.items()))
    with pytest.raises(fjp.ConfigError, match=message):
        fjp.validate_config(config)
    workdir = tmp_path / "run"
    with pytest.raises(fjp.ConfigError, match=message):
        fjp.train_and_evaluate(config, str(workdir), quiet=True)
    assert not workdir.exists()  # nothing written, not even the workdir


def test_a_config_that_is_not_a_mapping_is_refused():
    with pytest.raises(fjp.ConfigError, match="config must be an ml_collections.ConfigDict or"):
        fjp.validate_config(5)


def test_the_schema_sections_are_locked_against_misspelt_keys():
    config = fjp.default_config()
    with pytest.raises(AttributeError, match="roundz"):
        config.training.roundz = 3
    config.sweep = ml_collections.ConfigDict({"seeds": (0, 1)})  # the top level stays open


def test_a_data_dir_that_does_not_exist_is_an_error(tmp_path, no_data_loading):
    config = {"dataset": {"data_dir": str(tmp_path / "nowhere")}}
    with pytest.raises(fjp.ConfigError, match=r"data_dir=.*nowhere does not exist"):
        fjp.train_and_evaluate(config, str(tmp_path / "run"))


def test_a_data_dir_without_the_data_set_names_what_is_missing(tmp_path, no_data_loading):
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"")
    config = {"dataset": {"data_dir": str(tmp_path)}}
    with pytest.raises(
        fjp.ConfigError, match=r"does not hold Fashion-MNIST: missing the idx"
    ) as info:
        fjp.train_and_evaluate(config, str(tmp_path / "run"))
    assert "train-labels-idx1-ubyte[.gz]" in str(info.value)
    assert "train-images-idx3-ubyte[.gz]" not in str(info.value)
    cifar = {"dataset": {"name": "cifar10", "data_dir": str(tmp_path)}}
    with pytest.raises(fjp.ConfigError, match=r"does not hold CIFAR-10: no prepared TFDS copy"):
        fjp.validate_config(cifar)
    # Unless the run may download it (CIFAR-10 only: Fashion-MNIST is read from local files).
    cifar["dataset"]["download"] = True
    assert fjp.validate_config(cifar).dataset.download is True
    with pytest.raises(fjp.ConfigError, match="download=True applies to cifar10 only"):
        fjp.validate_config({"dataset": {"download": True}})


def test_a_data_dir_that_is_a_file_is_an_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(fjp.ConfigError, match=r"data_dir=.*file is not a directory"):
        fjp.validate_config({"dataset": {"data_dir": str(tmp_path / "file")}})


def test_a_data_dir_with_the_idx_files_is_accepted(tmp_path):
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (tmp_path / f"{stem}.gz").write_bytes(b"")
    for stem in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (tmp_path / stem).write_bytes(b"")
    resolved = fjp.validate_config({"dataset": {"data_dir": str(tmp_path)}})
    assert resolved.dataset.data_dir == str(tmp_path)


def test_an_output_location_that_cannot_be_written_fails_before_data_loading(
    tmp_path, no_data_loading
):
    (tmp_path / "file").write_text("")
    config = {"dataset": {"name": "synthetic"}}
    with pytest.raises(fjp.WorkdirError, match=r"cannot write to the workdir .*file/run"):
        fjp.train_and_evaluate(config, str(tmp_path / "file" / "run"))


def test_a_sweep_config_is_not_run_as_one_run(tmp_path, no_data_loading):
    config = fjp.default_config()
    config.sweep = ml_collections.ConfigDict({"seeds": (0, 1)})
    with pytest.raises(fjp.ConfigError, match=r"config\.sweep is set: .*run_sweep"):
        fjp.train_and_evaluate(config, str(tmp_path / "run"))


# -- what a run records is what it used ----------------------------------------------------


def test_keys_that_do_not_apply_resolve_to_none():
    fedavg = fjp.validate_config({"algorithm": {"name": "fedavg", "lam": 0.5}})
    assert fedavg.algorithm.lam is None and fedavg.algorithm.weights is None
    assert fedavg.algorithm.prox_mu is None and fedavg.algorithm.server_lr is None
    assert fedavg.algorithm.target_perturbation is None
    fedpals = fjp.validate_config(fjp.default_config())
    assert fedpals.algorithm.lam == 0.0  # alpha^0 unless lam or ess_fraction is given
    assert fedpals.algorithm.prox_mu is None and fedpals.algorithm.fedrs_alpha is None
    assert fedpals.partition.dirichlet_beta is None and fedpals.dataset.synthetic_delta is None
    fedprox = fjp.validate_config({"algorithm": {"name": "fedprox", "lam": 2.0}})
    assert fedprox.algorithm.weights == "fedavg" and fedprox.algorithm.lam is None
    assert fedprox.algorithm.prox_mu == 0.01
    combined = fjp.validate_config({"algorithm": {"name": "fedprox", "weights": "fedpals"}})
    assert combined.algorithm.lam == 0.0 and combined.algorithm.prox_mu == 0.01
    by_ess = fjp.validate_config({"algorithm": {"ess_fraction": 0.25}})
    assert by_ess.algorithm.lam is None and by_ess.algorithm.ess_fraction == 0.25


def test_the_synthetic_task_records_its_own_clients_and_the_resolved_model():
    resolved = fjp.validate_config(
        {"dataset": {"name": "synthetic"}, "partition": {"num_clients": 50}}
    )
    assert resolved.partition.num_clients == 3
    assert resolved.partition.scheme is None and resolved.partition.labels_per_client is None
    assert resolved.model == "logistic_regression"
    assert resolved.training.clients_per_round == 2
    assert fjp.validate_config({}).model == "lenet"


def test_participation_resolves_to_a_count():
    resolved = fjp.validate_config(
        {"partition": {"num_clients": 101}, "training": {"client_fraction": 0.1}}
    )
    assert resolved.training.clients_per_round == 10 and resolved.training.client_fraction is None
    assert fjp.validate_config({}).training.clients_per_round == 9
    tiny = fjp.validate_config({"training": {"client_fraction": 0.01}})
    assert tiny.training.clients_per_round == 1


def test_lenient_data_set_spelling_is_recorded_canonically():
    assert fjp.validate_config({"dataset": {"name": "CIFAR-10"}}).dataset.name == "cifar10"


def test_validation_is_idempotent_and_leaves_the_input_alone():
    config = fjp.default_config()
    config.algorithm.name = "fedrs"
    before = copy.deepcopy(config.to_dict())
    resolved = fjp.validate_config(config)
    assert config.to_dict() == before
    assert fjp.validate_config(resolved).to_dict() == resolved.to_dict()


# -- identity ------------------------------------------------------------------------------


def test_the_digest_is_the_runs_identity():
    base = fjp.config_digest(fjp.default_config())
    # Equal runs, differently spelt: equal digests.
    assert fjp.config_digest({"training": {"clients_per_round": 9}}) == base
    assert fjp.config_digest({"algorithm": {"prox_mu": 5.0}}) == base  # fedpals ignores it
    # How rounds execute and where the files are do not change what is computed.
    assert fjp.config_digest({"engine": {"backend": "host_loop", "chunk_size": 8}}) == base
    assert fjp.config_digest({"dataset": {"data_dir": "/elsewhere"}}) == base
    cifar = {"dataset": {"name": "cifar10"}}
    assert fjp.config_digest({"dataset": {"name": "cifar10", "download": True}}) == (
        fjp.config_digest(cifar)
    )
    # Anything else does.
    assert fjp.config_digest({"seed": 1}) != base
    assert fjp.config_digest({"algorithm": {"lam": 0.5}}) != base
    assert fjp.config_digest({"training": {"rounds": 21}}) != base


def test_differences_name_the_keys():
    a = fjp.validate_config({})
    b = fjp.validate_config({"seed": 3, "training": {"rounds": 5}, "engine": {"chunk_size": 2}})
    assert fjp.experiment.config.config_differences(a, b) == ["seed: 0 -> 3", "training.rounds: 20 -> 5"]


def test_the_default_config_file_is_the_schema():
    from config_files import load_config

    assert load_config("default.py").to_dict() == fjp.default_config().to_dict()
    assert fjp.validate_config(load_config("default.py")).dataset.name == "fashion_mnist"


def test_both_sparsity_schemes_take_c_and_the_paper_reading_is_sparsity(monkeypatch):
    import numpy as np

    rng = np.random.default_rng(0)
    labels = lambda n: rng.permutation(np.repeat(np.arange(10), n)).astype(np.int32)
    train = fjp.LabeledSplit(np.zeros((600, 28, 28, 1), np.float32), labels(60))
    test = fjp.LabeledSplit(np.zeros((600, 28, 28, 1), np.float32), labels(60))
    dataset = fjp.Dataset("random", train, test, 10, "test")
    monkeypatch.setattr(task_lib, "_load_dataset", lambda name, registered, options: dataset)
    for scheme, function in [
        ("sparsity", fjp.sparsity_partition),
        ("niid_bench_sparsity", fjp.niid_bench_sparsity_partition),
    ]:
        resolved = fjp.validate_config({"partition": {"scheme": scheme}, "seed": 2})
        assert resolved.partition.labels_per_client == 3
        assert resolved.partition.dirichlet_beta is None
        _, partition = task_lib.load_data(resolved)
        want = function(train.y, test.y, num_clients=10, labels_per_client=3, seed=2)
        np.testing.assert_array_equal(partition.client_label_counts, want.client_label_counts)
        np.testing.assert_array_equal(partition.client_indices, want.client_indices)
    assert fjp.config_digest({"partition": {"scheme": "niid_bench_sparsity"}}) != (
        fjp.config_digest({})
    )
    assert fjp.validate_config({"model": "lenet_nobias"}).model == "lenet_nobias"


def test_a_change_of_meaning_changes_every_digest(monkeypatch):
    from fedjax_pals.experiment import config as config_lib

    config = fjp.validate_config(fjp.default_config())
    before = fjp.config_digest(config)
    monkeypatch.setattr(config_lib, "SEMANTICS_VERSION", config_lib.SEMANTICS_VERSION + 1)
    assert fjp.config_digest(config) != before
    assert config_lib.config_identity(config)["semantics"] == config_lib.SEMANTICS_VERSION


def test_config_resolves_the_new_keys_and_keeps_old_digests():
    base = fjp.validate_config(fjp.default_config())
    for key in ("feddisco_a", "feddisco_b", "feddisco_metric", "fedlc_tau", "label_dp_epsilon"):
        assert base.algorithm[key] is None
    # Unused new keys are not part of the identity: the runs recorded before them keep digests.
    identity = fjp.experiment.config.config_identity(base)
    assert "feddisco_a" not in identity["algorithm"]
    assert "fedlc_tau" not in identity["algorithm"]
    disco = fjp.validate_config(
        {"algorithm": {"name": "feddisco", "feddisco_a": 1.0, "feddisco_metric": "l2"}}
    )
    assert (disco.algorithm.feddisco_a, disco.algorithm.feddisco_b) == (1.0, 0.1)
    assert disco.algorithm.target_perturbation == 0.0 and disco.algorithm.lam is None
    lc = fjp.validate_config({"algorithm": {"name": "fedlc", "weights": "fedpals"}})
    assert lc.algorithm.fedlc_tau == 1.0 and lc.algorithm.lam == 0.0
    assert fjp.config_digest({"algorithm": {"name": "fedlc", "fedlc_tau": 0.5}}) != (
        fjp.config_digest({"algorithm": {"name": "fedlc", "fedlc_tau": 1.0}})
    )
    bad = [
        ({"algorithm": {"name": "feddisco", "feddisco_metric": "cos"}}, "feddisco_metric"),
        ({"algorithm": {"name": "feddisco", "feddisco_a": -1.0}}, "feddisco_a must be"),
        ({"algorithm": {"name": "feddisco", "weights": "fedpals"}}, "weights='fedpals'"),
        ({"algorithm": {"name": "fedlc", "fedlc_tau": None}}, "fedlc_tau is None"),
    ]
    for config, match in bad:
        with pytest.raises(fjp.ConfigError, match=match):
            fjp.validate_config(config)


def _every_method_key():
    from fedjax_pals.algorithms import registry
    from fedjax_pals.algorithms.server_optimizers import SERVER_OPTIMIZER_LABELS

    keys = list(registry.method_keys())
    keys += [registry.server_optimizer_key(o, k)
             for o in SERVER_OPTIMIZER_LABELS
             for k in ("fedavg", "fedpals", "fedprox", "fedrs", "fedprox_fedpals")]
    return keys


@pytest.mark.parametrize("key", _every_method_key())
def test_every_method_key_is_an_algorithm_name_that_resolves_as_the_sweep_does(key):
    # Variants, <method>_fedpals and server-optimiser prefixes: accepted in any config (its
    # defaults included, e.g. lam_schedule='fixed' beside fedpals_adaptive), and the run is
    # the one a sweep naming the key runs.
    from fedjax_pals.experiment import sweep as sweep_lib

    base = fjp.default_config()
    base.dataset.name = "synthetic"
    base.algorithm.lam = 0.1  # > 0: adaptive lambda's start
    from fedjax_pals.algorithms import registry

    if "server.optimizer" in registry.method_overrides(key):
        base.server.learning_rate = 0.5  # the server optimiser's step
    config = copy.deepcopy(base)
    config.algorithm.name = key
    resolved = fjp.validate_config(config)
    base.sweep = ml_collections.ConfigDict(dict(seeds=(0,), methods=(key,)))
    ((run,), _) = sweep_lib._runs(base)
    assert resolved.to_dict() == run.resolved
    assert fjp.config_digest(config) == run.digest
    # The key a run records (hparams' "method", its title) is the key it was given.
    assert fjp.resolve_config(config).method == key


@pytest.mark.parametrize("key, path, value, meant", [
    ("fedprox_fedpals", "algorithm.weights", "fedavg", "fedpals"),
    ("fedadam_fedpals", "server.optimizer", "fedyogi", "fedadam"),
])
def test_a_method_key_contradicted_by_a_key_set_to_another_value_is_refused(
    key, path, value, meant
):
    config = fjp.default_config()
    config.algorithm.name = key
    section, leaf = path.split(".")
    config[section][leaf] = value
    with pytest.raises(fjp.ConfigError, match=rf"means {path}='{meant}', but "
                       rf"{path}='{value}' is set too"):
        fjp.validate_config(config)


def test_a_resolved_config_holds_the_digest_and_the_method_key_it_was_given():
    from fedjax_pals.algorithms import registry

    config = {"dataset": {"name": "synthetic"}, "algorithm": {"name": "fedprox_fedpals"}}
    resolved = fjp.resolve_config(config)
    assert resolved.digest == fjp.config_digest(config)
    assert resolved.config.to_dict() == resolved.plain == fjp.validate_config(config).to_dict()
    assert (resolved.method, resolved.imports) == ("fedprox_fedpals", None)
    assert resolved.label == registry.method_label("fedprox_fedpals")
    assert fjp.resolve_config(resolved) is resolved  # taken as it is, not resolved again
    # Read from the resolved config (MethodKey.of_settings), whatever the spelling: fedprox
    # under FedPALS' weights.
    spelled = {"name": "fedprox", "weights": "fedpals"}
    assert fjp.resolve_config({**config, "algorithm": spelled}).method == "fedprox_fedpals"
    # Two keys that mean the same run (a user's variant with a built-in's settings): the run
    # is named by the key it was given.
    fjp.register_variant(fjp.Variant("fedpals_again", "FedPALS (again)", "fedpals", {}))
    # A user's variant that sets keys to their defaults besides a built-in's (as
    # configs/beyond_unknown_target.py's unknown_t_bbse_in_sample): no more specific than it.
    in_sample = {"algorithm.target_estimation": "bbse", "algorithm.target_holdout": 0.0,
                 "algorithm.target_damping": 1.0}
    fjp.register_variant(fjp.Variant("bbse_again", "BBSE (again)", "fedpals", in_sample))
    try:
        again = fjp.resolve_config({**config, "algorithm": {"name": "fedpals_again"}})
        assert again.method == "fedpals_again"
        assert fjp.resolve_config({**config, "algorithm": {"name": "fedpals"}}).method == "fedpals"
        for key in ("fedpals_unknown_t_bbse", "bbse_again"):
            named = {**config, "algorithm": {"name": key, "lam": 0.1}}
            assert fjp.resolve_config(named).method == key
        # Spelled out, no variant was given: the run is named by its method (a variant is
        # what the config was given, never searched for among the registered ones).
        spelled = {"name": "fedpals", "target_estimation": "bbse", "lam": 0.1}
        assert fjp.resolve_config({**config, "algorithm": spelled}).method == "fedpals"
    finally:
        registry._VARIANTS.pop("fedpals_again")
        registry._VARIANTS.pop("bbse_again")
    with pytest.raises(fjp.ConfigError, match="config.sweep is set"):
        fjp.resolve_config({**config, "sweep": {"seeds": (0, 1)}})
