"""The backend protocols and registry: a backend from outside the package is one class
plus one `register_backend` entry, and anything that is neither kind is refused."""

import dataclasses

import jax
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.engine import backends

from test_engine import _max_diff, _random_task


@pytest.fixture
def registry(monkeypatch):
    """The backend registry, restored afterwards (registrations here stay in this test)."""
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    return backends


@dataclasses.dataclass(frozen=True)
class WrappedScan(fjp.engine.TracedBackend):
    """A traced backend of the test's own: vmap_scan's mapping, counted."""

    calls: list = dataclasses.field(default_factory=list, compare=False)
    name: str = "wrapped_scan"

    def client_multiple(self, num_devices: int) -> int:
        return backends.VmapScan().client_multiple(num_devices)

    def map_clients(self, update, data, state, plan):
        self.calls.append(plan.participants.shape)
        return backends.VmapScan().map_clients(update, data, state, plan)


@dataclasses.dataclass(frozen=True)
class WrappedHostLoop(fjp.engine.HostBackend):
    """A host backend of the test's own: host_loop bound as it is."""

    name: str = "wrapped_host_loop"

    def client_multiple(self, num_devices: int) -> int:
        return backends.HostLoop().client_multiple(num_devices)

    def bind(self, update, mesh):
        return backends.HostLoop().bind(update, mesh)


def _round(backend, rounds=2):
    model = fjp.logistic_regression((6,), 3)
    x, y, rows, sizes, dists = _random_task(3, [9, 3, 6, 4], (6,))
    training = fjp.LocalTraining(local_epochs=2, batch_size=2, learning_rate=0.1)
    data = fjp.engine.device_data(x, y, rows, sizes, dists)
    state = fjp.init_server_state(fjp.fedavg(), model.init(jax.random.PRNGKey(0)), 4)
    engine = fjp.engine.RoundEngine(fjp.fedavg(), model, training, backend=backend)
    losses = []
    for r in range(rounds):
        state, metrics = engine.run_round(data, state, np.array([3, 0, 2]), jax.random.PRNGKey(r))
        losses.append(metrics["train_loss"])
    return engine, state, np.stack(losses)


@pytest.mark.parametrize(
    "name, factory, builtin",
    [
        ("wrapped_scan", lambda **_: WrappedScan(), "vmap_scan"),
        ("wrapped_host_loop", lambda **_: WrappedHostLoop(), "host_loop"),
    ],
)
def test_a_backend_registered_from_outside_runs_rounds_equal_to_the_builtin_one(
    registry, name, factory, builtin
):
    registry.register_backend(name, factory)
    assert name in registry.backend_names() and name not in fjp.engine.BACKENDS
    assert registry.resolve_backend(name, fjp.logistic_regression((6,), 3)) == name
    # A config names it like a built-in one (and a name never registered stays an error).
    assert fjp.validate_config({"engine": {"backend": name}}).engine.backend == name
    with pytest.raises(ValueError, match="engine.backend"):
        fjp.validate_config({"engine": {"backend": name + "_unregistered"}})
    engine, state, losses = _round(name)
    assert engine.backend.name == name
    if isinstance(engine.backend, WrappedScan):
        assert engine.backend.calls  # the engine traced the round through it
    _, expected_state, expected_losses = _round(builtin)
    assert _max_diff(state.params, expected_state.params) == 0
    np.testing.assert_array_equal(losses, expected_losses)
    # Its name keys the shared engines like a built-in one's.
    model, training = fjp.logistic_regression((6,), 3), fjp.LocalTraining(batch_size=2)
    shared = fjp.engine.round_engine(fjp.fedavg(), model, training, backend=name)
    assert fjp.engine.round_engine(fjp.fedavg(), model, training, backend=name) is shared


class NeitherKind:
    """Has every method of both kinds but declares neither."""

    name = "neither"

    def client_multiple(self, num_devices):
        return 1

    def map_clients(self, update, data, state, plan):
        raise AssertionError("never called")

    def bind(self, update, mesh):
        raise AssertionError("never called")


class BothKinds(WrappedScan, WrappedHostLoop):
    pass


@pytest.mark.parametrize("made, which", [(NeitherKind, "neither"), (BothKinds, "both")])
def test_a_backend_of_neither_or_both_kinds_is_refused_naming_the_protocols(registry, made, which):
    registry.register_backend("odd", lambda **_: made())
    match = f"implements {which} of the backend protocols TracedBackend and HostBackend"
    with pytest.raises(TypeError, match=match):
        registry.make_backend("odd")
    with pytest.raises(TypeError, match=match):
        fjp.engine.RoundEngine(
            fjp.fedavg(), fjp.logistic_regression((6,), 3), fjp.LocalTraining(), backend="odd"
        )


def test_a_backend_missing_a_method_of_its_kind_cannot_be_made():
    class NoMapping(fjp.engine.TracedBackend):
        name = "no_mapping"

        def client_multiple(self, num_devices):
            return 1

    with pytest.raises(TypeError, match="map_clients"):
        NoMapping()


@pytest.mark.parametrize("name", ["vmap_scan", "auto", "", None])
def test_taken_or_reserved_names_cannot_be_registered(registry, name):
    with pytest.raises(ValueError, match="already registered|other than 'auto'"):
        registry.register_backend(name, lambda **_: WrappedScan())


def test_the_builtin_backends_declare_their_kind():
    kinds = {
        name: backends.backend_kind(backends.make_backend(name)) for name in fjp.engine.BACKENDS
    }
    assert kinds == {
        "vmap_scan": fjp.engine.TracedBackend,
        "vmap_chunked": fjp.engine.TracedBackend,
        "vmap_steps": fjp.engine.HostBackend,
        "host_loop": fjp.engine.HostBackend,
    }
