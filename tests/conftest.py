"""Settings for the whole test suite (read before any test module imports JAX).

Every program a test compiles goes into JAX's persistent compilation cache when one is set
(scripts/test.sh and CI point $JAX_COMPILATION_CACHE_DIR at .cache/jax), not only those that
took JAX's default 1 s to compile: tests build many identical small programs through fresh
`jax.jit` objects (a new engine, a new closure, another test file on the same pytest worker,
a child process), and JAX's in-memory caches are keyed on the function object, so each of
those compiled again; the persistent cache is keyed on the program. The launchers already use
0 (`fedjax_pals.runtime.CACHE_MIN_COMPILE_SECONDS`); this gives the pytest workers, and the
child processes that inherit their environment, the same. A value set by the caller wins.
A cache hit still reports `/jax/core/compile/backend_compile_duration`, so the tests that count
compilations (`fjp.engine.CompilationCounter`) count the same.
"""

import importlib.metadata
import os
import pathlib

import pytest

os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# XLA:CPU's legacy IR emitters instead of its MLIR fusion emitters, in the suite's
# fast-compile mode (XLA_FLAGS holds --xla_backend_optimization_level=0, as scripts/test.sh
# and CI set it; FEDJAX_PALS_TEST_XLA_DEFAULT=1 leaves XLA at its defaults and this too). The
# fusion emitters take most of the compile time of the suite's small programs: FedPALS'
# solver compiles in 0.8 s instead of 2.5 s, a synthetic FedPALS run in 6.3 CPU s instead of
# 10.1, with bit-identical losses (docs/decisions/0089-legacy-emitters-for-test-programs.md).
# The flag is XLA's of jaxlib 0.10 (the pinned stack); XLA aborts on a flag it does not know,
# so another jaxlib gets the flags as they were given. Child processes inherit XLA_FLAGS.
_O0_FLAG = "--xla_backend_optimization_level=0"  # scripts/test.sh's
_FAST_COMPILE_FLAG = "--xla_cpu_use_fusion_emitters=false"
# The flags of the suite's fast-compile mode, which no user runs with (tests/test_readme.py runs
# the README's Fashion-MNIST commands without them).
FAST_COMPILE_XLA_FLAGS = (_O0_FLAG, _FAST_COMPILE_FLAG)
_xla_flags = os.environ.get("XLA_FLAGS", "").split()
if (
    _O0_FLAG in _xla_flags
    and not any(f.startswith("--xla_cpu_use_fusion_emitters") for f in _xla_flags)
    and importlib.metadata.version("jaxlib").startswith("0.10.")
):
    os.environ["XLA_FLAGS"] = " ".join([*_xla_flags, _FAST_COMPILE_FLAG])

# The order in which pytest-xdist hands the test files to its workers (`--dist loadfile`, as
# scripts/test.sh runs the suite): the costliest first, so that no long file starts last while
# the other worker runs out of work (the suite's wall time on 2 cores is that of the busier
# worker). xdist's own order (most tests first) started tests/test_shards.py, one test of
# 2 minutes, near the end of the integration pass. The numbers are each file's cold cost in
# CPU seconds on the 2-core CI machine (docs/decisions/0088-costliest-test-files-first.md); a
# file not listed runs after those listed, in collection order. Any order is correct: this
# only balances the workers.
_FILE_COST = {
    "quick": {
        "test_server_weights.py": 158,
        "test_engine.py": 128,
        "test_adaptive_lambda.py": 78,
        "test_partitions.py": 71,
        "test_benchmark.py": 62,
        "test_training.py": 61,
        "test_shards.py": 56,
        "test_train.py": 55,
        "test_cli.py": 53,
        "test_server_optimizers.py": 51,
        "test_feddisco.py": 42,
        "test_registry.py": 41,
        "test_backends.py": 40,
        "test_restore.py": 37,
        "test_privacy.py": 34,
        "test_experiments.py": 33,
        "test_launch_faults.py": 31,
        "test_fedpals.py": 30,
        "test_models.py": 28,
        "test_engine_record.py": 27,
        "test_launcher_flags.py": 27,
        "test_workdir.py": 26,
        "test_private_marginals.py": 24,
        "test_fedlc.py": 22,
        "test_target_estimation.py": 21,
        "test_diskspace.py": 20,
    },
    "integration": {
        "test_sweep.py": 325,
        "test_composition.py": 110,
        "test_mesh.py": 262,
        "test_readme.py": 198,
        "test_shards.py": 136,
        "test_experiments.py": 127,
        "test_submission.py": 122,
        "test_train.py": 76,
        "test_benchmark.py": 66,
        "test_training.py": 39,
        "test_launch_faults.py": 38,
        "test_mlflow_writer.py": 28,
        "test_scaling.py": 20,
        "test_writers.py": 19,
        "test_linalg.py": 16,
        "test_runtime.py": 9,
    },
}


def pytest_configure(config):
    # Keep the collection order below (xdist would reorder the files by their number of tests).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # configs/beyond_natural_femnist.py reads a FEMNIST-shaped LEAF copy from
    # $FEDJAX_PALS_FEMNIST_DIR: the config tests get 16 writers, written once per process.
    if not os.environ.get("FEDJAX_PALS_FEMNIST_DIR"):
        import tempfile

        from experiments.benchmarks import femnist_copy

        directory = os.path.join(tempfile.mkdtemp(prefix="fjp_femnist_"), "leaf")
        femnist_copy.write_leaf(pathlib.Path(directory), 16, seed=0)
        os.environ["FEDJAX_PALS_FEMNIST_DIR"] = directory


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the costs of the pass that runs
def pytest_collection_modifyitems(config, items):
    position, passes = {}, {}
    for item in items:
        name = item.path.name
        position.setdefault(name, len(position))
        kind = "integration" if item.get_closest_marker("integration") else "quick"
        passes.setdefault(name, set()).add(kind)
    cost = {name: sum(_FILE_COST[k].get(name, 0) for k in kinds) for name, kinds in passes.items()}
    # Stable: a file's tests keep their order, files of equal cost their collection order.
    items.sort(key=lambda item: (-cost[item.path.name], position[item.path.name]))


@pytest.fixture
def registries_restored():
    """Whatever a test registers (data sets, partition schemes) is gone after it: the
    registries are process-wide."""
    from fedjax_pals.data import datasets as datasets_lib, partitions as partitions_lib

    saved = (dict(datasets_lib._REGISTERED), dict(partitions_lib._PARTITIONS))
    yield
    for live, before in zip((datasets_lib._REGISTERED, partitions_lib._PARTITIONS), saved):
        live.clear()
        live.update(before)


def random_image_task(seed):
    """A small 10-class image task of random 8x8 examples drawn from the seed (the engine's
    tests: test_training.py, test_batch_mates.py)."""
    import fedjax_pals as fjp
    import numpy as np

    rng = np.random.default_rng(seed)
    train = fjp.LabeledSplit(
        rng.normal(size=(1200, 8, 8, 1)).astype(np.float32), np.repeat(np.arange(10), 120)
    )
    test = fjp.LabeledSplit(
        rng.normal(size=(600, 8, 8, 1)).astype(np.float32), np.repeat(np.arange(10), 60)
    )
    return fjp.Dataset("random", train, test, 10, "test")
