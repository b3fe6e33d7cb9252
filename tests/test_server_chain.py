"""The server chain: links in declared order, the bound the weighting declares, a user's noise
link from docs/extending.md under Poisson sampling, server optimisers after the links, and
client-side clipping (the server never receives a raw update)."""

import dataclasses
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import fedjax_pals as fjp
from fedjax_pals.algorithms import poisson_sampling, private_updates, server_chain
from fedjax_pals.algorithms.base import ClientOutputs

ROOT = pathlib.Path(__file__).resolve().parents[1]
RNG = np.random.default_rng()


def _docs_links() -> dict:
    """The link classes of docs/extending.md's my_noise.py (up to its registration, which would
    add config keys to this process)."""
    page = (ROOT / "docs" / "extending.md").read_text()
    block = re.search(r"```python\n(# my_noise\.py.*?)```", page, re.S).group(1)
    links = block.split("# -- registered")[0]
    namespace: dict = {}
    exec(compile(links, "docs/extending.md:my_noise.py", "exec"), namespace)
    return namespace


@dataclasses.dataclass(frozen=True)
class _Tag(fjp.ServerLink):
    """A link that records, in the order the links run, its name (at trace time)."""

    slot: str = "transform"
    name: str = ""

    def __call__(self, state, updates):
        _ORDER.append(self.name)
        return updates, state


_ORDER: list[str] = []


def _outputs(deltas, m):
    return ClientOutputs(deltas=deltas, client_states=(), train_loss=jnp.zeros(m),
                         num_steps=jnp.ones(m, jnp.int32), initial_loss=jnp.zeros(m))


def test_links_run_in_slot_order_whatever_order_they_were_added_in():
    _ORDER.clear()
    algorithm = fjp.fedavg()
    for slot, name in (("noise", "n1"), ("transform", "t1"), ("clip", "c1"), ("noise", "n2"),
                       ("clip", "c2")):
        algorithm = fjp.with_link(algorithm, _Tag(slot, name))
    assert [link.name for link in algorithm.server_update.links] == ["c1", "c2", "t1", "n1", "n2"]
    params = {"w": jnp.zeros(3)}
    state = fjp.init_server_state(algorithm, params, 2)
    fjp.algorithms.server_round(algorithm, state, jnp.arange(2), _outputs(
        {"w": jnp.ones((2, 3))}, 2), jnp.array([0.5, 0.5]))
    assert _ORDER == ["c1", "c2", "t1", "n1", "n2"]


def test_a_link_is_refused_for_a_bad_slot_a_non_link_and_a_method_with_its_own_update():
    with pytest.raises(ValueError, match=r"slot is 'compress', not one of the chain's slots"):
        fjp.with_link(fjp.fedavg(), _Tag("compress", "x"))
    with pytest.raises(ValueError, match="takes a fedjax_pals.ServerLink"):
        fjp.with_link(fjp.fedavg(), lambda state, updates: (updates, state))
    with pytest.raises(ValueError, match="has a server update of its own"):
        fjp.with_link(fjp.scaffold(), _Tag("noise", "x"))


