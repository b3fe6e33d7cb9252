"""structure_key and the round_engine cache: equal structure shares, anything else does not."""

import jax
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.algorithms import plain_sgd
from fedjax_pals.engine import round as round_lib


def _uncached_prox(mu):
    """A client method written without functools.cache: new closures on every call."""

    def regularizer(params, global_params):
        leaves = jax.tree_util.tree_leaves(
            jax.tree_util.tree_map(lambda a, b: a - b, params, global_params)
        )
        return 0.5 * mu * sum((leaf**2).sum() for leaf in leaves)

    return plain_sgd()._replace(name="uncached_prox", regularizer=regularizer)


def test_functions_built_twice_by_an_uncached_builder_have_equal_keys():
    a, b = _uncached_prox(0.1), _uncached_prox(0.1)
    assert a.regularizer is not b.regularizer
    assert fjp.engine.structure_key(a) == fjp.engine.structure_key(b)


@pytest.mark.parametrize("other", [0.2, np.float32(0.1) + 1e-3])
def test_another_closed_over_value_gives_another_key(other):
    assert fjp.engine.structure_key(_uncached_prox(0.1)) != fjp.engine.structure_key(_uncached_prox(other))


def test_closed_over_arrays_enter_the_key_by_value():
    def make(table):
        return lambda x: x * table

    assert fjp.engine.structure_key(make(np.arange(3.0))) == fjp.engine.structure_key(make(np.arange(3.0)))
    assert fjp.engine.structure_key(make(np.arange(3.0))) != fjp.engine.structure_key(make(np.arange(3.0) + 1))


def test_an_uncached_baseline_reuses_its_engine_and_the_cache_is_bounded():
    model = fjp.logistic_regression((3,), 2)
    training = fjp.LocalTraining(batch_size=2)
    algorithm = lambda mu: fjp.combine(_uncached_prox(mu))
    first = fjp.engine.round_engine(algorithm(0.5), model, training, backend="vmap_scan")
    assert fjp.engine.round_engine(algorithm(0.5), model, training, backend="vmap_scan") is first
    assert fjp.engine.round_engine(algorithm(0.25), model, training, backend="vmap_scan") is not first
    for i in range(round_lib._ENGINE_CACHE_SIZE + 5):
        fjp.engine.round_engine(algorithm(1.0 + i), model, training, backend="vmap_scan")
    assert fjp.engine.cached_engines() == round_lib._ENGINE_CACHE_SIZE


def test_an_uncached_model_builder_and_server_update_share_one_engine():
    # README's and examples/extending's builders are not cached: that must cost no compile.
    import flax.linen as nn

    class MLP(nn.Module):
        num_classes: int

        @nn.compact
        def __call__(self, x):
            return nn.Dense(self.num_classes)(nn.relu(nn.Dense(8)(x.reshape((x.shape[0], -1)))))

    def build(width=3):
        return fjp.model_from_flax("uncached_mlp", MLP(width), (6,), width)

    def server_update(lr):
        average = fjp.weighted_average_update()

        def update(state, participants, outputs, weights):
            return average(state, participants, outputs, lr * weights)

        return update

    def algorithm(lr):
        return fjp.fedavg()._replace(server_update=server_update(lr))

    def engine(lr, width=3):
        training = fjp.LocalTraining(batch_size=2)
        return fjp.engine.round_engine(algorithm(lr), build(width), training, backend="vmap_scan")

    first = engine(0.5)
    assert build() is not build()
    assert engine(0.5) is first
    assert engine(0.25) is not first and engine(0.5, width=4) is not first
