"""The experiment config: its schema, its validation and its identity digest.

A run is described by an `ml_collections.ConfigDict` (the flax-examples convention: config
files `configs/*.py` with `get_config()`, overridden on the command line with
`--config.training.rounds=5`). `default_config()` is the full schema with its defaults:

    seed                        int >= 0: partition, initialisation, data order, client sampling
    dataset.name                fashion_mnist | cifar10 | synthetic | a registered one
                                (data/datasets.py, fjp.register_dataset)
    dataset.data_dir            None (search the usual places) or a directory holding the data set
    dataset.download            False | True: CIFAR-10 only, download and prepare it with TFDS
                                when no prepared copy exists (needs internet; off by default, so
                                an offline machine fails at once instead of retrying for minutes)
    dataset.synthetic_delta     synthetic task: T_delta = (1-delta)[.5,.25,.25] + delta[0,.5,.5]
                                (a data set's own keys, declared by it; another's resolve to None)
    partition.scheme            sparsity (the paper's "C labels per client", equal counts per
                                label) | niid_bench_sparsity (C labels, each label split evenly
                                among its holders) | dirichlet (p_i ~ Dir_K(beta)) | natural (a
                                client per client id of the data) | a registered one
                                (data/partitions.py, fjp.register_partition)
    partition.num_clients       clients INCLUDING the target (the paper's 10 = 9 training + target)
    partition.labels_per_client C of the sparsity schemes, in [1, K] (a scheme's own keys,
    partition.dirichlet_beta    beta of the Dirichlet scheme, > 0     declared by it; another
    partition.target_client     natural: the target's client id       scheme's resolve to None)
    model                       auto (logistic regression on synthetic, LeNet otherwise) | lenet |
                                lenet_nobias (LeNet without the classifier's bias, FedRS'
                                reference head) | logistic_regression | a registered one
                                (fjp.register_model)
    algorithm.name              a registered method (fjp.registered_methods(): fedavg | fedpals |
                                fedprox | scaffold | afl | fedrs | fedshift | oracle | feddisco |
                                fedlc, and a user's own), or a key that stands for more:
                                <client-side method>_fedpals (its FedPALS-weighted form), a
                                variant (fedpals_adaptive, fedpals_unknown_t_<estimator>), or
                                one of these with a server optimiser in front (fedadam_fedpals
                                sets server.optimizer='fedadam'; a bare fedadam is FedAvg's).
                                The keys such a name means may also be set at their defaults,
                                not to other values
    algorithm.weights           server weights of the client-side methods (fedprox / fedrs /
                                fedshift / fedlc): fedavg | fedpals
    algorithm.lam               FedPALS' lambda of eq. 8 (default 0: the projection of T on Conv(S))
    algorithm.ess_fraction      or: the lambda whose weights have ESS = fraction * N (App. B.3)
    algorithm.target_perturbation  Table 2: FedPALS sees T_p = normalise(T + delta max(eps, 0))
    algorithm.<hyperparameter>  every registered method's own hyperparameters, declared with
                                their defaults and allowed values by the method (registry.py,
                                algorithms/<method>.py): prox_mu (FedProx), server_lr (SCAFFOLD),
                                afl_step (AFL), fedrs_alpha / fedrs_soft (FedRS), feddisco_a /
                                feddisco_b / feddisco_metric (FedDisco), fedlc_tau (FedLC),
                                weights_solver (FedPALS: None, the exact active set, or
                                projected_gradient, the design card's jaxopt solver; one with
                                default None is optional); a key of another method than the
                                run's resolves to None
    algorithm.lam_schedule      fixed (the paper) | hypergradient: FedPALS' lambda starts at lam /
                                ess_fraction (> 0; an ESS fraction out of reach starts at the
                                lower end, 1e-6 N) and follows the target validation loss's
                                hypergradient (algorithms/adaptive_lambda.py)
    algorithm.lam_hyper_lr      the hypergradient's Adam step on log lambda, > 0
    algorithm.target_estimation None (the server knows T) | bbse_constrained | mlls | bbse |
                                bbse_soft | em | em_output_prior | mapls | vrls |
                                mapls_output_prior | vrls_output_prior: T(Y) unknown; FedPALS
                                starts from the clients' aggregate and re-estimates T from the
                                global model as the run trains
                                (unknown_target.py); needs lam (not
                                ess_fraction). A round whose estimate is not identified or whose
                                model fails the gate keeps the current T (results.json:
                                target_estimation_records)
    algorithm.target_estimation_every, target_holdout, target_estimation_rho, target_gate_*,
    target_damping, target_warmup_rounds, target_estimation_model, target_shrinkage
                                how often T is re-estimated, from which share of the clients'
                                examples (default 0: in-sample), the ridge, the gate, T's step,
                                FedAvg's rounds before the first estimate, the model estimated
                                from (the run's, a FedAvg shadow's, or both averaged), the
                                estimate's share of the clients' aggregate
    algorithm.target_estimation_concentration
                                mapls*: the Dirichlet prior's concentration (pseudo-examples;
                                0: EM's MLE); None: MAPLS' adaptive prior learning
    algorithm.target_estimation_entropy_weight
                                vrls*: the entropy weight zeta of its temperature's fit, mean
                                CE - zeta mean H on the source data, in [0, 1]; None: 0.1
    algorithm.label_dp_epsilon  None (the server sees the exact S_i) or epsilon > 0: the server's
                                weights (FedPALS, FedDisco) and the ESS search see S_i released
                                through a DP mechanism on the label counts (privacy.py)
    algorithm.label_dp_mechanism, label_dp_delta: laplace (epsilon-DP) | gaussian ((epsilon,
                                delta)-DP, delta in (0, 1)); replace-one neighbours, n_i public
    training.rounds, local_epochs, batch_size, learning_rate, eval_every
    training.clients_per_round  participants per round out of the num_clients - 1 training
    training.client_fraction    clients (give one of the two; neither = all of them)
    training.client_sampling    None (clients_per_round drawn without replacement) | "poisson":
                                each client a round with probability client_fraction = q,
                                weighted by McMahan et al.'s fixed-denominator estimator
                                (alpha over every client / q); clients_per_round then resolves
                                to the lanes a round runs (poisson_capacity), not given | a
                                registered sampler's name (fjp.register_client_sampler:
                                fedjax_pals/sampling.py), built from clients_per_round
    server.optimizer            sgd (default: theta + eta * weighted mean delta, today's server
                                update at eta = 1) | fedavgm | fedadam | fedyogi | fedadagrad:
                                Reddi et al.'s server optimisers on the weighted mean delta of
                                any weighting (server_optimizers.py) | a registered one
                                (fjp.register_server_optimizer); not with scaffold / afl
    server.learning_rate        the server's eta, > 0
    server.momentum             FedAvgM's momentum, in [0, 1)
    server.b1, b2, tau          FedAdam / FedYogi / FedAdagrad's b1, b2 in [0, 1) (Adagrad: no
                                b2) and tau > 0 (v starts at tau^2)
    evaluation.per_client       False | True: every training client's accuracy on its own held-out
                                examples (data/client_sets.py), at every evaluation: results.json's
                                per_client_accuracy and its summary (mean, median, worst 10 %,
                                std, variance, n_i-weighted mean)
    evaluation.client_val_fraction  the share of each class a client holds kept out of its
                                training as its validation set, in [0, 1) (default 0.1)
    evaluation.client_test_size each client's test examples, >= 1 (default 100): drawn from the
                                test split with its S_i, or at most this many of its own
    evaluation.client_as_target None | j: the run's target is training client j (T = S_j, its
                                validation and test sets the client's own); a sweep's
                                sweep.each_client sets it for every client
    evaluation.personalization  None | a tuple of fine_tuning, ditto, local (or a registered one,
                                fjp.register_personalization): after training, each client's
                                personalised model (personalization.py), its steps and learning
                                rate (ditto: its lambda) chosen on its validation set
    evaluation.fine_tuning_steps, fine_tuning_learning_rates, ditto_lams, local_steps
                                their grids (the learning rates default to training.learning_rate
                                and a tenth of it)
    engine.backend, engine.chunk_size   how rounds execute (not part of the run's identity)
    engine.runs_per_program     int >= 1 (default 16): at most this many runs that can share a
                                compiled program train together on the runs axis (sweeps,
                                `train_and_evaluate_many`); 1 trains each run alone. Not part of
                                the run's identity, nor of a sharded sweep's split (blocks of 16)

`validate_config(config)` checks every value (type, range, consistency) without touching any data,
in well under a second, and returns the *resolved* config: what the run really uses. Keys that do
not apply to the run are None (lam for FedAvg, prox_mu for FedPALS, the partition keys of the
synthetic task, ...), the synthetic task's fixed client count replaces num_clients, 'auto' model is
resolved, and clients_per_round is the resolved count. A run records this resolved config, so it
never claims a setting it did not use.

`config_digest(config)` hashes the resolved config's identity: every key except `engine` (how rounds
execute does not change what is computed), `dataset.data_dir` and `dataset.download` (where the
files are and how they got there do not change the data set; results.json records the source).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import glob
import hashlib
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np
from ml_collections import config_dict

from fedjax_pals import _validation, extensions, models
from fedjax_pals import sampling as sampling_lib
from fedjax_pals.data import datasets as datasets_lib, partitions as partitions_lib

# The method registry, with the methods that ship with the package registered.
from fedjax_pals import algorithms  # noqa: F401  (registers the built-in methods and features)
from fedjax_pals.algorithms import registry
from fedjax_pals.algorithms.base import fedavg_weighting
from fedjax_pals.hyperparameters import (
    hyperparameter_checks, hyperparameter_defaults, per_run_fields,
)
from fedjax_pals.personalization import registered_personalizations
from fedjax_pals.algorithms.server_optimizers import registered_server_optimizers

# Keys added after runs had been recorded: left out of a run's identity when they are None
# (unused), so that the digests of the runs recorded before them stay valid.
OPTIONAL_IDENTITY_KEYS = (
    "server.optimizer", "server.learning_rate", "server.momentum", "server.b1", "server.b2",
    "server.tau", "training.client_sampling",
)
# The built-in client samplers' names (`fedjax_pals.sampling`; a user's registers its own).
CLIENT_SAMPLINGS = ("without_replacement", "poisson")
# Sections added after runs had been recorded: left out of a run's identity when every key in
# them is None (the plain weighted average: `server` resolves to all None).
OPTIONAL_IDENTITY_SECTIONS = ("server", "evaluation")
# FedAvg's weights n_i / N: algorithm.weights of a client-side method without FedPALS'.
_FEDAVG_WEIGHTS = fedavg_weighting().name
# The data sets' and partition schemes' keys that were config keys before their registries: in
# a run's identity even when None. Every other one (target_client, a user's) is left out when
# None, so that registering one keeps the digests of recorded runs.
ALWAYS_IDENTITY_DATA_KEYS = (
    "dataset.synthetic_delta", "partition.labels_per_client", "partition.dirichlet_beta"
)
# At most this many runs share one compiled program on the engine's runs axis, unless
# `engine.runs_per_program` says otherwise.
RUNS_PER_PROGRAM = 16
# Keys that are not part of a run's identity (see the module docstring).
NON_IDENTITY_KEYS = ("engine", "dataset.data_dir", "dataset.download")


# The schema's own per-run key: the seed's draws (partition, initialisation, data order,
# client sampling) are data in each run's state.
PER_RUN_CONFIG_KEYS = ("seed", "evaluation.client_as_target")


def per_run_state_keys() -> tuple[str, ...]:
    """Keys of a resolved config that are per-run state: the engine holds what they set (the
    seed's draws; every method's and feature's hyperparameter declared `per_run=True`:
    lambda, solved on the host, the perturbed T, the label-DP release, FedDisco's a and b) as
    data in each run's state, not in its compiled program, so runs that differ only in them
    train together on the engine's runs axis (`training.training_group_key` decides). They
    stay in the run's identity."""
    declared = [f.per_run_keys for f in registry.registered_features()]
    declared += [per_run_fields(registry.get_method(m).hyperparameters)
                 for m in registry.registered_methods()]
    keys = dict.fromkeys(f"algorithm.{k}" for keys in declared for k in keys)
    return PER_RUN_CONFIG_KEYS + tuple(keys)


def per_run_state_presence_keys() -> tuple[str, ...]:
    """Of `per_run_state_keys`, those whose being set at all (not None) changes the program:
    a label-DP release wraps the weighting, whose state holds the release; runs without one
    have no such state. Their value is per-run state."""
    features = registry.registered_features()
    return tuple(f"algorithm.{k}" for f in features for k in f.per_run_presence)


# The sections of a config (the rest are top-level values: seed, model).
_SECTIONS = ("dataset", "partition", "algorithm", "training", "server", "evaluation", "engine")

# Personalisation after training (personalization.py), and the grids each chooses from on the
# client's own validation set. Ours: the fine-tuning and local budgets span a few local epochs
# of the paper's clients (600 examples, batch 32: 19 steps an epoch); Ditto's lambda spans the
# range Li et al. (ICML 2021) tune it in.
FINE_TUNING_STEPS = (0, 5, 10, 20, 40)
DITTO_LAMS = (0.01, 0.1, 1.0)
LOCAL_STEPS = (20, 40, 80, 160)

# An upper bound that catches typos (1e9 rounds) before they allocate or loop.
MAX_ROUNDS = 1_000_000


class ConfigError(ValueError):
    """A config value that is missing, of the wrong type, out of range or inconsistent."""


def default_config() -> ml_collections.ConfigDict:
    """The full config schema with its defaults (today's launcher defaults, on Fashion-MNIST).

    The sections are locked: a misspelt key (`config.training.round = 5`) raises at once. The
    top level stays open so that a sweep config can add `config.sweep`.
    """
    placeholder = config_dict.placeholder
    config = ml_collections.ConfigDict()
    config.seed = 0
    # The registered data sets' and schemes' keys, at their defaults (data/datasets.py, ...).
    config.dataset = ml_collections.ConfigDict(
        dict(
            name=datasets_lib.DEFAULT_DATASET, data_dir=placeholder(str), download=False,
            **{key: spec[0] for key, spec in datasets_lib.dataset_fields().items()},
        )
    )
    config.partition = ml_collections.ConfigDict(
        dict(
            scheme=partitions_lib.DEFAULT_SCHEME, num_clients=10,
            **{key: spec[0] for key, spec in partitions_lib.partition_fields().items()},
        )
    )
    config.model = "auto"
    # The registered features' and methods' hyperparameters at their defaults (registry.py);
    # a None default is a placeholder of the type its values have (for command-line overrides).
    keys = {key: (default, check) for key, (default, check, _) in _algorithm_keys().items()}
    types = {"real": float, "integer": int, "bool": bool, "choice": str}
    config.algorithm = ml_collections.ConfigDict(
        dict(
            name=registry.DEFAULT_METHOD,
            weights=placeholder(str),
            **{
                key: default if default is not None or getattr(check, "kind", None) not in types
                else placeholder(types[check.kind])
                for key, (default, check) in keys.items()
            },
        )
    )
    config.training = ml_collections.ConfigDict(
        dict(
            rounds=20,
            local_epochs=1,
            batch_size=32,
            learning_rate=0.1,
            clients_per_round=placeholder(int),
            client_fraction=placeholder(float),
            client_sampling=placeholder(str),
            eval_every=1,
        )
    )
    config.server = ml_collections.ConfigDict(
        dict(optimizer="sgd", learning_rate=1.0, momentum=0.9, b1=0.9, b2=0.99, tau=1e-3)
    )
    config.evaluation = ml_collections.ConfigDict(
        dict(
            per_client=False,
            client_val_fraction=0.1,
            client_test_size=100,
            client_as_target=placeholder(int),
            personalization=placeholder(tuple),
            fine_tuning_steps=FINE_TUNING_STEPS,
            fine_tuning_learning_rates=placeholder(tuple),
            ditto_lams=DITTO_LAMS,
            local_steps=LOCAL_STEPS,
        )
    )
    config.engine = ml_collections.ConfigDict(
        dict(backend="auto", chunk_size=64, runs_per_program=RUNS_PER_PROGRAM)
    )
    for section in _SECTIONS:
        config[section].lock()
    return config


# -- conversion -------------------------------------------------------------------------------


def as_dict(config: Any) -> dict:
    """A ConfigDict, a `ResolvedConfig` or a nested mapping as plain nested dicts
    (FieldReferences resolved)."""
    if isinstance(config, ResolvedConfig):
        return copy.deepcopy(config.plain)
    if isinstance(config, ml_collections.ConfigDict):
        return config.to_dict()
    if isinstance(config, Mapping):
        return {k: as_dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
    raise ConfigError(
        f"config must be an ml_collections.ConfigDict or a mapping, got {type(config).__name__}."
    )


def _unknown_key(path: str, key: Any, known) -> ConfigError:
    close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(
        f"config{path}.{key} is not a known key{hint}; the keys of config{path} are "
        f"{sorted(known)}."
    )


def _merge(schema: dict, given: dict, path: str = "") -> dict:
    """`given` laid over `schema`: a partial mapping keeps the defaults of the keys it omits."""
    merged = dict(schema)
    for key, value in given.items():
        if key not in schema:
            if path == "" and key == "sweep":
                continue  # a sweep's axes: expanded by run_sweep, not part of a run
            raise _unknown_key(path, key, schema)
        if isinstance(schema[key], dict):
            if hasattr(value, "to_dict"):
                value = value.to_dict()
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"config{path}.{key} must be a section (a mapping with keys "
                    f"{sorted(schema[key])}), got {value!r}."
                )
            merged[key] = _merge(schema[key], dict(value), f"{path}.{key}")
        else:
            merged[key] = value
    return merged


# -- value checks (each names the key path, the bad value and what is allowed) -----------------


def _config_check(check, path: str, *args, **kwargs):
    """`check(f"config.{path}", ...)` from `_validation`, its ValueError as a ConfigError."""
    try:
        return check(f"config.{path}", *args, **kwargs)
    except ValueError as error:
        raise ConfigError(str(error)) from None


# The `_validation` checks on a key path: _int(path, value, low, high=None, why=""),
# _real(path, value, **bounds), _bool(path, value), _choice(path, value, choices, optional=).
_int = functools.partial(_config_check, _validation.check_integer)
_real = functools.partial(_config_check, _validation.check_number)
_bool = functools.partial(_config_check, _validation.check_bool)
_choice = functools.partial(_config_check, _validation.check_choice)


def _maybe(check, path: str, value: Any, *args, **kwargs):
    """`check(path, value, ...)`, or None for None (a key that may not apply to the run)."""
    return None if value is None else check(path, value, *args, **kwargs)


def _dataset_name(value: Any) -> str:
    # Lenient spelling, as `load_dataset`: "CIFAR-10", "Fashion-MNIST".
    names = tuple(datasets_lib.registered_datasets())
    found = datasets_lib.canonical_dataset_name(value, names)
    return found or _choice("dataset.name", value, names)


def _check_data_dir(dataset: Any, data_dir: Any, download: bool) -> str:
    """An explicit data_dir must hold the data set: checked by a few stat calls, no loading."""
    if not isinstance(data_dir, (str, os.PathLike)) or not str(data_dir):
        raise ConfigError(
            f"config.dataset.data_dir must be None or a directory path, got {data_dir!r}."
        )
    path = os.path.abspath(os.path.expanduser(os.fspath(data_dir)))
    if not os.path.isdir(path) and not (dataset.reads_file and os.path.isfile(path)):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise ConfigError(
            f"config.dataset.data_dir={path} {what}; give the directory that holds "
            f"{dataset.name}, or leave data_dir unset (None) to search the usual places."
        )
    if dataset.check_data_dir is not None and not download:  # the data set's own file checks
        try:
            dataset.check_data_dir(pathlib.Path(path))
        except ValueError as error:
            raise ConfigError(f"config.dataset.data_dir={path} {error}") from None
    return path


def _described(info: Any, data_dir: Any, keys: dict, check_paths: bool) -> Any:
    """The registration of a reader with the facts of its files at `data_dir` (a few cheap
    reads, cached per path, file size and time: a sweep describes them once)."""
    if data_dir is None:
        if info.default_data_dir is None:
            raise ConfigError(
                f"config.dataset.data_dir is None, but data set {info.name!r} is read from files: "
                f"give the {'file or ' * info.reads_file}directory that holds them "
                "(docs/guide/natural_data.md says how to get each format)."
            )
        data_dir = info.default_data_dir()
    values = info.hyperparameters(**{k: keys[k] for k in hyperparameter_defaults(info.hyperparameters)})
    path = os.path.abspath(os.path.expanduser(os.fspath(data_dir)))
    try:
        facts = _describe_cached(info, path, _files_key(path), values)
    except OSError as error:
        if not check_paths:
            return info
        if info.default_data_dir is not None:  # its own message says how to get the data
            try:
                info.describe(pathlib.Path(path), values)
            except (datasets_lib.DatasetUnavailableError, ValueError) as unavailable:
                raise ConfigError(f"config.dataset.data_dir: {unavailable}") from None
        raise ConfigError(f"config.dataset.data_dir={path}: {error.strerror or error}.") from None
    except (datasets_lib.DatasetUnavailableError, ValueError) as error:
        raise ConfigError(f"config.dataset.data_dir={path}: {error}") from None
    return info.with_facts(facts)


def _files_key(path: str) -> tuple:
    """The sizes and times of `path` and the files up to two levels below it (a LEAF
    directory's train/*.json): files written anew are described anew."""
    stat = os.stat(path)
    key = [(path, stat.st_size, stat.st_mtime_ns)]
    if os.path.isdir(path):
        for entry in sorted(glob.glob(os.path.join(path, "*")) + glob.glob(
                os.path.join(path, "*", "*"))):
            try:
                st = os.stat(entry)
            except OSError:
                continue
            key.append((entry, st.st_size, st.st_mtime_ns))
    return tuple(key)


@functools.lru_cache(maxsize=16)
def _describe_cached(info: Any, path: str, files: tuple, values: Any) -> Any:
    del files  # a key only
    return info.describe(pathlib.Path(path), values)


def _registered_keys(section: str, given: dict, fields: dict, owner: str | None) -> dict:
    """The keys that registered data sets or schemes declare in `section`: each checked by its
    declaration (None for the owner's, the run's, when it needs a value), None unless `owner`
    declares it."""
    values = {}
    for key, (default, check, users) in fields.items():
        value = given[key]
        if value is not None or (owner in users and default is not None):
            value = _config_check(check, f"{section}.{key}", value)
        values[key] = value if owner in users else None
    return values


# -- validation and resolution ----------------------------------------------------------------


def validate_config(config: Any) -> ml_collections.ConfigDict:
    """Checks every value of `config` and returns the resolved config the run will use.

    No data is read (an explicit `dataset.data_dir` is checked with a few `stat` calls), so a
    bad config fails in milliseconds, before data loading, partitioning, the lambda search or
    training. A partial mapping is laid over `default_config()`. A top-level `sweep` section
    is ignored (it is expanded by `run_sweep`) and is not part of the result.

    Returns:
      A new ConfigDict with every key of the schema: validated, normalised (canonical data set
      name, floats as float) and resolved (keys that do not apply set to None; see the module
      docstring).

    Raises:
      ConfigError (a ValueError): the first bad value, naming its key path, the value and the
        allowed values.
    """
    return _validate(config, check_paths=True)


def _method_key_overrides(c: dict, defaults: dict) -> dict:
    """algorithm.name given as a method key that stands for more (`fedprox_fedpals`, a variant
    such as `fedpals_adaptive`, a server optimiser in front: `fedadam_fedpals`): the keys it
    means, laid over the config. A key that the config holds at its default is no
    contradiction (every config holds the defaults: lam_schedule='fixed' beside
    fedpals_adaptive's 'hypergradient'); another value is. Then the settings the key brings
    (`Variant.defaults`: fedpals_adaptive's starting ESS), where the config leaves all of them
    open. `defaults`: `default_config()` as nested dicts."""
    name = c["algorithm"]["name"]
    if not isinstance(name, str) or name in registry.registered_methods():
        return c
    try:
        method_key = registry.MethodKey.parse(name)
    except ValueError:
        return c  # not a method key: _choice names the problem, with the registered methods
    overrides = method_key.overrides
    c = {**c, "algorithm": dict(c["algorithm"]), "server": dict(c["server"])}
    defaults = flatten(defaults)
    for path, value in overrides.items():
        section, _, key = path.partition(".")
        given = c[section].get(key)
        if value is None or key == "name":
            c[section][key] = value if key == "name" else given
            continue
        if given is not None and given != value and given != defaults.get(path):
            raise ConfigError(
                f"config.algorithm.name={name!r} means {path}={value!r}, but {path}={given!r} "
                "is set too; give one of them."
            )
        c[section][key] = value
    brought = method_key.defaults
    if all(c[p.partition(".")[0]].get(p.partition(".")[2]) in (None, defaults.get(p))
           for p in brought):
        for path, value in brought.items():
            section, _, key = path.partition(".")
            if value is not None:
                c[section][key] = value
    return c


def _validate(config: Any, *, check_paths: bool) -> ml_collections.ConfigDict:
    try:  # a feature's after= naming a feature that no imported module registered
        registry.registered_features()
    except ValueError as error:
        raise ConfigError(str(error)) from None
    defaults = default_config().to_dict()
    c = _method_key_overrides(_merge(defaults, as_dict(config)), defaults)
    r: dict[str, Any] = {}
    r["seed"] = _int("seed", c["seed"], 0, 2**32 - 1)

    r["dataset"], r["partition"], info = _data_sections(c, check_paths)

    # -- model
    model = _choice("model", c["model"], ("auto",) + tuple(sorted(models.registered_models())))
    if model == "auto":
        model = info.model or ("lenet" if info.images else "logistic_regression")
    if models.model_needs_images(model) and not info.images:
        raise ConfigError(
            f"config.model={model!r} needs image inputs, but dataset {info.name!r} has 2-D "
            "feature vectors; use 'logistic_regression' or 'auto'."
        )
    r["model"] = model

    r["training"] = _training_section(c["training"], r["partition"]["num_clients"] - 1)
    # -- algorithm (its features may check themselves against the run's rounds and clients)
    r["algorithm"], owner = _algorithm_section(
        c["algorithm"], r["training"], r["partition"]["num_clients"] - 1)

    r["server"] = _server_section(c["server"], owner)
    r["evaluation"] = _evaluation_section(
        c["evaluation"], r["partition"]["num_clients"] - 1, r["training"]["learning_rate"])

    # -- engine
    from fedjax_pals.engine import backend_names  # registered ones too (`register_backend`)

    e = c["engine"]
    r["engine"] = dict(
        backend=_choice("engine.backend", e["backend"], ("auto",) + backend_names()),
        chunk_size=_int("engine.chunk_size", e["chunk_size"], 1),
        runs_per_program=_int("engine.runs_per_program", e["runs_per_program"], 1),
    )

    resolved = ml_collections.ConfigDict(r)
    for section in _SECTIONS:
        resolved[section].lock()
    return resolved


def _data_sections(c: dict, check_paths: bool) -> tuple[dict, dict, Any]:
    """The resolved `dataset` and `partition` sections and the data set's registration
    (data/datasets.py, data/partitions.py)."""
    d, p = c["dataset"], c["partition"]
    name = _dataset_name(d["name"])
    info = datasets_lib.registered_datasets()[name]
    own_clients = info.num_clients is not None  # its own partition: no scheme applies
    dataset_keys = _registered_keys("dataset", d, datasets_lib.dataset_fields(), name)
    download = _bool("dataset.download", d.get("download", False))
    if download and not info.download:
        them = [n for n, x in datasets_lib.registered_datasets().items() if x.download]
        raise ConfigError(
            f"config.dataset.download=True applies to {', '.join(them)} only (the data sets "
            f"that download themselves); {name} is read from local files."
        )
    data_dir = d["data_dir"]
    if own_clients:
        data_dir = None
    elif data_dir is not None and check_paths:
        data_dir = _check_data_dir(info, data_dir, download)
    dataset = dict(name=name, data_dir=data_dir, download=download, **dataset_keys)
    if info.describe is not None:  # a reader: the facts come from its files
        info = _described(info, data_dir, dataset_keys, check_paths)

    schemes = partitions_lib.registered_partitions()
    scheme = _choice("partition.scheme", p["scheme"], tuple(schemes), optional=own_clients)
    fields = partitions_lib.partition_fields()
    keys = _registered_keys("partition", p, fields, None if own_clients else scheme)
    fixed = None  # the clients a scheme fixes itself (natural: one per client id)
    if own_clients:  # the synthetic task's (App. C.4): record what the run uses
        scheme, fixed = None, info.num_clients
    elif schemes[scheme].fit is not None:  # its values against the data set; natural's count
        try:
            fixed = schemes[scheme].fit(schemes[scheme].values(keys), info)
        except ValueError as error:
            raise ConfigError(f"config.partition.{error}") from None
    num_clients = fixed or _maybe(
        _int,
        "partition.num_clients",
        p["num_clients"],
        2,
        info.num_train,
        why=" (it counts the target client too; at most the training examples)",
    )
    if num_clients is None:
        raise ConfigError("config.partition.num_clients is None; give the number of clients.")
    return dataset, dict(scheme=scheme, num_clients=num_clients, **keys), info


def _training_section(t: dict, training_clients: int) -> dict:
    """The resolved `training` section (clients_per_round: the resolved count; under Poisson
    sampling the lanes, with client_fraction q kept)."""
    rounds = _int("training.rounds", t["rounds"], 1, MAX_ROUNDS)
    count, fraction = t["clients_per_round"], t["client_fraction"]
    sampling = _choice("training.client_sampling", t.get("client_sampling"),
                       sampling_lib.registered_client_samplers(), optional=True)
    if sampling == "poisson":
        return _poisson_training_section(t, training_clients, rounds)
    if count is not None:
        count = _int(
            "training.clients_per_round",
            count,
            1,
            training_clients,
            why=f" (the {training_clients} training clients; the target does not train)",
        )
    if fraction is not None:
        fraction = _real("training.client_fraction", fraction, low=0.0, high=1.0, low_open=True)
    if count is not None and fraction is not None:
        raise ConfigError(
            f"config.training.clients_per_round={count} and config.training.client_fraction="
            f"{fraction:g} are both set; give one of them, not both."
        )
    if fraction is not None:
        count = max(1, int(round(fraction * training_clients)))
    count = training_clients if count is None else count
    if sampling not in (None, "without_replacement"):
        # A user's sampler, built from the resolved count: its lanes are the participants.
        checked = dict(t, clients_per_round=count, client_fraction=fraction)
        try:
            sampler = sampling_lib.sampler_for(checked, training_clients)
            lanes = sampler.lanes(training_clients)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"config.training.client_sampling={sampling!r}: {error}") from None
        if isinstance(lanes, bool) or not isinstance(lanes, (int, np.integer)) or not (
                1 <= lanes <= training_clients):
            raise ConfigError(
                f"config.training.client_sampling={sampling!r}: its lanes({training_clients}) "
                f"is {lanes!r}, not a number of lanes in [1, {training_clients}].")
        # The count, not the lanes, is recorded: the task rebuilds the sampler from it (a
        # resolved section resolves to itself), and the sampler says its lanes.
        return _local_training(t, rounds, clients_per_round=count, client_fraction=None,
                               client_sampling=sampling)
    return _local_training(
        t, rounds, clients_per_round=count, client_fraction=None, client_sampling=None,
    )


