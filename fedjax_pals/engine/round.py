"""The round engine: plan, map the client update over the clients, reduce, update.

A round of R runs at once (`run_rounds`; `run_round` is R = 1):

1. plan: each run's participants, their client info and data schedules;
2. map: the backend runs the client update (start, step, finish) of every
   participant of every run, with the clients axis spread over the mesh;
3. reduce: the weighting's alpha over the participants and the weighted
   reduction of their updates (across devices and processes: an all-reduce);
4. server update: the next `ServerState` of each run.

Runs that share structure (model, algorithm kind, local training) and differ in what lives in the
state (seed and so init and data order, T, lambda, partitions of equal shape) share one compiled
program: traced backends vmap the whole round over the runs axis; host-driven backends deal the
(run, client) pairs to their lanes.

The engine has one code path per kind of backend (backends/base.py), chosen once when it is built:
`_TracedRounds` for a `TracedBackend`, `_HostRounds` for a `HostBackend`.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals.algorithms import ClientOutputs, FederatedAlgorithm, ServerState
from fedjax_pals.algorithms import server_chain
from fedjax_pals.engine import mesh as mesh_lib
from fedjax_pals.engine.backends import (
    HostBackend,
    TracedBackend,
    backend_kind,
    make_backend,
    resolve_backend,
)
from fedjax_pals.engine.client_update import LocalTraining, make_client_update
from fedjax_pals.engine.compilation import CompilationCounter
from fedjax_pals.engine.convs import VMAPPED_CONVS, matmul_convs
from fedjax_pals.engine.plan import RUNS_AXES, DeviceData, make_plan, pad_plan
from fedjax_pals.engine.structure import structure_key
from fedjax_pals.models import Model

# A traced round splits its clients over a mesh of D devices only from this many clients per
# device: below it, one device's work is too small to pay for the split and the all-reduce
# (docs/decisions/0005-clients-axis-over-a-mesh.md).
MIN_CLIENTS_PER_DEVICE = 128


def _add_runs_axis(tree):
    return jax.tree_util.tree_map(lambda leaf: leaf[None], tree)


def _drop_runs_axis(tree):
    return jax.tree_util.tree_map(lambda leaf: leaf[0], tree)


def _run_block(tree, r):
    """Run r of `tree`, its runs axis kept (of 1): data movement alone."""
    return jax.tree_util.tree_map(lambda leaf: jax.lax.dynamic_slice_in_dim(leaf, r, 1), tree)


def _concat_runs(trees):
    return jax.tree_util.tree_map(lambda *leaves: jnp.concatenate(leaves), *trees)


class _PhaseClock:
    """Calls a phase; with a `timings` dict, waits for its result and adds its seconds."""

    def __init__(self, timings: dict | None):
        self.timings = timings

    def __call__(self, name: str, fn, *args):
        if self.timings is None:
            return fn(*args)
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
        return out


class _TracedRounds:
    """A `TracedBackend`'s rounds: plan, `backend.map_clients`, aggregation, as one program."""

    def __init__(self, engine: "RoundEngine"):
        self.engine = engine
        replicated = mesh_lib.replicated(engine.mesh)
        runs = jax.vmap(self._round, in_axes=(RUNS_AXES, 0, 0, 0))
        self._jit_round = jax.jit(runs, out_shardings=replicated)
        # One run's round without a runs axis: vmapped over a runs axis of 1, FedPALS'
        # solve runs far slower (see `_HostRounds._aggregate_runs`).
        self._jit_single_round = jax.jit(self._round, out_shardings=replicated)

    def _round(self, data: DeviceData, state: ServerState, participants, key):
        engine = self.engine
        plan = make_plan(engine.training, data, state, participants, key)
        m = participants.shape[0]
        map_clients = engine.backend.map_clients
        if engine.mesh.size > 1 and m < engine.min_clients_per_device * engine.mesh.size:
            # Too few clients to split (MIN_CLIENTS_PER_DEVICE): every device computes the
            # whole round on its replica.
            return engine._aggregate(state, plan, map_clients(engine.update, data, state, plan))
        clients = mesh_lib.clients_sharding(engine.mesh)
        padded = jax.lax.with_sharding_constraint(pad_plan(plan, engine._multiple), clients)
        outputs = map_clients(engine.update, data, state, padded)
        outputs = jax.lax.with_sharding_constraint(outputs, clients)
        return engine._aggregate(state, plan, outputs)

    def run_rounds(self, data, states, participants, keys, clock):
        return clock("round", self._jit_round, data, states, participants, keys)

    def run_round(self, data, state, participants, key, timings):
        # One dispatch: what a small model's round can afford.
        engine = self.engine
        data = engine.place_data(data)
        state, participants, key = engine._inputs(state, participants, key)
        state, metrics = _PhaseClock(timings)(
            "round", self._jit_single_round, data, state, participants, key
        )
        return state, mesh_lib.local_view(metrics)


