"""Data sets and partition schemes through their registries: a user's own scheme and data set
(registered from outside the package) run by train_and_evaluate and the protocol's sweep, the
natural partition of a data set that comes with client ids, and the identity of recorded runs
kept."""

import dataclasses

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import config as config_lib, task as task_lib

K, DIM = 4, 6


def _blobs(n, rng, means):
    y = rng.integers(0, K, size=n).astype(np.int32)
    return fjp.LabeledSplit((means[y] + rng.normal(size=(n, DIM))).astype(np.float32), y)


def _register_writers(name="writers", num_ids=5, declared_ids=5, spread=1.0):
    """600 training examples of 5 writers, each writing mostly two of the K classes."""

    def load(writers_spread):
        rng = np.random.default_rng(1)
        means = rng.normal(scale=3.0 * writers_spread, size=(K, DIM))
        ids = np.repeat(np.arange(num_ids), 600 // num_ids)
        y = ((ids + rng.integers(0, 2, size=ids.size)) % K).astype(np.int32)
        train = fjp.LabeledSplit((means[y] + rng.normal(size=(y.size, DIM))).astype(np.float32), y)
        source = f"spread {writers_spread}"
        return fjp.Dataset(name, train, _blobs(800, rng, means), K, source, client_ids=ids)

    @dataclasses.dataclass(frozen=True)
    class Spread(fjp.Hyperparameters):  # config key dataset.writers_spread
        writers_spread: float = fjp.hyperparameter(spread, low=0.0, low_open=True)

    fjp.register_dataset(name, load, num_classes=K, num_train=600, images=False,
                         label="Writers", hyperparameters=Spread, num_client_ids=declared_ids)


@dataclasses.dataclass(frozen=True)
class OneClassTarget(fjp.Hyperparameters):  # config key partition.target_class
    target_class: int = fjp.hyperparameter(0, kind="integer", low=0)


def _one_class_target(values, context):
    """The training clients share every class equally; the target holds one class."""
    train, test = context.dataset.train.y, context.dataset.test.y
    available = np.bincount(train, minlength=K)
    counts = np.zeros((context.num_clients, K), np.int64)
    counts[:-1] = available // (2 * (context.num_clients - 1))
    counts[-1, values.target_class] = available[values.target_class] // 2
    return fjp.partition_from_label_counts(
        train, test, counts, seed=context.seed, description="one-class target", num_classes=K
    )


def _fit(values, dataset):
    if values.target_class >= dataset.num_classes:
        raise ValueError(f"target_class must be < {dataset.num_classes}, got {values.target_class}")


def _register_one_class_target():
    scheme = fjp.Partition("one_class_target", _one_class_target, OneClassTarget, _fit)
    fjp.register_partition(scheme)


def _config(**partition):
    config = fjp.default_config()
    config.dataset.name, config.model = "writers", "logistic_regression"
    config.partition.update(partition)
    config.training.rounds, config.training.batch_size = 2, 16
    return config


def test_a_user_scheme_and_data_set_resolve_validate_and_keep_recorded_digests(registries_restored):
    _register_writers()
    _register_one_class_target()
    config = _config(scheme="one_class_target", num_clients=4, target_class=2)
    resolved = fjp.validate_config(config)
    p = resolved.partition
    assert (p.scheme, p.num_clients, p.target_class) == ("one_class_target", 4, 2)
    assert p.labels_per_client is None and p.dirichlet_beta is None and p.target_client is None
    assert resolved.dataset.writers_spread == 1.0
    identity = config_lib.config_identity(resolved)
    assert identity["partition"]["target_class"] == 2
    assert "target_client" not in identity["partition"]
    with pytest.raises(fjp.ConfigError, match=r"config\.partition\.target_class must be < 4"):
        fjp.validate_config(_config(scheme="one_class_target", target_class=7))
    config.dataset.writers_spread = -1.0
    with pytest.raises(fjp.ConfigError, match=r"config\.dataset\.writers_spread must be a finite"):
        fjp.validate_config(config)
    # Other runs: the new keys resolve to None, out of their identity; recorded digests stand.
    default = fjp.validate_config({})
    assert default.partition.target_class is None and default.dataset.writers_spread is None
    assert fjp.config_digest({"algorithm": {"name": "fedpals"}}) == "1fca9d43b02ac476"
    assert fjp.config_digest({"algorithm": {"name": "fedavg"}}) == "1fc3103cacfb13c3"
    # The scheme draws what its builder says, and the loader got dataset.writers_spread.
    dataset, partition = task_lib.load_data(resolved)
    assert partition.num_clients == 3 and partition.target_label_dist[2] == 1.0
    assert dataset.source == "spread 1.0"


def test_a_partition_is_refused_at_registration_when_its_keys_do_not_fit(registries_restored):
    @dataclasses.dataclass(frozen=True)
    class Plain(fjp.Hyperparameters):
        target_class: int = 0

    with pytest.raises(TypeError, match="partition scheme 'plain': hyperparameter 'target_class'"):
        fjp.Partition("plain", _one_class_target, Plain)

    @dataclasses.dataclass(frozen=True)
    class OtherC(fjp.Hyperparameters):
        labels_per_client: int = fjp.hyperparameter(2, kind="integer", low=1)

    with pytest.raises(ValueError, match="declared differently by partition scheme 'sparsity'"):
        fjp.register_partition(fjp.Partition("other_c", _one_class_target, OtherC))

    @dataclasses.dataclass(frozen=True)
    class Clients(fjp.Hyperparameters):
        num_clients: int = fjp.hyperparameter(2, kind="integer", low=2)

    with pytest.raises(ValueError, match=r"\['num_clients'\] are config keys of partition"):
        fjp.register_partition(fjp.Partition("clients", _one_class_target, Clients))
    with pytest.raises(ValueError, match="'dirichlet' is already registered"):
        fjp.register_partition(fjp.Partition("dirichlet", _one_class_target))
    assert "other_c" not in fjp.data.registered_partitions()

    @dataclasses.dataclass(frozen=True)
    class Delta(fjp.Hyperparameters):  # a data set's key: one declaration too
        synthetic_delta: float = fjp.hyperparameter(0.1)

    with pytest.raises(ValueError, match="declared differently by data set 'synthetic'"):
        fjp.register_dataset("delta", lambda synthetic_delta: None, num_classes=2, num_train=9,
                             images=False, hyperparameters=Delta)
    assert "delta" not in fjp.data.registered_datasets()


def test_the_natural_partition_makes_one_client_per_client_id(registries_restored):
    _register_writers()
    resolved = fjp.validate_config(_config(scheme="natural", target_client=2, num_clients=50))
    assert resolved.partition.num_clients == 5 and resolved.training.clients_per_round == 4
    assert resolved.partition.target_client == 2 and resolved.partition.labels_per_client is None
    dataset, partition = task_lib.load_data(resolved)
    ids = dataset.client_ids
    for i, writer in enumerate((0, 1, 3, 4)):  # id order, the target left out
        assert sorted(partition.client_example_indices(i)) == np.flatnonzero(ids == writer).tolist()
    assert sorted(partition.target_val_indices) == np.flatnonzero(ids == 2).tolist()
    target_counts = np.bincount(dataset.train.y[ids == 2], minlength=K)
    np.testing.assert_allclose(partition.target_label_dist, target_counts / target_counts.sum())
    assert "natural, client id 2 the target, 5 clients" in partition.description
    # The same function, as a library call; another seed draws another order, not other clients.
    direct = fjp.natural_partition(dataset.train.y, dataset.test.y, ids, target_client=2, seed=0)
    np.testing.assert_array_equal(direct.client_indices, partition.client_indices)

    with pytest.raises(fjp.ConfigError, match=r"config\.partition\.target_client must be an "
                       r"integer in \[0, 4\] \(a client id\), got 5"):
        fjp.validate_config(_config(scheme="natural", target_client=5))
    with pytest.raises(fjp.ConfigError, match=r"config\.partition\.scheme='natural' makes one "
                       "client per client id, but data set 'fashion_mnist' is registered without"):
        fjp.validate_config({"partition": {"scheme": "natural"}})


def test_client_ids_other_than_registered_are_refused_before_training(registries_restored):
    _register_writers(name="four_writers", num_ids=4, declared_ids=5)
    config = _config(scheme="natural")
    config.dataset.name = "four_writers"
    with pytest.raises(fjp.TaskError, match="registered with num_client_ids=5, but its loader "
                       "returned one with 4 client ids"):
        fjp.build_task(config)
    with pytest.raises(ValueError, match="one of G >= 2 ids 0, ..., G-1, each id held by an"):
        labels = np.zeros(3, int)
        fjp.natural_partition(labels, labels, [0, 2, 2], target_client=0, seed=0)
    with pytest.raises(ValueError, match="client_ids must be 3 integers"):
        split = fjp.LabeledSplit(np.zeros((3, 2)), np.zeros(3, np.int32))
        fjp.Dataset("gap", split, split, 1, "test", client_ids=np.zeros(2, int))


@pytest.mark.integration
def test_the_natural_partition_and_a_user_scheme_train_and_run_the_protocol(
    registries_restored, tmp_path
):
    _register_writers()
    _register_one_class_target()
    results = fjp.train_and_evaluate(
        _config(scheme="natural", target_client=1), tmp_path / "natural", quiet=True
    )
    assert len(results["rounds"]) == 2 and results["config"]["partition"]["num_clients"] == 5
    assert results["partition"]["num_clients"] == 4
    config = _config(scheme="one_class_target", num_clients=4, target_class=3)
    config.sweep = dict(seeds=(0,), methods=("fedavg", "fedpals"))
    summary = fjp.run_sweep(config, str(tmp_path / "sweep"), quiet=True)
    assert set(summary["runs"].values()) == {"done"}
    (row,) = summary["table"]["rows"]
    assert row["row"] == "Writers one_class_target target_class=3"
    assert set(row["cells"]) == {"fedavg", "fedpals"}


def _damaged(how):
    """A scheme that builds the one-class-target partition, then damages it `how`."""

    def build(values, context):
        made = _one_class_target(values, context)
        indices = np.array(made.client_indices)
        counts = np.array(made.client_label_counts)
        val = np.array(made.target_val_indices)
        if how == "overlapping clients":
            indices[1, 0] = indices[0, 0]
            counts[1] = np.bincount(context.dataset.train.y[indices[1, : made.client_sizes[1]]],
                                    minlength=K)
        elif how == "a client holds target validation examples":
            indices[0, 0] = val[0]
            counts[0] = np.bincount(context.dataset.train.y[indices[0, : made.client_sizes[0]]],
                                    minlength=K)
        elif how == "an index out of range":
            indices[2, 0] = len(context.dataset.train.y) + 5
        elif how == "a negative index":
            val[0] = -1
        elif how == "counts that are not the labels held":
            counts[0, 0] += 1
            counts[0, 1] -= 1
        return dataclasses.replace(made, client_indices=indices, client_label_counts=counts,
                                   target_val_indices=val)

    return build


@pytest.mark.parametrize("how, message", [
    ("overlapping clients", r"train example \d+ held by both client 0 and client 1"),
    ("a client holds target validation examples",
     r"train example \d+ held by both client 0 and the target's validation set"),
    ("an index out of range", r"the clients' indices holding 605, outside the train split's \[0, 600\)"),
    ("a negative index", r"target_val_indices holding -1, outside"),
    ("counts that are not the labels held", r"client 0's label counts \[.*\], but the labels it "
     r"holds count \[.*\]"),
])
def test_a_user_scheme_that_builds_no_partition_of_the_data_is_refused_naming_it(
    registries_restored, how, message
):
    # JAX's gathers clamp an out-of-range index and NumPy wraps -1; FedPALS' weights read the
    # counts: each of these trained silently before.
    _register_writers()
    fjp.register_partition(fjp.Partition("damaged", _damaged(how), OneClassTarget, _fit))
    with pytest.raises(fjp.TaskError, match=r"partition scheme 'damaged': its build returned "
                       + message):
        fjp.build_task(_config(scheme="damaged", num_clients=5))
    # The undamaged scheme builds.
    _register_one_class_target()
    fjp.build_task(_config(scheme="one_class_target", num_clients=5))


@pytest.mark.parametrize("register, message", [
    (lambda: fjp.register_partition({"name": "x"}), r"register_partition takes a fedjax_pals.Partition, got dict"),
    (lambda: fjp.Partition("x", "not callable"), r"partition scheme 'x': build must be callable"),
    (lambda: fjp.Partition("x", _one_class_target, fit=3), r"partition scheme 'x': fit must be callable"),
    (lambda: fjp.Feature("f", "F", fjp.Hyperparameters, resolve=None),
     r"feature 'f': resolve must be callable"),
    (lambda: fjp.Feature("f", "F", fjp.Hyperparameters, lambda v, f: {}, prepare="x"),
     r"feature 'f': prepare must be callable"),
    (lambda: fjp.engine.register_backend("b", object()), r"backend 'b': factory must be callable"),
    (lambda: fjp.engine.register_backend("b", lambda: None),
     r"backend 'b': factory .* is called with chunk_size, steps_per_call"),
    (lambda: fjp.register_dataset("needs_arg", lambda path: None, num_classes=2, num_train=9,
                                  images=False),
     r"data set 'needs_arg': load \(...\) -> Dataset is called with no arguments, which its "
     r"signature \(path\) does not take"),
])
def test_a_registration_that_would_fail_when_a_run_calls_it_is_refused_when_registered(
    registries_restored, register, message
):
    from fedjax_pals.engine import backends

    before = dict(backends._REGISTRY)
    try:
        with pytest.raises((TypeError, ValueError), match=message):
            register()
    finally:
        backends._REGISTRY.clear()
        backends._REGISTRY.update(before)


def test_a_scheme_or_backend_name_that_is_not_an_identifier_warns_until_0_3(registries_restored):
    # Accepted before 0.2.0: a deprecation warning first, then a refusal (CHANGELOG.md).
    from fedjax_pals.engine import backends

    with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning,
                      match=r"a partition scheme's name must be a Python identifier.*0\.3\.0"):
        fjp.Partition("my scheme", _one_class_target)
    before = dict(backends._REGISTRY)
    try:
        with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning,
                          match=r"a backend's name must be a Python identifier"):
            fjp.engine.register_backend("my-backend", lambda **_: None)
        with pytest.raises(ValueError, match="other than 'auto'"):
            fjp.engine.register_backend("auto", lambda **_: None)
    finally:
        backends._REGISTRY.clear()
        backends._REGISTRY.update(before)
