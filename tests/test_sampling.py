"""Client samplers as values: the built-in ones draw what the sampling functions draw, and a
user's sampler from docs/extending.md runs through the config, a run and a sweep, with DP on
updates refused for it (no accounting)."""

import dataclasses
import json
import pathlib
import re

import ml_collections
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals import sampling
from fedjax_pals.training import (
    poisson_capacity, sample_participants, sample_poisson_participants,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
RNG = np.random.default_rng()


@pytest.fixture
def samplers_restored():
    saved = dict(sampling._SAMPLERS)
    yield
    sampling._SAMPLERS.clear()
    sampling._SAMPLERS.update(saved)
    fjp.extensions.forget_registration("client_sampler", "cyclic")


def _docs_sampler() -> type:
    """docs/extending.md's my_sampler.py, run as the module it is (it registers 'cyclic')."""
    page = (ROOT / "docs" / "extending.md").read_text()
    block = re.search(r"```python\n(# my_sampler\.py.*?)```", page, re.S).group(1)
    namespace = {"__name__": "my_sampler"}
    exec(compile(block, "docs/extending.md:my_sampler.py", "exec"), namespace)
    return namespace["Cyclic"]


def test_the_built_in_samplers_draw_what_the_sampling_functions_draw():
    m, seed = int(RNG.integers(5, 60)), int(RNG.integers(10**6))
    k, q = int(RNG.integers(1, m)), float(RNG.uniform(0.05, 0.9))
    for r in range(4):
        np.testing.assert_array_equal(fjp.WithoutReplacement(k).draw(seed, r, m),
                                      sample_participants(seed, r, m, k))
        np.testing.assert_array_equal(fjp.EveryClient().draw(seed, r, m), np.arange(m))
        np.testing.assert_array_equal(
            fjp.PoissonSampling(q).draw(seed, r, m),
            sample_poisson_participants(seed, r, m, q, poisson_capacity(m, q)))
    assert fjp.PoissonSampling(q).lanes(m) == poisson_capacity(m, q)
    assert fjp.PoissonSampling(q).accounting(m) == sampling.Accounting(poisson_capacity(m, q), q)
    assert fjp.WithoutReplacement(k).accounting(m) == sampling.Accounting(k)
    # The older arguments name the same samplers.
    assert sampling.participation(None, m) == fjp.EveryClient()
    assert sampling.participation(k, m) == fjp.WithoutReplacement(k)
    assert sampling.participation(None, m, q) == fjp.PoissonSampling(q)


def test_a_config_names_its_sampler_and_the_task_carries_it():
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.client_sampling = "poisson"
    config.training.client_fraction = 0.5
    task = fjp.build_task(config)
    assert task.sampler == fjp.PoissonSampling(0.5) == task.context.sampler
    assert task.sampling_rate == 0.5 and task.clients_per_round == task.sampler.lanes(2)
    config.training.client_sampling = "poisonn"
    with pytest.raises(fjp.ConfigError, match="did you mean 'poisson'"):
        fjp.validate_config(config)


def _cyclic_config(rounds=4):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = rounds
    config.training.client_sampling = "cyclic"
    config.training.clients_per_round = 1
    config.algorithm.name = "fedavg"
    return config


def test_a_users_sampler_from_the_docs_draws_every_round_of_a_run(samplers_restored, tmp_path,
                                                                    capsys):
    cyclic = _docs_sampler()
    assert "cyclic" in fjp.registered_client_samplers()
    config = _cyclic_config()
    task = fjp.build_task(config)
    assert task.sampler == cyclic(1) and task.clients_per_round == 1
    m = task.partition.num_clients
    run = fjp.training.TrainingRun(task.algorithm, task.model, task.dataset, task.partition,
                                   task.training, rounds=4, sampler=task.sampler)
    assert [int(run.participants(r)[0]) for r in range(4)] == [r % m for r in range(4)]
    results = fjp.train_and_evaluate(config, tmp_path / "run")
    assert "client sampling: 1 of 2 clients a round, in a fixed cycle" in capsys.readouterr().err
    assert results["clients_per_round"] == 1 and "sampling_rate" not in results
    assert json.loads((tmp_path / "run" / "hparams.json").read_text())  # the run is recorded
    # A sweep of two seeds trains them in one program, each drawing the cycle.
    sweep = _cyclic_config(rounds=2)
    sweep.sweep = ml_collections.ConfigDict(dict(seeds=(0, 1), methods=("fedavg",)))
    summary = fjp.run_sweep(sweep, str(tmp_path / "sweep"), quiet=True)
    assert set(summary["runs"].values()) == {"done"}, summary["runs"]


def test_a_sampler_with_more_lanes_than_its_count_resolves_to_itself(samplers_restored):
    """The resolved section keeps the count (not the lanes) that the sampler is built from:
    validating it again gives the same section, and the task runs the sampler's lanes."""

    @dataclasses.dataclass(frozen=True)
    class Spare(fjp.ClientSampler):
        clients_per_round: int
        name = "spare"

        def lanes(self, num_clients):
            return 2 * self.clients_per_round

        def draw(self, seed, round_index, num_clients):
            drawn = np.arange(self.clients_per_round, dtype=np.int32)
            return np.concatenate([drawn, np.full(self.clients_per_round, num_clients, np.int32)])

    fjp.register_client_sampler("spare", lambda training, m: Spare(training["clients_per_round"]))
    config = _cyclic_config()
    config.training.client_sampling = "spare"
    resolved = fjp.resolve_config(config)
    assert resolved.config.training.clients_per_round == 1
    assert fjp.resolve_config(resolved).digest == resolved.digest
    assert fjp.build_task(config).clients_per_round == 2


def test_a_sampler_accounted_as_poisson_needs_weights_that_bound_a_clients_weight(
        samplers_restored):
    @dataclasses.dataclass(frozen=True)
    class ClaimsPoisson(fjp.ClientSampler):
        name = "claims_poisson"

        def lanes(self, num_clients):
            return num_clients

        def draw(self, seed, round_index, num_clients):
            return np.arange(num_clients, dtype=np.int32)

        def accounting(self, num_clients):
            return sampling.Accounting(num_clients, 0.5)

    fjp.register_client_sampler("claims_poisson", lambda training, m: ClaimsPoisson())
    config = _cyclic_config()
    config.training.client_sampling = "claims_poisson"
    with pytest.raises(fjp.TaskError, match="accounted as Poisson sampling .* declares no largest "
                       "weight"):
        fjp.build_task(config)


def test_dp_on_updates_is_refused_for_a_sampler_without_accounting(samplers_restored):
    _docs_sampler()
    config = _cyclic_config()
    config.algorithm.dp_clip_norm = 0.5
    config.algorithm.dp_noise_multiplier = 1.0
    with pytest.raises(fjp.ConfigError, match="training.client_sampling='cyclic' has no privacy "
                       "accounting"):
        fjp.validate_config(config)


def test_a_sampler_whose_draw_or_lanes_are_wrong_is_refused(samplers_restored):
    @dataclasses.dataclass(frozen=True)
    class TooMany(fjp.ClientSampler):
        name = "too_many"

        def lanes(self, num_clients):
            return 2

        def draw(self, seed, round_index, num_clients):
            return np.arange(3, dtype=np.int32)

    fjp.register_client_sampler("too_many", lambda training, num_clients: TooMany())
    config = _cyclic_config()
    config.training.client_sampling = "too_many"
    task = fjp.build_task(config)
    run = fjp.training.TrainingRun(task.algorithm, task.model, task.dataset, task.partition,
                                   task.training, rounds=1, sampler=task.sampler)
    with pytest.raises(ValueError, match=r"its draw for round 1 is int32 of shape \(3,\), not 2 "
                       "distinct client ids"):
        run.participants(0)

    @dataclasses.dataclass(frozen=True)
    class Twice(TooMany):
        def draw(self, seed, round_index, num_clients):
            return np.array([0, 0], np.int32)  # one client in two lanes: twice its weight

    run = fjp.training.TrainingRun(task.algorithm, task.model, task.dataset, task.partition,
                                   task.training, rounds=1, sampler=Twice())
    with pytest.raises(ValueError, match="a client in two lanes would weigh twice"):
        run.participants(0)
    fjp.register_client_sampler("too_many", lambda training, num_clients: "x", replace=True)
    with pytest.raises(fjp.ConfigError, match="returned str, not a fedjax_pals.ClientSampler"):
        fjp.validate_config(config)
