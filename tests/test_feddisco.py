"""FedDisco: its formula against float64 NumPy (the reference's disco.py), its limits, its
composition with the other pieces, its task and its sweep."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

import fedjax_pals as fjp
from config_files import load_config
from method_testing import run, synthetic, tree_close


def _ref_discrepancy(dists, global_dist, metric):
    """The reference code's disco.py, in float64 (full-support G only for 'kl')."""
    dists = np.asarray(dists, np.float64)
    global_dist = np.asarray(global_dist, np.float64)
    if metric == "l2":
        return np.linalg.norm(dists - global_dist, axis=1)
    kl = special.kl_div(dists, global_dist).sum(axis=1)
    return np.zeros_like(kl) if kl.sum() == 0 else kl / kl.sum()


def _ref_weights(dists, sizes, global_dist, a, b, metric):
    sizes = np.asarray(sizes, np.float64)
    raw = sizes / sizes.sum() - a * _ref_discrepancy(dists, global_dist, metric) + b
    kept = np.maximum(raw, 0.0)
    return kept / kept.sum()


def _problem(seed, m=6, k=5):
    rng = np.random.default_rng(seed)
    dists = rng.dirichlet(np.full(k, 0.5), size=m)
    sizes = rng.integers(10, 500, size=m).astype(np.float64)
    global_dist = rng.dirichlet(np.full(k, 2.0))
    return dists, sizes, global_dist


