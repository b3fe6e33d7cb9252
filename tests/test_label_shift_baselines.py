"""FedDisco and FedLC: their defining formulas against float64 NumPy, their limits, their
composition with the other pieces, and their config keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

import fedjax_pals as fjp
from fedjax_pals import baselines, label_shift_baselines as lsb

LR = 0.1
TRAINING = fjp.LocalTraining(local_epochs=1, batch_size=8, learning_rate=LR)


def _tree_close(a, b, atol=0.0, rtol=0.0):
    return all(
        np.allclose(np.asarray(u), np.asarray(v), atol=atol, rtol=rtol)
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def _tree_equal(a, b):
    return all(
        np.array_equal(np.asarray(u), np.asarray(v))
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def _synthetic():
    dataset, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    data = fjp.engine.device_data(
        dataset.train.x,
        dataset.train.y,
        partition.client_indices,
        partition.client_sizes,
        partition.client_label_dists,
    )
    return data, partition, fjp.logistic_regression((2,), 3)


def _run(algorithm, data, model, *, rounds, participants=None, seed=0):
    num_clients = int(data.client_sizes.shape[0])
    engine = fjp.engine.round_engine(algorithm, model, TRAINING, backend="vmap_scan")
    state = fjp.init_server_state(algorithm, model.init(jax.random.PRNGKey(seed)), num_clients)
    states, metrics = [state], []
    for r in range(rounds):
        who = np.arange(num_clients) if participants is None else participants(r)
        state, m = engine.run_round(
            data,
            state,
            jnp.asarray(who, jnp.int32),
            jax.random.fold_in(jax.random.PRNGKey(seed + 1), r),
        )
        states.append(state)
        metrics.append(m)
    return states, metrics


# -- independent float64 references ------------------------------------------------------------


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


# -- FedDisco -------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", ["kl", "l2"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_feddisco_weights_match_the_reference_formula(metric, seed):
    dists, sizes, global_dist = _problem(seed)
    a, b = 0.5, 0.1
    got = fjp.label_shift_baselines.feddisco_weights(dists, sizes, global_dist, a, b, metric)
    ref = _ref_weights(dists, sizes, global_dist, a, b, metric)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-7)
    np.testing.assert_allclose(
        fjp.label_shift_baselines.feddisco_discrepancy(dists, global_dist, metric),
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
            fjp.label_shift_baselines.feddisco_weights(dists, sizes, global_dist, 0.0, 0.0, metric), fedavg, rtol=1e-6
        )
        # S_k = G for every client: d = 0, weights (n/N + b) / (1 + m b): FedAvg iff b = 0.
        same = np.tile(global_dist, (len(sizes), 1))
        b = 0.1
        np.testing.assert_allclose(
            fjp.label_shift_baselines.feddisco_weights(same, sizes, global_dist, 5.0, b, metric),
            (fedavg + b) / (1 + len(sizes) * b),
            rtol=1e-6,
        )
        np.testing.assert_allclose(
            fjp.label_shift_baselines.feddisco_weights(same, sizes, global_dist, 5.0, 0.0, metric), fedavg, rtol=1e-6
        )
        # Identical client distributions and sizes: uniform for any a, b.
        equal = fjp.label_shift_baselines.feddisco_weights(
            np.tile(dists[0], (4, 1)), np.full(4, 7.0), global_dist, 0.7, 0.2, metric
        )
        np.testing.assert_allclose(equal, np.full(4, 0.25), rtol=1e-6)
        # b -> infinity: uniform.
        np.testing.assert_allclose(
            fjp.label_shift_baselines.feddisco_weights(dists, sizes, global_dist, 0.5, 1e6, metric),
            np.full(len(sizes), 1 / len(sizes)),
            rtol=1e-5,
        )


def test_feddisco_relu_clips_far_clients_and_falls_back_to_fedavg():
    global_dist = np.array([0.25, 0.25, 0.25, 0.25])
    dists = np.array([[0.25, 0.25, 0.25, 0.25], [0.3, 0.2, 0.3, 0.2], [1.0, 0.0, 0.0, 0.0]])
    sizes = np.array([100.0, 100.0, 100.0])
    a, b = 1.0, 0.05
    # l2 discrepancies [0, 0.2, 0.866]: raw = 1/3 - d + 0.05, the far client's is < 0.
    got = np.asarray(fjp.label_shift_baselines.feddisco_weights(dists, sizes, global_dist, a, b, "l2"))
    ref = _ref_weights(dists, sizes, global_dist, a, b, "l2")
    assert got[2] == 0.0 and ref[2] == 0.0
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    # Every ReLU at 0 (b very negative): FedAvg instead of 0 / 0.
    fallback = fjp.label_shift_baselines.feddisco_weights(dists, [1.0, 2.0, 5.0], global_dist, a, -10.0, "l2")
    np.testing.assert_allclose(fallback, np.array([1.0, 2.0, 5.0]) / 8.0, rtol=1e-6)


def test_feddisco_kl_off_the_targets_support_is_the_limit_of_smoothed_targets():
    # T puts no mass on class 2 (as sparsity targets do); clients 1 and 2 hold it.
    global_dist = np.array([0.6, 0.4, 0.0])
    dists = np.array([[0.5, 0.5, 0.0], [0.4, 0.4, 0.2], [0.1, 0.3, 0.6]])
    got = np.asarray(fjp.label_shift_baselines.feddisco_discrepancy(dists, global_dist, "kl"), np.float64)
    np.testing.assert_allclose(got, [0.0, 0.2 / 0.8, 0.6 / 0.8], rtol=1e-6)
    # Float64 reference: the normalised KL against G_eps = (1 - eps) G + eps / K converges to
    # it as eps -> 0+, with an error O(1 / log(1 / eps)).
    errors = []
    for eps in (1e-10, 1e-30, 1e-300):
        smoothed = (1 - eps) * global_dist + eps / 3
        errors.append(np.max(np.abs(_ref_discrepancy(dists, smoothed, "kl") - got)))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 5.0 / np.log(1e300)
    weights = np.asarray(fjp.label_shift_baselines.feddisco_weights(dists, [10.0, 10.0, 10.0], global_dist))
    assert np.all(np.isfinite(weights)) and weights.sum() == pytest.approx(1.0, abs=1e-6)
    assert weights[0] > weights[1] > weights[2]


def test_feddisco_trains_as_fedavg_at_zero_and_keeps_its_data_in_the_state():
    data, partition, model = _synthetic()
    target = partition.target_label_dist
    ref, _ = _run(fjp.fedavg(), data, model, rounds=2)
    got, _ = _run(fjp.feddisco(target, 0.0, 0.0), data, model, rounds=2)
    assert _tree_close(got[-1].params, ref[-1].params, atol=1e-6)
    # With a, b > 0: the round's weights are FedDisco's formula over its participants.
    algorithm = fjp.feddisco(target, 0.5, 0.05, "l2")
    full, full_metrics = _run(algorithm, data, model, rounds=1)
    expected = _ref_weights(
        partition.client_label_dists, partition.client_sizes, target, 0.5, 0.05, "l2"
    )
    np.testing.assert_allclose(full_metrics[0]["weights"], expected, rtol=1e-5)
    assert not np.allclose(expected, partition.client_sizes / partition.client_sizes.sum())
    assert not _tree_close(full[-1].params, ref[1].params, atol=1e-5)
    # Another G, a, b: per-run data in the state, the same compiled round (the runs above
    # compiled everything this round runs).
    counter = fjp.engine.CompilationCounter()
    with counter.track():
        _run(fjp.feddisco([0.2, 0.4, 0.4], 1.0, 0.0, "l2"), data, model, rounds=1)
    assert counter.compilations == 0
    assert fjp.label_shift_baselines.feddisco_weighting(target).weights is fjp.label_shift_baselines.feddisco_weighting([1, 0, 0]).weights


def test_feddisco_validates_its_arguments():
    with pytest.raises(ValueError, match="a must be >= 0"):
        fjp.label_shift_baselines.feddisco_weighting([0.5, 0.5], a=-1.0)
    with pytest.raises(ValueError, match="b must be finite"):
        fjp.label_shift_baselines.feddisco_weighting([0.5, 0.5], b=float("nan"))
    with pytest.raises(ValueError, match="unknown FedDisco discrepancy metric"):
        fjp.label_shift_baselines.feddisco_weighting([0.5, 0.5], metric="cosine")
    with pytest.raises(ValueError, match="must sum to 1"):
        fjp.label_shift_baselines.feddisco_weighting([0.5, 0.6])
    bare = baselines.combine(fjp.algorithms.plain_sgd(), fjp.label_shift_baselines.feddisco_weighting([0.5, 0.5]))
    state = fjp.init_server_state(bare, {"w": jnp.zeros(1)}, 2)._replace(weighting_state=())
    with pytest.raises(ValueError, match="global_label_dist"):
        bare.weighting.weights(jnp.ones((2, 2)) / 2, jnp.ones(2), state, jnp.arange(2))


# -- FedLC ----------------------------------------------------------------------------------------


def _ref_calibrated_loss(logits, counts, labels, tau):
    logits = np.asarray(logits, np.float64)
    shifted = logits - tau * np.maximum(np.asarray(counts, np.float64), 1e-8) ** -0.25
    log_softmax = shifted - special.logsumexp(shifted, axis=1, keepdims=True)
    return -log_softmax[np.arange(len(labels)), labels]


def test_fedlc_calibrates_the_logits_by_the_clients_label_counts():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 4)).astype(np.float32)
    counts = np.array([16.0, 1.0, 0.0, 81.0])
    n = counts.sum()
    tau = 0.7
    info = fjp.ClientInfo(jnp.asarray(counts / n, jnp.float32), jnp.int32(n), ())
    got = fjp.label_shift_baselines.fedlc_client(tau).adjust_logits(jnp.asarray(logits), info, None)
    # tau * n^(-1/4): 16 -> tau/2, 1 -> tau, 0 -> 100 tau (the 1e-8 floor), 81 -> tau/3.
    shifts = tau * np.array([0.5, 1.0, 100.0, 1.0 / 3.0])
    np.testing.assert_allclose(got, logits - shifts, rtol=1e-5, atol=1e-5)
    labels = np.array([0, 1, 3, 3, 0])
    loss = -jax.nn.log_softmax(got)[np.arange(5), labels]
    np.testing.assert_allclose(
        loss, _ref_calibrated_loss(logits, counts, labels, tau), rtol=1e-5, atol=1e-5
    )
    # The pairwise margin: with equal logits a rare label's loss exceeds a frequent one's.
    flat = _ref_calibrated_loss(np.zeros((2, 4)), counts, np.array([1, 3]), tau)
    assert flat[0] > flat[1]
    np.testing.assert_array_equal(
        fjp.label_shift_baselines.fedlc_calibrated_logits(logits, counts, 0.0), logits
    )  # tau = 0: untouched


def test_fedlc_with_tau_zero_equals_fedavg_and_composes_with_server_weightings():
    data, partition, model = _synthetic()
    ref, _ = _run(fjp.fedavg(), data, model, rounds=2)
    got, _ = _run(fjp.fedlc(0.0), data, model, rounds=2)
    assert _tree_equal(got[-1].params, ref[-1].params)
    moved, _ = _run(fjp.fedlc(1.0), data, model, rounds=2)
    assert not _tree_close(moved[-1].params, ref[-1].params, atol=1e-5)
    # FedLC's client with FedPALS' or FedDisco's weights.
    target = partition.target_label_dist
    pals = fjp.fedlc(1.0, fjp.fedpals_weighting(target, 0.0))
    assert pals.name == "fedlc+fedpals" and pals.client is fjp.label_shift_baselines.fedlc_client(1.0)
    _, metrics = _run(pals, data, model, rounds=1)
    np.testing.assert_allclose(
        metrics[0]["weights"],
        fjp.fedpals_weights(partition.client_label_dists, target, partition.client_sizes, 0.0),
        atol=1e-6,
    )
    disco = baselines.combine(fjp.label_shift_baselines.fedlc_client(1.0), fjp.label_shift_baselines.feddisco_weighting(target, 1.0, 0.0))
    _, metrics = _run(disco, data, model, rounds=1)
    np.testing.assert_allclose(
        metrics[0]["weights"],
        _ref_weights(partition.client_label_dists, partition.client_sizes, target, 1.0, 0.0, "kl"),
        rtol=1e-5,
    )
    assert fjp.feddisco(target, client_method=fjp.label_shift_baselines.fedlc_client(1.0)).name == "fedlc(tau=1)+feddisco"
    with pytest.raises(ValueError, match="tau must be >= 0"):
        fjp.label_shift_baselines.fedlc_client(-0.1)


# -- registry and config ------------------------------------------------------------------------


def test_make_algorithm_builds_feddisco_and_fedlc():
    _, partition = fjp.synthetic_label_shift_task(0.5, seed=0)
    disco = fjp.make_algorithm(
        "feddisco", partition=partition, feddisco_a=0.3, feddisco_b=0.0, feddisco_metric="l2"
    )
    assert disco.weighting.weights is lsb._feddisco_weights_fn("l2")
    state = fjp.init_server_state(disco, {"w": jnp.zeros(1)}, partition.num_clients)
    np.testing.assert_allclose(
        state.weighting_state["global_label_dist"], partition.target_label_dist
    )
    assert float(state.weighting_state["a"]) == pytest.approx(0.3)
    lc = fjp.make_algorithm(
        "fedlc", fedlc_tau=0.5, weights="fedpals", partition=partition, lam=0.0
    )
    assert lc.name == "fedlc_fedpals" and lc.client is fjp.label_shift_baselines.fedlc_client(0.5)
    for kwargs in (
        dict(name="feddisco"),
        dict(name="feddisco", partition=partition, weights="fedpals", lam=0.0),
        dict(name="feddisco", partition=partition, feddisco_a=-1.0),
        dict(name="fedlc", fedlc_tau=-1.0),
    ):
        with pytest.raises(ValueError):
            fjp.make_algorithm(**kwargs)


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


def _load_config(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("beyond_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_the_feddisco_fedlc_sweep_validates_and_runs_with_tiny_overrides(tmp_path):
    config = _load_config("configs/beyond_feddisco_fedlc.py")
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