def sampling_rate(training: Mapping[str, Any]) -> float | None:
    """Poisson sampling's q of a resolved `training` section, None without it."""
    if training.get("client_sampling") == "poisson":
        return float(training["client_fraction"])
    return None


def _poisson_training_section(t: dict, training_clients: int, rounds: int) -> dict:
    """Poisson sampling's `training` section: q from client_fraction, the lanes resolved (a
    resolved section's own lanes are accepted: validation is idempotent)."""
    from fedjax_pals.training import poisson_capacity  # the loop's, without a cycle

    if t["client_fraction"] is None:
        raise ConfigError(
            "config.training.client_sampling='poisson' needs training.client_fraction, the "
            "probability q in (0, 1] with which each client takes part in a round."
        )
    rate = _real("training.client_fraction", t["client_fraction"], low=0.0, high=1.0,
                 low_open=True)
    lanes = poisson_capacity(training_clients, rate)
    if t["clients_per_round"] not in (None, lanes):
        raise ConfigError(
            f"config.training.clients_per_round={t['clients_per_round']!r} is set, but "
            "training.client_sampling='poisson' draws each client with probability "
            "training.client_fraction: give the rate, not a count (the lanes a round runs, "
            f"here {lanes}, are resolved from it)."
        )
    return _local_training(
        t, rounds, clients_per_round=lanes, client_fraction=rate, client_sampling="poisson",
    )