@pytest.mark.parametrize("metric", ["kl", "l2"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_feddisco_weights_match_the_reference_formula(metric, seed):
    dists, sizes, global_dist = _problem(seed)
    a, b = 0.5, 0.1
    got = fjp.algorithms.feddisco_weights(dists, sizes, global_dist, a, b, metric)
    ref = _ref_weights(dists, sizes, global_dist, a, b, metric)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-7)
    np.testing.assert_allclose(
        fjp.algorithms.feddisco_discrepancy(dists, global_dist, metric),
        _ref_discrepancy(dists, global_dist, metric),
        rtol=2e-5,
        atol=2e-7,
    )
    # Not FedAvg: the discrepancy moves the weights.
    assert np.max(np.abs(np.asarray(got) - sizes / sizes.sum())) > 1e-3


def test_feddisco_limits():
    dists, sizes, global_dist = _problem(3)
    fedavg = sizes / sizes.sum()
    for metric in ("kl", "l2"):
        # a = b = 0: FedAvg.
        np.testing.assert_allclose(
            fjp.algorithms.feddisco_weights(dists, sizes, global_dist, 0.0, 0.0, metric), fedavg, rtol=1e-6
        )
        # S_k = G for every client: d = 0, weights (n/N + b) / (1 + m b): FedAvg iff b = 0.
        same = np.tile(global_dist, (len(sizes), 1))
        b = 0.1
        np.testing.assert_allclose(
            fjp.algorithms.feddisco_weights(same, sizes, global_dist, 5.0, b, metric),
            (fedavg + b) / (1 + len(sizes) * b),
            rtol=1e-6,
        )
        np.testing.assert_allclose(
            fjp.algorithms.feddisco_weights(same, sizes, global_dist, 5.0, 0.0, metric), fedavg, rtol=1e-6
        )
        # Identical client distributions and sizes: uniform for any a, b.
        equal = fjp.algorithms.feddisco_weights(
            np.tile(dists[0], (4, 1)), np.full(4, 7.0), global_dist, 0.7, 0.2, metric
        )
        np.testing.assert_allclose(equal, np.full(4, 0.25), rtol=1e-6)
        # b -> infinity: uniform.
        np.testing.assert_allclose(
            fjp.algorithms.feddisco_weights(dists, sizes, global_dist, 0.5, 1e6, metric),
            np.full(len(sizes), 1 / len(sizes)),
            rtol=1e-5,
        )


def test_feddisco_relu_clips_far_clients_and_falls_back_to_fedavg():
    global_dist = np.array([0.25, 0.25, 0.25, 0.25])
    dists = np.array([[0.25, 0.25, 0.25, 0.25], [0.3, 0.2, 0.3, 0.2], [1.0, 0.0, 0.0, 0.0]])
    sizes = np.array([100.0, 100.0, 100.0])
    a, b = 1.0, 0.05
    # l2 discrepancies [0, 0.2, 0.866]: raw = 1/3 - d + 0.05, the far client's is < 0.
    got = np.asarray(fjp.algorithms.feddisco_weights(dists, sizes, global_dist, a, b, "l2"))
    ref = _ref_weights(dists, sizes, global_dist, a, b, "l2")
    assert got[2] == 0.0 and ref[2] == 0.0
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    # Every ReLU at 0 (b very negative): FedAvg instead of 0 / 0.
    fallback = fjp.algorithms.feddisco_weights(dists, [1.0, 2.0, 5.0], global_dist, a, -10.0, "l2")
    np.testing.assert_allclose(fallback, np.array([1.0, 2.0, 5.0]) / 8.0, rtol=1e-6)


def test_feddisco_kl_off_the_targets_support_is_the_limit_of_smoothed_targets():
    # T puts no mass on class 2 (as sparsity targets do); clients 1 and 2 hold it.
    global_dist = np.array([0.6, 0.4, 0.0])
    dists = np.array([[0.5, 0.5, 0.0], [0.4, 0.4, 0.2], [0.1, 0.3, 0.6]])
    got = np.asarray(fjp.algorithms.feddisco_discrepancy(dists, global_dist, "kl"), np.float64)
    np.testing.assert_allclose(got, [0.0, 0.2 / 0.8, 0.6 / 0.8], rtol=1e-6)
    # Float64 reference: the normalised KL against G_eps = (1 - eps) G + eps / K converges to
    # it as eps -> 0+, with an error O(1 / log(1 / eps)).
    errors = []
    for eps in (1e-10, 1e-30, 1e-300):
        smoothed = (1 - eps) * global_dist + eps / 3
        errors.append(np.max(np.abs(_ref_discrepancy(dists, smoothed, "kl") - got)))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 5.0 / np.log(1e300)
    weights = np.asarray(fjp.algorithms.feddisco_weights(dists, [10.0, 10.0, 10.0], global_dist))
    assert np.all(np.isfinite(weights)) and weights.sum() == pytest.approx(1.0, abs=1e-6)
    assert weights[0] > weights[1] > weights[2]


def test_feddisco_trains_as_fedavg_at_zero_and_keeps_its_data_in_the_state():
    data, partition, model = synthetic()
    target = partition.target_label_dist
    ref, _ = run(fjp.fedavg(), data, model, rounds=2)
    got, _ = run(fjp.feddisco(target, 0.0, 0.0), data, model, rounds=2)
    assert tree_close(got[-1].params, ref[-1].params, atol=1e-6)
    # With a, b > 0: the round's weights are FedDisco's formula over its participants.
    algorithm = fjp.feddisco(target, 0.5, 0.05, "l2")
    full, full_metrics = run(algorithm, data, model, rounds=1)
    expected = _ref_weights(
        partition.client_label_dists, partition.client_sizes, target, 0.5, 0.05, "l2"
    )
    np.testing.assert_allclose(full_metrics[0]["weights"], expected, rtol=1e-5)
    assert not np.allclose(expected, partition.client_sizes / partition.client_sizes.sum())
    assert not tree_close(full[-1].params, ref[1].params, atol=1e-5)
    # Another G, a, b: per-run data in the state, the same compiled round (the runs above
    # compiled everything this round runs).
    counter = fjp.engine.CompilationCounter()
    with counter.track():
        run(fjp.feddisco([0.2, 0.4, 0.4], 1.0, 0.0, "l2"), data, model, rounds=1)
    assert counter.compilations == 0
    assert fjp.algorithms.feddisco_weighting(target).weights is fjp.algorithms.feddisco_weighting([1, 0, 0]).weights


def test_feddisco_validates_its_arguments():
    with pytest.raises(ValueError, match="a must be >= 0"):
        fjp.algorithms.feddisco_weighting([0.5, 0.5], a=-1.0)
    with pytest.raises(ValueError, match="b must be finite"):
        fjp.algorithms.feddisco_weighting([0.5, 0.5], b=float("nan"))
    with pytest.raises(ValueError, match="unknown FedDisco discrepancy metric"):
        fjp.algorithms.feddisco_weighting([0.5, 0.5], metric="cosine")
    with pytest.raises(ValueError, match="must sum to 1"):
        fjp.algorithms.feddisco_weighting([0.5, 0.6])
    bare = fjp.combine(fjp.algorithms.plain_sgd(), fjp.algorithms.feddisco_weighting([0.5, 0.5]))
    state = fjp.init_server_state(bare, {"w": jnp.zeros(1)}, 2)._replace(weighting_state=())
    with pytest.raises(ValueError, match="global_label_dist"):
        bare.weighting.weights(jnp.ones((2, 2)) / 2, jnp.ones(2), state, jnp.arange(2))


def test_a_feddisco_task_weighs_by_its_formula():
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.algorithm.name = "feddisco"
    config.algorithm.feddisco_a = 0.5
    config.algorithm.feddisco_b = 0.05
    config.algorithm.feddisco_metric = "l2"
    task = fjp.build_task(config)
    from fedjax_pals.experiment.task import task_summary

    p = task.partition
    expected = _ref_weights(
        p.client_label_dists, p.client_sizes, p.target_label_dist, 0.5, 0.05, "l2"
    )
    np.testing.assert_allclose(task_summary(task)["alpha"], expected, rtol=1e-5)
    assert not np.allclose(expected, p.client_sizes / p.client_sizes.sum(), atol=1e-3)
    sweep = fjp.expand_sweep(
        {
            **config.to_dict(),
            "sweep": {"seeds": (0,), "methods": ("feddisco", "fedlc", "fedlc_fedpals")},
        }
    )
    assert [name for name, _ in sweep] == [
        "feddisco/seed_0",
        "fedlc/seed_0",
        "fedlc_fedpals/seed_0",
    ]


def test_the_feddisco_fedlc_sweep_validates_and_runs_with_tiny_overrides(tmp_path):
    config = load_config("beyond_feddisco_fedlc.py")
    runs = fjp.expand_sweep(config)
    methods = {name.split("/")[0] for name, _ in runs}
    assert methods == {"feddisco", "fedlc", "fedlc_fedpals"}
    # Per seed: 3 learning rates x (FedDisco 3 a x 2 b, FedLC 3 tau, FedLC+FedPALS 3 tau x 5
    # lambdas); 8 seeds.
    assert len(runs) == 8 * 3 * (6 + 3 + 15)
    assert config.sweep.row == "Fashion-MNIST C=3"  # Table 1's row, for experiments.compare
    # Tiny: the synthetic task, 2 rounds, one seed, one point per grid.
    config.dataset.name = "synthetic"
    config.training.rounds = 2
    config.training.batch_size = 8
    config.sweep.seeds = (0,)
    config.sweep.axes = {}
    config.sweep.figures = ()
    for section, key in (("training", "learning_rate"), ("algorithm", "feddisco_a")):
        config.sweep.grid[section][key] = config.sweep.grid[section][key][:1]
    config.sweep.grid.algorithm.feddisco_b = (0.1,)
    config.sweep.grid.algorithm.fedlc_tau = (1.0,)
    config.sweep.grid.algorithm.ess_fraction = (0.9,)
    outcome = fjp.run_sweep(config, str(tmp_path), quiet=True)
    assert outcome["errors"] == {}
    assert set(outcome["runs"].values()) == {"done"}, outcome["runs"]
    assert len(outcome["runs"]) == 1 + 1 + 2
