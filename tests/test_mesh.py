"""The clients axis over several host devices and processes gives one device's numbers.

Each configuration runs `tests/mesh_worker.py` in a process of its own (the
number of host devices is fixed when JAX starts), compared with the same rounds
run here on one device: rounds with partial participation and unequal client
sizes of FedPALS (weights re-solved for each round's sample) on every backend
and through the runs axis; on 2 devices also FedAvg, SCAFFOLD (client control
variates) and AFL (per-client mixture weights) on the CPU default. (Every case
compiles its pieces once per device, so the 8-device and 2-process runs keep
to the FedPALS set.)
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest


import mesh_worker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "mesh_worker.py")


@pytest.fixture(scope="module")
def one_device_results():
    assert jax.device_count() == 1
    return mesh_worker.run_cases("quick")


def _run(command):
    completed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return [
        json.loads(line.split("] ", 1)[-1])
        for line in completed.stdout.splitlines()
        if line.split("] ", 1)[-1].startswith("{")
    ]


def _assert_same(results, reference):
    assert set(results) <= set(reference) and results
    for name, values in results.items():
        np.testing.assert_allclose(values, reference[name], atol=1e-5, err_msg=name)


@pytest.mark.integration
@pytest.mark.parametrize("devices, cases", [(2, "quick"), (8, "minimal")])
def test_host_devices_give_the_one_device_numbers(devices, cases, one_device_results):
    (out,) = _run([sys.executable, WORKER, f"--cpu_devices={devices}", f"--cases={cases}"])
    assert out["device_count"] == devices
    assert len(out["results"]) == mesh_worker.num_results(cases)
    _assert_same(out["results"], one_device_results)


@pytest.mark.integration
def test_two_processes_give_the_one_process_numbers(one_device_results):
    outs = _run(
        [
            sys.executable,
            "-m",
            "fedjax_pals.launch",
            "--num_processes=2",
            "--",
            sys.executable,
            WORKER,
            "--cases=minimal",
        ]
    )
    assert sorted(o["process_index"] for o in outs) == [0, 1]
    for out in outs:
        assert out["process_count"] == 2 and out["device_count"] == 2
        assert len(out["results"]) == mesh_worker.num_results("minimal")
        _assert_same(out["results"], one_device_results)


_SHARED_DATA_CHECK = r"""
import json
import jax
import numpy as np
import fedjax_pals as fjp
from fedjax_pals import _host

fjp.configure_runtime(cpu_devices=2)
x = _host.aligned_empty((50, 4), np.float32)
x[...] = np.arange(200, dtype=np.float32).reshape(50, 4)
split = fjp.data.LabeledSplit(x, np.arange(50) % 3)  # read-only views, as the loaders return
data = fjp.engine.device_data(split.x, split.y, np.zeros((3, 2), np.int32), np.full(3, 2),
                       np.full((3, 3), 1 / 3, np.float32))
engine = fjp.engine.round_engine(fjp.fedavg(), fjp.logistic_regression((4,), 3),
                          fjp.LocalTraining(local_epochs=1, batch_size=2, learning_rate=0.1))
placed = engine.place_data(data)
host = split.x.ctypes.data
w = _host.aligned_empty((4, 2), np.float32)  # aligned but writeable: copied, not aliased
w[...] = 1.0
from fedjax_pals.engine import mesh as mesh_lib
on_one = jax.device_put(np.arange(3.0, dtype=np.float32), jax.devices()[1])
mixed = mesh_lib.replicate(
    {"placed": placed.train_x, "host": np.arange(5, dtype=np.int32), "one": on_one, "scalar": 2},
    engine.mesh,
)
replicated = mesh_lib.replicated(engine.mesh)
print(json.dumps({
    "mixed_placed_kept": mixed["placed"] is placed.train_x,
    "mixed_replicated": all(leaf.sharding == replicated for leaf in jax.tree_util.tree_leaves(mixed)),
    "mixed_values": [np.asarray(mixed[k].addressable_data(i)).tolist()
                     for k in ("host", "one", "scalar") for i in (0, 1)],
    "devices": len(placed.train_x.addressable_shards),
    "device_data_aliases_host": data.train_x.unsafe_buffer_pointer() == host,
    "shards_alias_host": [s.data.unsafe_buffer_pointer() == host
                          for s in placed.train_x.addressable_shards],
    "values_equal": bool(np.array_equal(np.asarray(placed.train_x.addressable_data(1)), x)),
    "writeable_copied": fjp.engine.device_data(w, np.zeros(4, np.int32), np.zeros((1, 4), np.int32),
        np.full(1, 4), np.ones((1, 3), np.float32)).train_x.unsafe_buffer_pointer()
        != w.ctypes.data,
}))
"""


def test_the_data_set_is_held_once_by_the_host_devices_of_a_process():
    """Replicas on host devices alias one host buffer (the loader's), not a copy per device."""
    (out,) = _run([sys.executable, "-c", _SHARED_DATA_CHECK])
    assert out["devices"] == 2
    assert out["device_data_aliases_host"]
    assert out["shards_alias_host"] == [True, True]
    assert out["values_equal"] and out["writeable_copied"]
    # `replicate` puts what is not on the mesh yet (host arrays, a one-device array, a Python
    # scalar) and leaves what is.
    assert out["mixed_placed_kept"] and out["mixed_replicated"]
    assert out["mixed_values"] == [[0, 1, 2, 3, 4]] * 2 + [[0.0, 1.0, 2.0]] * 2 + [2, 2]