def _local_training(t: dict, rounds: int, **participation) -> dict:
    return dict(
        rounds=rounds,
        local_epochs=_int("training.local_epochs", t["local_epochs"], 1, 10_000),
        batch_size=_int("training.batch_size", t["batch_size"], 1, 1_000_000),
        learning_rate=_real("training.learning_rate", t["learning_rate"], low=0.0, low_open=True),
        **participation,
        eval_every=_int(
            "training.eval_every",
            t["eval_every"],
            1,
            rounds,
            why=f" (training.rounds={rounds}; the last round is always evaluated)",
        ),
    )


def _algorithm_keys() -> dict:
    """{key under algorithm.: (default, check, owners)} of the registered features and methods."""
    fields = {
        key: (default, check, (feature.name,))
        for feature in registry.registered_features()
        for key, default in hyperparameter_defaults(feature.hyperparameters).items()
        for check in (hyperparameter_checks(feature.hyperparameters)[key],)
    }
    return {**fields, **registry.hyperparameter_fields()}


def _weights(a: dict, method: registry.Method) -> str | None:
    """algorithm.weights resolved: FedAvg's ("fedavg") or a lending method's weights for a
    client-side method, None for a method with weights of its own."""
    lenders = {m: registry.get_method(m) for m in registry.registered_methods()}
    lenders = {name: m for name, m in lenders.items() if m.lends_weighting}
    fedavg = registry.method_label(_FEDAVG_WEIGHTS)
    choices = (_FEDAVG_WEIGHTS,) + tuple(lenders)
    weights = _choice("algorithm.weights", a["weights"], choices, optional=True)
    if method.lends_weighting and weights not in (None, method.name):
        raise ConfigError(
            f"config.algorithm.weights={weights!r} contradicts algorithm.name={method.name!r} "
            f"({method.label} weights); use algorithm.name={weights!r} for {fedavg}."
        )
    if weights in lenders and not (method.client_side or method.name == weights):
        raise ConfigError(
            f"config.algorithm.weights={weights!r} applies only to "
            f"{list(registry.client_side_methods())} (client-side methods); {method.name!r} has "
            f"its own server weights. Use algorithm.name={weights!r} for {lenders[weights].label}."
        )
    return (weights or _FEDAVG_WEIGHTS) if method.client_side else None