@pytest.mark.parametrize("links_first", [True, False])
def test_the_docs_noise_link_scales_to_the_heaviest_client_of_all_under_poisson(links_first):
    """max_i alpha_i / q over every client (float64 reference), not over the round's lanes:
    here the heaviest client is never drawn; the links added before or after the sampler."""
    docs = _docs_links()
    m, q, clip, sigma = 6, 0.5, 0.7, 1.3
    dists = RNG.dirichlet(np.ones(3) * 0.3, size=m)
    sizes = RNG.integers(10, 50, size=m).astype(np.float64)
    # One client covers T and is large: the heaviest by far, so the bounds are told apart.
    target, sizes[0] = dists[0], 1000.0
    algorithm = fjp.fedpals(target, 0.05)
    links = (docs["ClipTo"](clip), docs["AggregateNoise"](sigma, seed=int(RNG.integers(1000))))

    def with_links(a):
        for link in links:
            a = fjp.with_link(a, link)
        return a

    def with_sampler(a):
        return poisson_sampling.with_poisson_sampling(a, q, dists, sizes)

    algorithm = (with_sampler(with_links(algorithm)) if links_first
                 else with_links(with_sampler(algorithm)))
    everyone = np.asarray(fjp.server_weights.fedpals_weights(dists, target, sizes, 0.05))
    heaviest = int(np.argmax(everyone))
    drawn = np.array([i for i in range(m) if i != heaviest][:3])
    lanes = jnp.asarray(np.concatenate([drawn, [m, m]]), jnp.int32)  # two empty lanes
    params = {"w": jnp.zeros(50), "b": jnp.zeros((2, 5))}
    state = fjp.init_server_state(algorithm, params, m)
    weights = algorithm.weighting.weights(None, None, state, lanes)
    zero = {"w": jnp.zeros((5, 50)), "b": jnp.zeros((5, 2, 5))}

    def noise_at(r):
        new = fjp.algorithms.server_round(algorithm, state._replace(round=jnp.int32(r)), lanes,
                                          _outputs(zero, 5), weights)
        return np.concatenate([np.ravel(leaf) for leaf in jax.tree_util.tree_leaves(new.params)])

    draws = np.concatenate([noise_at(r) for r in range(40)]).astype(np.float64)
    std = sigma * clip * everyone[heaviest] / q
    lanes_std = sigma * clip * float(np.max(np.asarray(weights)))  # what a lane bound gives
    assert abs(lanes_std - std) / std > 0.2  # the two bounds are told apart
    assert stats.kstest(draws / std, "norm").pvalue > 1e-4  # one false alarm in 10,000 runs


def test_a_server_optimiser_steps_on_what_the_links_left():
    """FedAvgM's step after a user's clip link: its first step is eta * (the clipped weighted
    average), float64 reference; the optimiser is the chain's step, no look-through."""
    docs = _docs_links()
    m, d, clip, eta = 4, 7, 0.3, 0.5
    deltas = RNG.normal(size=(m, d)) * 2.0
    weights = RNG.dirichlet(np.ones(m))
    algorithm = fjp.with_link(fjp.fedavg(), docs["ClipTo"](clip))
    algorithm = fjp.algorithms.server_optimizers.with_server_optimizer(
        algorithm, optax.sgd(eta, momentum=0.9), "FedAvgM")
    chain = algorithm.server_update
    assert isinstance(chain, fjp.ServerChain) and len(chain.links) == 1
    state = fjp.init_server_state(algorithm, {"w": jnp.zeros(d)}, m)
    new = fjp.algorithms.server_round(algorithm, state, jnp.arange(m), _outputs(
        {"w": jnp.asarray(deltas, jnp.float32)}, m), jnp.asarray(weights, jnp.float32))
    norms = np.linalg.norm(deltas, axis=1)
    clipped = deltas * np.minimum(1.0, clip / norms)[:, None]
    np.testing.assert_allclose(np.asarray(new.params["w"]), eta * weights @ clipped,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="a server optimiser replaces the plain weighted average"):
        fjp.algorithms.server_optimizers.with_server_optimizer(algorithm, optax.sgd(1.0))


def _config(**algorithm):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 2
    config.training.learning_rate = 1.0  # large updates: most exceed C
    for key, value in algorithm.items():
        config.algorithm[key] = value
    return config


@dataclasses.dataclass(frozen=True)
class _NormSpy(fjp.ServerLink):
    """Records each round's lane norms as the chain receives them (a host callback)."""

    slot = "clip"

    def __call__(self, state, updates):
        squares = sum(jnp.sum(jnp.square(leaf).reshape(leaf.shape[0], -1), axis=1)
                      for leaf in jax.tree_util.tree_leaves(updates.deltas))
        jax.debug.callback(lambda norms: _NORMS.append(np.asarray(norms)), jnp.sqrt(squares))
        return updates, state


_NORMS: list = []


