"""MethodKey: a method key as a value (parse, label, overrides, defaults) and the key a resolved
config was built from (`MethodKey.of`), read rather than searched."""

import dataclasses

import pytest

import fedjax_pals as fjp
from fedjax_pals.algorithms import registry
from fedjax_pals.experiment import train as train_lib
from fedjax_pals.algorithms.server_optimizers import SERVER_OPTIMIZER_LABELS

MethodKey = fjp.MethodKey


def _every_key():
    keys = list(registry.method_keys())
    keys += [registry.server_optimizer_key(optimizer, key)
             for optimizer in SERVER_OPTIMIZER_LABELS for key in registry.method_keys()]
    return keys


def _config(key):
    config = {"dataset": {"name": "synthetic"}, "algorithm": {"name": key, "lam": 0.1}}
    if "server.optimizer" in MethodKey.parse(key).overrides:
        config["server"] = {"learning_rate": 0.5}
    return config


@pytest.mark.parametrize("key", _every_key())
def test_every_key_parses_to_its_parts_and_back(key):
    parsed = MethodKey.parse(key)
    assert str(parsed) == parsed.key == key
    assert MethodKey.parse(parsed.key) == parsed
    # Its parts are what it means: the overrides name its method, lender and optimiser.
    overrides = parsed.overrides
    assert overrides["algorithm.name"] == parsed.method
    if parsed.variant is None:
        assert overrides["algorithm.weights"] == parsed.lender
    assert overrides.get("server.optimizer") == parsed.optimizer
    variant = registry._VARIANTS.get(parsed.variant)
    assert parsed.defaults == (dict(variant.defaults) if variant else {})
    # The label is built from the parts' labels: "FedAdam+FedProx+FedPALS".
    parts = []
    if parsed.optimizer is not None:
        parts.append(SERVER_OPTIMIZER_LABELS[parsed.optimizer])
    if variant is not None:
        parts.append(variant.label)
    elif not (parsed.optimizer and parsed.method == "fedavg" and parsed.lender is None):
        parts.append(registry.get_method(parsed.method).label)
        if parsed.lender is not None:
            parts.append(registry.get_method(parsed.lender).label)
    assert parsed.label == "+".join(parts) == fjp.method_label(key)
    # The public functions are the value's.
    assert registry.method_overrides(key) == overrides
    assert registry.method_defaults(key) == parsed.defaults


def test_examples_of_parsed_keys():
    assert MethodKey.parse("fedadam_fedprox_fedpals") == MethodKey(
        "fedprox", lender="fedpals", optimizer="fedadam")
    assert MethodKey.parse("fedadam_fedprox_fedpals").label == "FedAdam+FedProx+FedPALS"
    assert MethodKey.parse("fedadam") == MethodKey("fedavg", optimizer="fedadam")
    assert MethodKey.parse("fedadam").label == "FedAdam"
    adaptive = MethodKey.parse("fedpals_adaptive")
    assert (adaptive.method, adaptive.variant) == ("fedpals", "fedpals_adaptive")
    assert adaptive.overrides["algorithm.lam_schedule"] == "hypergradient"
    assert adaptive.defaults == {"algorithm.ess_fraction": 0.5, "algorithm.lam": None}
    for bad in ("fedpalz", "scaffold_fedpals", 3):
        with pytest.raises(ValueError):
            MethodKey.parse(bad)
    assert fjp.method_label("not_registered") == "not_registered"  # a record of a user's key


@pytest.mark.parametrize("key", _every_key())
def test_a_resolved_config_is_of_the_key_it_was_given(key):
    try:
        resolved = fjp.resolve_config(_config(key))
    except fjp.ConfigError as error:
        # A server optimiser in front of a method that owns its server update: refused.
        assert MethodKey.parse(key).optimizer and "server" in str(error), error
        return
    assert MethodKey.of(resolved) == resolved.key == MethodKey.parse(key)
    assert (resolved.method, resolved.label) == (key, MethodKey.parse(key).label)


def test_of_reads_the_key_it_was_built_from_even_where_another_key_means_the_same_run():
    # Keys registered before the one given, with the same settings (a user's variant that
    # copies a built-in's, registered first in the search order of method_keys() for its
    # method's variants): a search taking the first or the most specific match would name
    # the run by one of them; `of` reads the key the config was given.
    copies = [
        fjp.Variant("fedpals_again", "FedPALS (again)", "fedpals", {}),
        fjp.Variant("prox_again", "FedProx (again)", "fedprox",
                    {"algorithm.weights": "fedpals"}),
        fjp.Variant("bbse_again", "BBSE (again)", "fedpals",
                    {"algorithm.target_estimation": "bbse", "algorithm.target_holdout": 0.0,
                     "algorithm.target_damping": 1.0}),
    ]
    for variant in copies:
        fjp.register_variant(variant)
    try:
        for key in ("fedpals", "fedpals_again", "fedprox_fedpals", "prox_again",
                    "fedpals_unknown_t_bbse", "bbse_again", "fedadam_fedpals_again"):
            resolved = fjp.resolve_config(_config(key))
            assert MethodKey.of(resolved) == MethodKey.parse(key), key
            assert resolved.method == key
        # Spelled out: the parts the config sets, no variant (none was given).
        spelled = {"dataset": {"name": "synthetic"}, "server": {"optimizer": "fedadam"},
                   "algorithm": {"name": "fedprox", "weights": "fedpals"}}
        assert MethodKey.of(fjp.resolve_config(spelled)) == MethodKey(
            "fedprox", "fedpals", "fedadam")
        bbse = {"dataset": {"name": "synthetic"},
                "algorithm": {"name": "fedpals", "target_estimation": "bbse", "lam": 0.1}}
        assert fjp.resolve_config(bbse).method == "fedpals"
    finally:
        for variant in copies:
            registry._VARIANTS.pop(variant.name)
    with pytest.raises(TypeError, match="ResolvedConfig"):
        MethodKey.of({"algorithm": {"name": "fedpals"}})


def test_a_sweep_run_records_the_key_the_sweep_names():
    plain = fjp.validate_config(_config("fedadam_fedpals_unknown_t_bbse")).to_dict()
    resolved = fjp.experiment.config.resolved_config_of(plain, "fedadam_fedpals_unknown_t_bbse")
    assert resolved.key == MethodKey("fedpals", None, "fedadam", "fedpals_unknown_t_bbse")
    # A named key that is no variant of the resolved method: the resolved parts, no variant.
    assert fjp.experiment.config.resolved_config_of(plain, "fedprox_fedpals").key == (
        MethodKey("fedpals", None, "fedadam"))
    assert dataclasses.replace(resolved.key, variant=None).label == "FedAdam+FedPALS"


def test_the_progress_line_and_header_name_the_method_and_data_set_by_their_labels(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(train_lib, "dataset_label", lambda name: "Gaussian blobs")
    config = _config("fedadam_fedpals") | {"training": {"rounds": 2, "eval_every": 1}}
    prepared = train_lib._PreparedRun(config, str(tmp_path), overwrite=False, quiet=False)
    try:
        assert prepared.progress.line().startswith("FedAdam+FedPALS seed 0: round 0/2")
    finally:
        prepared.stack.close()
    header = capsys.readouterr().err.splitlines()[0]
    assert header.startswith("Gaussian blobs: FedAdam+FedPALS on synthetic label shift"), header