def _algorithm_section(
    a: dict, training: dict | None = None, training_clients: int | None = None
) -> tuple[dict, str | None]:
    """The resolved `algorithm` section, and what owns the run's server update (for the
    server optimiser's check: "algorithm.name='scaffold'", "lam_schedule='hypergradient'")
    or None. The method's and the features' keys are checked by their own declarations
    (registry.py) and resolved by their owners: None where the run does not use them."""
    algorithm = _choice("algorithm.name", a["name"], registry.registered_methods())
    method = registry.get_method(algorithm)
    weights = _weights(a, method)
    lending = method.name if method.lends_weighting else weights
    section = {
        key: None if a[key] is None else _config_check(check, f"algorithm.{key}", a[key])
        for key, (_, check, _) in _algorithm_keys().items()
    }
    facts = registry.RunFacts(
        method, None if lending == _FEDAVG_WEIGHTS else lending, section,
        rounds=None if training is None else training["rounds"],
        training_clients=training_clients,
        clients_per_round=None if training is None else training["clients_per_round"],
        sampling_rate=None if training is None else sampling_rate(training),
        sampler=None if training is None or training_clients is None else
        sampling_lib.sampler_for(training, training_clients),
    )
    resolved = dict(name=algorithm, weights=weights)
    # The registered methods' hyperparameters: None (unused) unless the run's method's, or
    # those of the method whose weights it borrows (fedprox_fedpals: FedPALS' weights_solver).
    for key, (default, _, users) in registry.hyperparameter_fields().items():
        used = algorithm in users or lending in users
        # A hyperparameter declared with default None is optional (FedPALS' weights_solver).
        if used and section[key] is None and default is not None:
            raise ConfigError(f"config.algorithm.{key} is None, but {algorithm} needs it.")
        resolved[key] = section[key] if used else None
    owner = f"algorithm.name={algorithm!r}" if method.owns_server_update else None
    for feature in registry.registered_features():
        try:
            resolved.update(feature.resolve_section(facts))
        except ConfigError:
            raise
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if feature.owns_server_update and feature.settings(resolved) is not None:
            owner = owner or feature.switched_on_by(resolved)
    if owner is not None and facts.sampling_rate is not None:
        raise ConfigError(
            f"config.training.client_sampling='poisson', but {owner} brings a server update of "
            "its own: Poisson sampling's fixed-denominator estimator is a weighted sum of the "
            "drawn clients' updates, which only the plain weighted average (or a server "
            "optimiser after it) computes."
        )
    return resolved, owner


