"""A user's own method, model and data set for fedjax_pals, in one module of theirs.

Importing this module registers:

* the method "fednova": FedNova-style normalised averaging (Wang et al., "Tackling the
  Objective Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS 2020):
  each client's update d_i is divided by its number of local steps tau_i and the average is
  rescaled by tau_eff = sum_i p_i tau_i,

      theta <- theta + eta * tau_eff * sum_i p_i d_i / tau_i,     p_i = n_i / N,

  with its own hyperparameter `nova_server_lr` (eta) and a grid for the selection protocol;
* the model "my_mlp": a flax.linen MLP;
* the data set "blobs": four Gaussian classes in 8 dimensions, made from NumPy arrays;
* the feature "smoothed_target": the server's weights use T_eps = (1 - eps) T + eps / K, a
  hedge against a T that is slightly off, for every run whose weights read T (FedPALS), with
  its own config key `algorithm.target_smoothing` (eps) and a line in results.json.

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
        # Its server update is its own: a config cannot put a server optimiser in its place.
        owns_server_update=True,
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

# -- the feature -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SmoothedTarget(fjp.Hyperparameters):
    # None: off (the key is left out of the run's identity, so other runs keep their digests).
    # per_run: data in the state, not compiled in, so runs differing only in it share one
    # compiled program.
    target_smoothing: float | None = fjp.hyperparameter(
        None, low=0.0, high=1.0, optional=True, per_run=True
    )


def resolve_smoothing(values, facts: fjp.RunFacts):
    # Only the runs whose server weights read T use it; the others resolve it to None.
    return {"target_smoothing": values["target_smoothing"] if facts.reads_target else None}


def smooth_target(hp: SmoothedTarget, context: fjp.MethodContext) -> fjp.MethodContext:
    target = np.asarray(context.partition.target_label_dist, np.float64)
    smoothed = (1.0 - hp.target_smoothing) * target + hp.target_smoothing / target.size
    return context.replace(
        partition=dataclasses.replace(context.partition, target_label_dist=smoothed)
    )


class SmoothedTargetReport(fjp.Monitor):
    def __init__(self, task):
        self.target = task.target_label_dist  # the T the server's weights used

    def results(self, state):
        return {"smoothed_target": np.asarray(self.target).tolist()}


fjp.register_feature(
    fjp.Feature(
        name="smoothed_target",
        label="smoothed T",
        hyperparameters=SmoothedTarget,
        resolve=resolve_smoothing,
        # It changes T: its stage runs before FedPALS' lambda search (algorithm.ess_fraction),
        # so the lambda found gives the ESS asked for with the T the weights use.
        stage="target",
        prepare=smooth_target,
        monitor=lambda hp, task: SmoothedTargetReport(task),
    ),
    replace=True,
)

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