class _HostRounds:
    """A `HostBackend`'s rounds: jitted plans, the bound backend's clients from the host,
    jitted aggregation of its results, which it then takes back (`recycle`)."""

    def __init__(self, engine: "RoundEngine"):
        self.engine = engine
        mesh = engine.mesh
        self.bound = engine.backend.bind(engine.update, mesh)
        self._jit_plan = jax.jit(
            jax.vmap(self._padded_plan, in_axes=(RUNS_AXES, 0, 0, 0)),
            out_shardings=engine.backend.plan_sharding(mesh),
        )
        replicated = mesh_lib.replicated(mesh)
        # The lanes' results as (R, m, ...) outputs: data movement alone.
        self._jit_gather = jax.jit(self._gather, static_argnums=(1, 2), out_shardings=replicated)
        # Each run's aggregation is one run's program, whatever R: its arithmetic (FedPALS'
        # solve, the weighted reduction, DP's noise) does not depend on the batch-mates, so a
        # run on a runs axis gets its solo numbers bit for bit (docs/measurements/batch_mates.md).
        self._jit_aggregate = jax.jit(self._aggregate_runs, out_shardings=replicated)
        # Results held by one device (one process's lane buffers): aggregate there, once.
        self._jit_gather_here = jax.jit(self._gather, static_argnums=(1, 2))
        self._jit_aggregate_here = jax.jit(self._aggregate_runs)
        self._jit_run = jax.jit(_run_block)
        self._jit_concat = jax.jit(_concat_runs)

    def _padded_plan(self, data: DeviceData, state: ServerState, participants, key):
        plan = make_plan(self.engine.training, data, state, participants, key)
        return pad_plan(plan, self.engine._multiple)

    def _gather(self, results, runs: int, m: int):
        return self.bound.outputs(results, runs, m)

    def _aggregate_runs(self, states, plans, participants, outputs):
        """One run's weights, reduction and update (a runs axis of 1).

        Not vmapped: a batched FedPALS solve cost 115-160 ms per round against 4 ms
        unbatched (20 participants, this CPU), and the reduction is cheap either way.
        """
        state, plan, participants, outputs = _drop_runs_axis((states, plans, participants, outputs))
        return _add_runs_axis(
            self.engine._aggregate(state, plan._replace(participants=participants), outputs)
        )

    def run_rounds(self, data, states, participants, keys, clock):
        plans = clock("plan", self._jit_plan, data, states, participants, keys)
        results = clock("train", self.bound, data, states, plans)
        gather, aggregate = self._jit_gather, self._jit_aggregate
        device = self.bound.aggregation_device(results)
        if device is not None:
            [(states, plans)] = mesh_lib.device_views((states, plans), [device])
            gather, aggregate = self._jit_gather_here, self._jit_aggregate_here
        runs, m = participants.shape

        def aggregate_all():
            outputs = gather(results, runs, m)
            if runs == 1:
                return aggregate(states, plans, participants, outputs)
            args = (states, plans, participants, outputs)
            return self._jit_concat(
                [aggregate(*self._jit_run(args, np.int32(r))) for r in range(runs)]
            )

        states, metrics = clock("aggregate", aggregate_all)
        self.bound.recycle(results)  # read by nothing after the aggregation
        return states, metrics

    def run_round(self, data, state, participants, key, timings):
        engine = self.engine
        states = engine._jit_add_runs(mesh_lib.replicate(state, engine.mesh))
        participants = np.asarray(participants, np.int32)[None]
        keys = np.asarray(key)[None]
        states, metrics = engine.run_rounds(
            data, states, participants, keys, timings=timings, _runs_axis=False
        )
        return engine._jit_drop_runs(states), engine._jit_drop_runs(metrics)


_KIND_ROUNDS = {TracedBackend: _TracedRounds, HostBackend: _HostRounds}