def _server_section(s: dict, owner: str | None) -> dict:
    """The resolved `server` section: all None for the plain weighted average (sgd, eta = 1)."""
    # None: a resolved config's plain weighted average (validation is idempotent).
    optimizers = registered_server_optimizers()
    optimizer = _choice("server.optimizer", s["optimizer"], tuple(optimizers), optional=True)
    if optimizer is None:
        optimizer = "sgd"
        s = {**s, "learning_rate": 1.0 if s["learning_rate"] is None else s["learning_rate"]}
    positive, decay = dict(low=0.0, low_open=True), dict(low=0.0, high=1.0, high_open=True)
    bounds = dict(learning_rate=positive, momentum=decay, b1=decay, b2=decay, tau=positive)
    values = {key: _maybe(_real, f"server.{key}", s[key], **b) for key, b in bounds.items()}
    used = optimizers[optimizer].keys  # the others resolve to None
    for key in used:
        if values[key] is None:
            raise ConfigError(
                f"config.server.{key} is None, but server.optimizer={optimizer!r} needs it."
            )
    resolved = dict(optimizer=optimizer, **{k: v if k in used else None for k, v in values.items()})
    if optimizer == "sgd" and values["learning_rate"] == 1.0:
        return {key: None for key in resolved}  # today's server update: not part of the identity
    if owner is not None:
        raise ConfigError(
            f"config.server.optimizer={optimizer!r} (learning_rate={values['learning_rate']:g}) "
            f"replaces the plain weighted average, but {owner} has a server update of its own; "
            "use server.optimizer='sgd' with learning_rate=1."
        )
    return resolved


