"""A user's own method, model and data set for fedjax_pals, in one module of theirs.

Importing this module registers:

* the method "fednova": FedNova-style normalised averaging (Wang et al., "Tackling the
  Objective Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS 2020):
  each client's update d_i is divided by its number of local steps tau_i and the average is
  rescaled by tau_eff = sum_i p_i tau_i,

      theta <- theta + eta * tau_eff * sum_i p_i d_i / tau_i,     p_i = n_i / N,

  with its own hyperparameter `nova_server_lr` (eta) and a grid for the selection protocol;
* the model "my_mlp": a flax.linen MLP;
* the data set "blobs": four Gaussian classes in 8 dimensions, made from NumPy arrays.

Name them in a config file that imports this module (my_config.py, my_sweep.py).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import fedjax_pals as fjp

# -- the method --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FedNovaHyperparameters(fjp.Hyperparameters):
    # The field name is the config key algorithm.nova_server_lr.
    nova_server_lr: float = fjp.hyperparameter(1.0, low=0.0, low_open=True, doc="server step")


def fednova_server_update(server_lr: float):
    average = fjp.weighted_average_update()

    def update(state, participants, outputs, weights):
        tau = jnp.maximum(outputs.num_steps.astype(jnp.float32), 1.0)  # (m,) local steps
        tau_eff = jnp.sum(weights * tau)
        scale = server_lr * tau_eff / tau  # d_i -> eta tau_eff d_i / tau_i

        def normalise(delta):
            return delta * scale.reshape((-1,) + (1,) * (delta.ndim - 1)).astype(delta.dtype)

        deltas = jax.tree_util.tree_map(normalise, outputs.deltas)
        return average(state, participants, outputs._replace(deltas=deltas), weights)

    return update


def build_fednova(hp: FedNovaHyperparameters, context: fjp.MethodContext):
    fedavg = fjp.fedavg()  # local SGD and FedAvg's weights p_i = n_i / N
    return fedavg._replace(server_update=fednova_server_update(hp.nova_server_lr))


fjp.register_method(
    fjp.Method(
        name="fednova",
        label="FedNova",
        build=build_fednova,
        hyperparameters=FedNovaHyperparameters,
        grid={"nova_server_lr": (1.0, 0.5)},
        description="normalised averaging (Wang et al., 2020)",
    ),
    replace=True,
)

# -- the model ---------------------------------------------------------------------------------


class MLP(nn.Module):
    num_classes: int
    hidden: int = 32

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(self.hidden)(x.reshape((x.shape[0], -1))))
        return nn.Dense(self.num_classes)(x)


def my_mlp(input_shape, num_classes):
    return fjp.model_from_flax("my_mlp", MLP(num_classes), input_shape, num_classes)


fjp.register_model("my_mlp", my_mlp, replace=True)

# -- the data set ------------------------------------------------------------------------------

NUM_CLASSES, DIM = 4, 8


def load_blobs() -> fjp.Dataset:
    rng = np.random.default_rng(0)
    means = rng.normal(scale=3.0, size=(NUM_CLASSES, DIM))

    def split(n):
        y = rng.integers(0, NUM_CLASSES, size=n)
        x = means[y] + rng.normal(size=(n, DIM))
        return fjp.LabeledSplit(x.astype(np.float32), y.astype(np.int32))

    return fjp.Dataset("blobs", split(3000), split(2000), NUM_CLASSES, source="my_extension")


fjp.register_dataset(
    "blobs",
    load_blobs,
    num_classes=NUM_CLASSES,
    num_train=3000,
    images=False,
    label="Blobs",
    replace=True,
)
