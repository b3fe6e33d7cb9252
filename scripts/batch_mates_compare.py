"""Seed 0 of the Poisson DP cell (epsilon 4, FedPALS ESS 50 %) alone against on one runs axis with other runs: its parameters after each round, compared bit for bit (docs/measurements/batch_mates.md).

  NDEV=2 python scripts/batch_mates_compare.py ROUNDS "RUN;RUN"          # seed 0 first, then RUNs
  NDEV=2 python scripts/batch_mates_compare.py ROUNDS "RUN;...;RUN" block  # the runs as listed

RUN: a run name of configs/beyond_private_updates.py:poisson at epsilon 2 or 4, e.g.
"dp_clip_norm=0.5,dp_target_epsilon=4/fedpals/ess_fraction=0.5/seed_1". NDEV: host devices
(the sweep's `--cpu_devices auto` is one per core); unset, JAX's default of one.
"""
import sys, time
import os
import numpy as np, jax, jax.numpy as jnp
if os.environ.get("NDEV"): jax.config.update("jax_num_cpu_devices", int(os.environ["NDEV"]))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import importlib.util
from fedjax_pals.experiment.sweep import expand_sweep
from fedjax_pals.experiment.config import resolve_config
from fedjax_pals.experiment.task import build_resolved_task
from fedjax_pals.training import TrainingRun, _stacked_client_tables
from fedjax_pals.engine.round import round_engine

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
spec = importlib.util.spec_from_file_location("c", os.path.join(ROOT, "configs/beyond_private_updates.py"))
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
config = mod.get_config("poisson")
config.sweep.seeds = (0, 1, 2)
config.sweep.methods = ("fedpals",)
config.sweep.axes.algorithm.dp_clip_norm = (0.5, 0.5)
config.sweep.axes.algorithm.dp_target_epsilon = (4.0, 2.0)
allruns = dict(expand_sweep(config))
want = ["dp_clip_norm=0.5,dp_target_epsilon=4/fedpals/ess_fraction=0.5/seed_0"] + sys.argv[2].split(";")
if len(sys.argv) > 3:
    want = sys.argv[2].split(";")
WATCH = want.index("dp_clip_norm=0.5,dp_target_epsilon=4/fedpals/ess_fraction=0.5/seed_0")
print("watch position", WATCH, "of", len(want))
runs = [(n, allruns[n]) for n in want]
print([n for n, _ in runs])
def make(cfg):
    resolved = resolve_config(cfg).config
    task = build_resolved_task(resolved)
    return TrainingRun(task.algorithm, task.model, task.dataset, task.partition, task.training,
                       rounds=resolved.training.rounds, seed=resolved.seed, eval_every=1,
                       clients_per_round=task.clients_per_round, sampling_rate=task.sampling_rate)
trs = [make(c) for _, c in runs]
engine = round_engine(trs[0].algorithm, trs[0].model, trs[0].training)
print("backend", type(engine.backend).__name__, "devices", engine.mesh.size, jax.devices())
def drive(group):
    data = _stacked_client_tables(group)
    states = jax.tree_util.tree_map(lambda *l: jnp.stack(l), *[r.state for r in group])
    out = []
    for r in range(ROUNDS):
        participants = np.stack([run.participants(r) for run in group])
        keys = jnp.stack([run.round_key(r) for run in group])
        states, metrics = engine.run_rounds(data, states, participants, keys)
        print("round", r + 1, "per run max|p|", [max(float(np.max(np.abs(np.asarray(x[k])))) for x in jax.tree_util.tree_leaves(states.params)) for k in range(len(group))], flush=True)
        w = WATCH if len(group) > 1 else 0
        out.append((jax.tree_util.tree_map(lambda l: np.asarray(l[w]), states.params),
                    np.asarray(metrics["weights"][w])))
    return out
t = time.time(); solo = drive(trs[WATCH:WATCH+1]); print("solo", time.time() - t)
t = time.time(); trio = drive(trs); print("trio", time.time() - t)
for r, ((p1, w1), (p3, w3)) in enumerate(zip(solo, trio)):
    l1, l3 = jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(p3)
    d = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(l1, l3))
    neq = sum(int(np.sum(a != b)) for a, b in zip(l1, l3))
    print(f"round {r+1}: params max|diff| {d:.3g}, unequal {neq}, weights equal {np.array_equal(w1, w3)}")