def _steps(path: str, value: Any, low: int) -> tuple[int, ...]:
    """A non-empty tuple of increasing integers >= low (a grid of step counts)."""
    if isinstance(value, (list, tuple)) and value:
        steps = tuple(_int(f"{path}[{i}]", v, low) for i, v in enumerate(value))
        if all(a < b for a, b in zip(steps, steps[1:])):
            return steps
    raise ConfigError(
        f"config.{path} must be a non-empty tuple of increasing integers >= {low}, got {value!r}."
    )


def _reals(path: str, value: Any, **bounds) -> tuple[float, ...]:
    if isinstance(value, (list, tuple)) and value:
        values = tuple(float(_real(f"{path}[{i}]", v, **bounds)) for i, v in enumerate(value))
        if len(set(values)) == len(values):
            return values
    raise ConfigError(f"config.{path} must be a non-empty tuple of distinct numbers, got {value!r}.")


def _evaluation_section(e: dict, training_clients: int, learning_rate: float) -> dict:
    """The resolved `evaluation` section: all None without per-client evaluation (not part of
    the identity then); client_as_target and personalization switch it on."""
    target = _maybe(_int, "evaluation.client_as_target", e["client_as_target"], 0,
                    training_clients - 1, why=f" (one of the {training_clients} training clients)")
    wanted = e["personalization"]
    if wanted is not None:
        if isinstance(wanted, str):
            wanted = (wanted,)
        modes = tuple(registered_personalizations())
        if not isinstance(wanted, (list, tuple)) or not wanted:
            raise ConfigError(
                "config.evaluation.personalization must be None or a non-empty tuple of "
                f"{list(modes)} (fjp.register_personalization), got {wanted!r}.")
        wanted = tuple(_choice(f"evaluation.personalization[{i}]", w, modes)
                       for i, w in enumerate(wanted))
        if len(set(wanted)) != len(wanted):
            raise ConfigError(f"config.evaluation.personalization repeats a mode: {wanted}.")
    on = _bool("evaluation.per_client", bool(e["per_client"])) if e["per_client"] is not None \
        else False
    if not (on or target is not None or wanted):
        return {key: None for key in e}
    lrs = e["fine_tuning_learning_rates"]
    lrs = (learning_rate, learning_rate / 10) if lrs is None else lrs
    # The built-in modes' grids, resolved where one uses them; a user's mode (which may read
    # any of them) resolves them all.
    uses = set(wanted or ())
    if uses - {"fine_tuning", "ditto", "local"}:
        uses |= {"fine_tuning", "ditto", "local"}
    return dict(
        per_client=True,
        client_val_fraction=float(_real("evaluation.client_val_fraction",
                                        e["client_val_fraction"], low=0.0, high=1.0,
                                        high_open=True)),
        client_test_size=_int("evaluation.client_test_size", e["client_test_size"], 1),
        client_as_target=target,
        personalization=wanted or None,
        fine_tuning_steps=(_steps("evaluation.fine_tuning_steps", e["fine_tuning_steps"], 0)
                           if uses & {"fine_tuning", "ditto"} else None),
        fine_tuning_learning_rates=(
            _reals("evaluation.fine_tuning_learning_rates", lrs, low=0.0, low_open=True)
            if uses & {"fine_tuning", "local"} else None),
        ditto_lams=(_reals("evaluation.ditto_lams", e["ditto_lams"], low=0.0)
                    if "ditto" in uses else None),
        local_steps=(_steps("evaluation.local_steps", e["local_steps"], 1)
                     if "local" in uses else None),
    )