class RoundEngine:
    """Compiled rounds of one algorithm, model and local training on a mesh.

    `run_round(data, state, participants, key) -> (state, metrics)` trains the given participants
    ((m,) client ids; m fixes the compiled shape) and applies the server update. `run_rounds` does
    the same for R runs stacked on a leading axis (states, participants (R, m), keys (R, 2), and the
    client tables of `data`). Metrics: "weights", "train_loss", "initial_loss", "num_steps" per
    participant, as process-local arrays.

    `vmapped_convs`: how a backend that vmaps the clients (`vmaps_clients`: vmap_scan,
    vmap_chunked, vmap_steps) computes the model's convolutions: "patches" (the default) as
    patches times kernel, batched matmuls over the lanes (`engine.convs`); "grouped" as JAX's
    batching rule makes them, convolutions with one feature group per lane (runs x clients),
    which GPU libraries run slowly (docs/decisions/0106-vmapped-convolutions-as-matmuls.md).
    Both give the same numbers up to float32 rounding; `host_loop` trains clients alone and
    keeps the model's own convolutions.
    """

    def __init__(
        self,
        algorithm: FederatedAlgorithm,
        model: Model,
        training: LocalTraining,
        *,
        backend: str = "auto",
        chunk_size: int = 64,
        steps_per_call: int = 1,
        mesh: jax.sharding.Mesh | None = None,
        min_clients_per_device: int = MIN_CLIENTS_PER_DEVICE,
        vmapped_convs: str = "patches",
    ):
        self.algorithm, self.model, self.training = algorithm, model, training
        self.min_clients_per_device = min_clients_per_device
        self.mesh = mesh if mesh is not None else mesh_lib.client_mesh()
        name = resolve_backend(backend, model, self.mesh)
        self.backend = make_backend(name, chunk_size=chunk_size, steps_per_call=steps_per_call)
        self.vmapped_convs = _check_vmapped_convs(vmapped_convs)
        update_model = model
        if vmapped_convs == "patches" and getattr(self.backend, "vmaps_clients", False):
            update_model = model._replace(apply=matmul_convs(model.apply))
        self.update = make_client_update(algorithm, update_model, training)
        self.counter = CompilationCounter()
        self._multiple = self.backend.client_multiple(self.mesh.size)
        self._placed: tuple = ()
        self._jit_add_runs = jax.jit(_add_runs_axis)
        self._jit_drop_runs = jax.jit(_drop_runs_axis)
        self._rounds = _KIND_ROUNDS[backend_kind(self.backend)](self)

    @property
    def _bound(self):
        """The bound host backend (host-driven backends only)."""
        return self._rounds.bound

    # -- shared by both kinds (traced) ----------------------------------------------

    def _aggregate(self, state: ServerState, plan, outputs: ClientOutputs):
        """alpha over the (unpadded) participants, weighted reduction, server update."""
        m = plan.participants.shape[0]
        info, outputs = jax.tree_util.tree_map(lambda leaf: leaf[:m], (plan.info, outputs))
        weights = self.algorithm.weighting.weights(
            info.label_dist, info.num_examples.astype(jnp.float32), state, plan.participants
        )
        new_state = server_chain.server_round(
            self.algorithm, state, plan.participants, outputs, weights)
        # The engine owns the round counter: a server update never advances it.
        new_state = new_state._replace(round=state.round + 1)
        names = ("train_loss", "initial_loss", "num_steps")
        return new_state, {"weights": weights, **{n: getattr(outputs, n) for n in names}}

    # -- public -----------------------------------------------------------------

    def place_data(self, data: DeviceData, *, runs_axis: bool = True) -> DeviceData:
        """`data` replicated on the mesh (client tables with a leading runs axis).

        The last placement is remembered, so passing the same `data` every round copies it once.
        """
        if self._placed and self._placed[0] is data and self._placed[1] == runs_axis:
            return self._placed[2]
        placed = mesh_lib.replicate(data, self.mesh)
        if not runs_axis:
            tables = ("client_indices", "client_sizes", "client_label_dists")
            placed = placed._replace(**{n: self._jit_add_runs(getattr(placed, n)) for n in tables})
        self._placed = (data, runs_axis, placed)
        return placed

    def run_rounds(
        self,
        data: DeviceData,
        states: ServerState,
        participants,
        keys,
        *,
        timings: dict | None = None,
        _runs_axis=True,
    ) -> tuple[ServerState, dict]:
        """One round of R runs: states, (R, m) participants, (R, 2) keys.

        With `timings` (a dict), the round waits for each of its phases and adds their seconds
        there: "plan", "train" (the clients' updates) and "aggregate" (weights, weighted reduction,
        server update) for host-driven backends; "round" alone for traced ones (one program).
        Waiting costs a little overlap between phases; leave it None outside measurements.
        """
        clock = _PhaseClock(timings)
        with self.counter.track():
            data = self.place_data(data, runs_axis=_runs_axis)
            states, participants, keys = self._inputs(states, participants, keys)
            states, metrics = self._rounds.run_rounds(data, states, participants, keys, clock)
            return states, mesh_lib.local_view(metrics)

    def run_round(
        self, data: DeviceData, state: ServerState, participants, key, *, timings=None
    ) -> tuple[ServerState, dict]:
        """One round of one run on `data` for the given participants (`timings`: as
        `run_rounds`)."""
        with self.counter.track():
            return self._rounds.run_round(data, state, participants, key, timings)

    def _inputs(self, state, participants, keys):
        """The round's inputs on the mesh; host values go as they are in one process (jit
        places them), as global arrays across processes."""
        participants, keys = np.asarray(participants, np.int32), np.asarray(keys)
        if jax.process_count() == 1:
            return mesh_lib.replicate(state, self.mesh), participants, keys
        return mesh_lib.replicate((state, participants, keys), self.mesh)

    @property
    def compilations(self) -> int:
        """XLA compilations this engine has triggered (jax.monitoring events)."""
        return self.counter.compilations

    @property
    def compile_seconds(self) -> float:
        return self.counter.compile_seconds