def test_client_side_clipping_never_hands_the_server_a_raw_update():
    """By construction: with dp_clipping='client' each client's update is clipped inside the
    client's own program (`ClientMethod.finish_update`), so the chain, before any link of its
    own, receives only updates within C; with server-side clipping it receives raw ones."""
    clip = 0.05
    common = dict(name="fedavg", dp_clip_norm=clip, dp_noise_multiplier=0.0)
    client = fjp.build_task(_config(dp_clipping="client", **common))
    server = fjp.build_task(_config(**common))
    assert [type(link) for link in client.algorithm.server_update.links] == [
        private_updates.ClientClipping, private_updates.GaussianNoise]
    assert client.algorithm.client.finish_update is private_updates.client_clip_update
    assert server.algorithm.client.finish_update is None

    def received(task):
        chain = task.algorithm.server_update
        algorithm = task.algorithm._replace(server_update=dataclasses.replace(
            chain, links=(_NormSpy(), *chain.links)))  # first: what arrives, as it arrives
        _NORMS.clear()
        fjp.run_training(algorithm, task.model, task.dataset, task.partition, task.training,
                         rounds=1, seed=0, clients_per_round=task.clients_per_round)
        return np.concatenate(_NORMS)

    from_clients, raw = received(client), received(server)
    assert np.all(from_clients <= clip * (1 + 1e-5)), from_clients
    assert np.any(raw > 2 * clip), raw  # the spy would see a raw update: it can fail
    # Clipped by the client or by the server: the same clipped updates, the same run.
    _, a = fjp.run_training(client.algorithm, client.model, client.dataset, client.partition,
                            client.training, rounds=2, seed=0)
    _, b = fjp.run_training(server.algorithm, server.model, server.dataset, server.partition,
                            server.training, rounds=2, seed=0)
    np.testing.assert_allclose(a.train_loss, b.train_loss, rtol=1e-5)
    np.testing.assert_allclose(a.target_accuracy, b.target_accuracy, atol=1e-3)


def test_client_side_clipping_refuses_adaptive_clipping():
    with pytest.raises(fjp.ConfigError, match="dp_clipping='client' is set with "
                       "algorithm.dp_clip_quantile"):
        fjp.resolve_config(_config(dp_clip_norm=0.5, dp_noise_multiplier=0.1,
                                   dp_clip_quantile=0.5, dp_clipping="client"))


def test_the_header_prints_the_chain_in_the_order_it_runs():
    config = _config(name="fedadam_fedpals", lam=0.1, dp_clip_norm=0.5,
                     dp_noise_multiplier=1.0)
    config.server.learning_rate = 0.1
    line = server_chain.describe(fjp.build_task(config).algorithm)
    assert re.fullmatch(
        r"weights fedpals -> clip: each update clipped to C on the server \(DP on updates\) -> "
        r"noise: Gaussian noise .* -> step: FedAdam\(eta=0\.1,.*\)", line), line


@dataclasses.dataclass(frozen=True)
class _OldStyleWrapper:
    """A user's server update before the chain: the plain average in a field `inner`."""

    inner: object

    def __call__(self, state, participants, outputs, weights):
        return self.inner(state, participants, outputs, weights)


def test_an_old_style_wrapper_is_still_looked_through_for_a_server_optimiser_and_warns():
    algorithm = fjp.fedavg()._replace(server_update=_OldStyleWrapper(fjp.weighted_average_update()))
    with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning,
                      match="make it a link of the server chain"):
        wrapped = fjp.algorithms.server_optimizers.with_server_optimizer(
            algorithm, optax.sgd(0.5), "SGD")
    assert isinstance(wrapped.server_update, _OldStyleWrapper)
    assert isinstance(wrapped.server_update.inner.step,
                      fjp.algorithms.server_optimizers.OptimizerUpdate)
    assert wrapped.server_optimizer is not None


def test_a_wrapper_around_the_chain_is_refused_where_the_weighting_declares_a_bound():
    """Under Poisson sampling the chain must receive the bound: an old-style wrapper would run
    it without, the noise scaled to the round's lanes."""
    m = 4
    dists = RNG.dirichlet(np.ones(3), size=m)
    algorithm = poisson_sampling.with_poisson_sampling(
        private_updates.with_private_updates(fjp.fedavg(), 0.5, 1.0, 0), 0.5, dists,
        np.full(m, 10.0))
    wrapped = algorithm._replace(server_update=_OldStyleWrapper(algorithm.server_update))
    state = fjp.init_server_state(wrapped, {"w": jnp.zeros(3)}, m)
    lanes = jnp.arange(m)
    weights = wrapped.weighting.weights(None, None, state, lanes)
    with pytest.raises(ValueError, match="only a server chain passes to its links"):
        fjp.algorithms.server_round(wrapped, state, lanes, _outputs({"w": jnp.zeros((m, 3))}, m),
                                    weights)