# -- identity ---------------------------------------------------------------------------------


# Bumped whenever an unchanged config comes to mean another run, so that a workdir or sweep of
# the old meaning is refused rather than resumed. 2: partition.scheme "sparsity" became the
# paper's equal-count partition (the former one is "niid_bench_sparsity").
SEMANTICS_VERSION = 2


def config_identity(config: Any) -> dict:
    """The part of a resolved config that identifies the run: all but `NON_IDENTITY_KEYS`; the
    `OPTIONAL_IDENTITY_KEYS` and registered keys only when set (but `ALWAYS_IDENTITY_DATA_KEYS`
    and the method and feature keys declared `hyperparameter(..., identity_when_unset=True)`:
    those that were config keys before the registry, so that recorded runs' digests stay)."""
    identity = {k: (dict(v) if isinstance(v, dict) else v) for k, v in as_dict(config).items()}
    for key in (*NON_IDENTITY_KEYS, "sweep"):
        section, _, leaf = key.partition(".")
        if leaf:
            identity.get(section, {}).pop(leaf, None)
        else:
            identity.pop(section, None)
    identity["semantics"] = SEMANTICS_VERSION
    optional = {
        *OPTIONAL_IDENTITY_KEYS,
        *(f"dataset.{key}" for key in datasets_lib.dataset_fields()),
        *(f"partition.{key}" for key in partitions_lib.partition_fields()),
        *(f"algorithm.{key}" for key in _algorithm_keys()),
    } - {*ALWAYS_IDENTITY_DATA_KEYS, *registry.identity_when_unset()}
    for key in optional:
        section, _, leaf = key.partition(".")
        if isinstance(identity.get(section), dict) and identity[section].get(leaf, 0) is None:
            identity[section].pop(leaf)
    for section in OPTIONAL_IDENTITY_SECTIONS:
        keys = identity.get(section, None)
        if keys == {} or isinstance(keys, dict) and all(v is None for v in keys.values()):
            identity.pop(section)
    return identity