def _check_vmapped_convs(value: str) -> str:
    if value not in VMAPPED_CONVS:
        raise ValueError(f"vmapped_convs must be one of {VMAPPED_CONVS}, got {value!r}.")
    return value


_ENGINE_CACHE_SIZE = 32
_ENGINES: collections.OrderedDict = collections.OrderedDict()
_ENGINES_LOCK = threading.Lock()


def engine_key(
    algorithm: FederatedAlgorithm, model: Model, training: LocalTraining, **options: Any
) -> Any:
    """The hashable static spec of the round `round_engine` compiles (same arguments).

    What the compiled round depends on (the client method, the weighting function, the
    server update, the model, the local training, the resolved backend and the mesh)
    compared by `structure_key`, not by identity; not the per-run data held in the state
    (T, lambda, the seed's params). Runs with equal keys share one `RoundEngine`.
    """
    return _spec(algorithm, model, training, **options)[0]


def _spec(
    algorithm: FederatedAlgorithm,
    model: Model,
    training: LocalTraining,
    *,
    backend: str = "auto",
    chunk_size: int = 64,
    steps_per_call: int = 1,
    mesh: jax.sharding.Mesh | None = None,
    min_clients_per_device: int = MIN_CLIENTS_PER_DEVICE,
    vmapped_convs: str = "patches",
) -> tuple[Any, dict]:
    mesh = mesh if mesh is not None else mesh_lib.client_mesh()
    options = dict(
        backend=resolve_backend(backend, model, mesh),
        chunk_size=chunk_size,
        steps_per_call=steps_per_call,
        mesh=mesh,
        min_clients_per_device=min_clients_per_device,
        vmapped_convs=_check_vmapped_convs(vmapped_convs),
    )
    compiled_parts = (
        algorithm.client,
        algorithm.weighting.weights,
        algorithm.weighting.max_weight,
        algorithm.server_update,
        model.apply,
        model.init,
        training,
    )
    return (structure_key(compiled_parts), tuple(sorted(options.items()))), options


def round_engine(
    algorithm: FederatedAlgorithm,
    model: Model,
    training: LocalTraining,
    *,
    backend: str = "auto",
    chunk_size: int = 64,
    steps_per_call: int = 1,
    mesh: jax.sharding.Mesh | None = None,
    min_clients_per_device: int = MIN_CLIENTS_PER_DEVICE,
    vmapped_convs: str = "patches",
) -> RoundEngine:
    """A RoundEngine shared by every run with the same `engine_key`.

    A sweep over seeds, targets or lambda compiles its round once, and so does a baseline whose
    builder makes new closures on every call. The cache holds the 32 most recently used engines.
    """
    key, options = _spec(
        algorithm,
        model,
        training,
        backend=backend,
        chunk_size=chunk_size,
        steps_per_call=steps_per_call,
        mesh=mesh,
        min_clients_per_device=min_clients_per_device,
        vmapped_convs=vmapped_convs,
    )
    with _ENGINES_LOCK:
        if key in _ENGINES:
            _ENGINES.move_to_end(key)
            return _ENGINES[key]
        engine = RoundEngine(algorithm, model, training, **options)
        _ENGINES[key] = engine
        while len(_ENGINES) > _ENGINE_CACHE_SIZE:
            _ENGINES.popitem(last=False)
        return engine


def cached_engines() -> int:
    """How many engines the `round_engine` cache holds (for tests)."""
    return len(_ENGINES)