def config_digest(config: Any) -> str:
    """A 16-hex-digit digest of the run's identity (the resolved config without `engine` and
    `dataset.data_dir`). Pass a resolved config (`validate_config`); an unresolved one is
    resolved first, so equal runs always get equal digests."""
    return resolved_config_digest(_validate(config, check_paths=False))


def resolved_config_digest(resolved: Any) -> str:
    """`config_digest` of a config already resolved, without resolving it again (a sweep
    digests hundreds of runs)."""
    payload = json.dumps(config_identity(resolved), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, eq=False)
class ResolvedConfig:
    """One run's config resolved once (`resolve_config`), with what every part of the run reads
    from it: the workdir its identity, the task its values, the writers its method key.

    Attributes:
      config: `validate_config`'s resolved ConfigDict (locked sections).
      plain: the same as nested dicts (results.json's and hparams.json's "config").
      digest: `config_digest` (the run's identity, 16 hex digits).
      key: the `MethodKey` the config was built from (`MethodKey.of(resolved)`): its method,
        weights and server optimiser as resolved, and the variant the given key named.
      method: `str(key)`, the method key as a sweep names it: "fedprox_fedpals" where
        algorithm.name is "fedprox" with FedPALS' weights, "fedadam_fedpals" under
        server.optimizer="fedadam".
      label: `key.label`, the method's display name ("FedAdam+FedPALS").
      imports: `extensions.imports_record` of the user modules whose registrations the config
        names (None: only built-in ones), which a process restoring the run imports first.
    """

    config: ml_collections.ConfigDict
    plain: dict
    digest: str
    key: registry.MethodKey
    imports: dict | None

    @property
    def method(self) -> str:
        return self.key.key

    @property
    def label(self) -> str:
        return self.key.label


def resolve_config(config: Any) -> ResolvedConfig:
    """`validate_config` of one run's config and what a run derives from it, computed here once
    (ConfigError for a bad config, or for a sweep's: one with a `sweep` section)."""
    if isinstance(config, ResolvedConfig):
        return config
    given = as_dict(config)
    if given.get("sweep"):
        raise ConfigError(
            "config.sweep is set: this config describes a sweep of runs; run it with "
            "fjp.run_sweep (python -m experiments.sweep), or delete config.sweep for one run."
        )
    resolved = _validate(given, check_paths=True)
    return resolved_config_of(resolved.to_dict(), given.get("algorithm", {}).get("name"))


def resolved_config_of(plain: Mapping[str, Any], method: Any = None) -> ResolvedConfig:
    """The `ResolvedConfig` of a config that `validate_config` has resolved already, as nested
    dicts (a sweep's runs: validated once per grid point when the sweep is expanded), not
    validated again. `method`: the method key the run was named by (the config's
    algorithm.name or the sweep's method): the variant it names is recorded, the rest
    is read from the resolved config (`MethodKey.of_settings`)."""
    plain = copy.deepcopy(dict(plain))
    flat = flatten(plain)
    digest = resolved_config_digest(plain)
    config = ml_collections.ConfigDict(plain)
    for section in _SECTIONS:
        config[section].lock()
    key = registry.MethodKey.of_settings(
        flat["algorithm.name"], flat.get("algorithm.weights"), flat.get("server.optimizer"),
        named=method,
    )
    modules = extensions.modules_for(resolved=[flat])
    imports = extensions.imports_record(modules) if modules else None
    return ResolvedConfig(
        config=config, plain=plain, digest=digest, key=key, imports=imports)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings (ConfigDicts included) as one level: `{"a.b": value}`."""
    if hasattr(tree, "to_dict"):  # ml_collections.ConfigDict
        tree = tree.to_dict()
    if isinstance(tree, Mapping):
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: tree}


def _as_recorded(value: Any) -> Any:
    """A config value as a JSON record holds it: a tuple (a grid, evaluation.personalization)
    is a list there, and the same value."""
    if isinstance(value, (list, tuple)):
        return [_as_recorded(v) for v in value]
    return value


def mapping_differences(old: Any, new: Any) -> list[str]:
    """The flattened keys on which two nested mappings differ, as "key: old -> new" lines (a
    tuple and a list of the same values are no difference: results.json records tuples as
    lists)."""
    a, b, missing = flatten(old), flatten(new), "<absent>"
    a = {key: _as_recorded(value) for key, value in a.items()}
    b = {key: _as_recorded(value) for key, value in b.items()}
    return [
        f"{key}: {a.get(key, missing)!r} -> {b.get(key, missing)!r}"
        for key in sorted(set(a) | set(b))
        if a.get(key, missing) != b.get(key, missing)
    ]


def config_differences(old: Any, new: Any) -> list[str]:
    """The identity keys on which two (resolved) configs differ, as "key: old -> new" lines."""
    return mapping_differences(config_identity(old), config_identity(new))
