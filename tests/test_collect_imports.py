"""`--collect` (fjp.collect_sweep) imports the user modules the sweep recorded before it expands
the recorded config: a unit test, no training (before it, only the integration matrix caught
the import's removal)."""

import json
import sys

import pytest

import fedjax_pals as fjp
from fedjax_pals import extensions
from fedjax_pals.algorithms import registry
from fedjax_pals.experiment import shards as shards_lib
from fedjax_pals.experiment import sweep as sweep_lib

MODULE = "fjp_test_collect_probe_extension"
METHOD = "collect_probe"

SOURCE = f'''
import fedjax_pals as fjp


def build(hyperparameters, context):
    return fjp.fedavg()


fjp.register_method(fjp.Method({METHOD!r}, "Collect probe", build))
'''


@pytest.fixture
def recorded_sweep(tmp_path):
    """A sweep workdir as run_sweep leaves it before any run has ended: its config (naming a
    user's method) in sweep.json and the user's module in sweep_imports.json; the module not
    imported in this process."""
    file = tmp_path / f"{MODULE}.py"
    file.write_text(SOURCE)
    workdir = tmp_path / "sweep"
    (workdir / "runs").mkdir(parents=True)
    config = {"dataset": {"name": "synthetic"},
              "sweep": {"seeds": [0], "methods": [METHOD]}}
    (workdir / "sweep.json").write_text(json.dumps(config))
    module = extensions.ExtensionModule(MODULE, str(file), None, (f"method {METHOD!r}",))
    (workdir / sweep_lib.IMPORTS_FILE).write_text(
        json.dumps(extensions.imports_record([module])))
    assert MODULE not in sys.modules and METHOD not in registry.registered_methods()
    yield str(workdir)
    sys.modules.pop(MODULE, None)
    registry._METHODS.pop(METHOD, None)
    extensions._REGISTRATIONS.pop(("method", METHOD), None)


def test_import_recorded_modules_imports_the_recorded_module(recorded_sweep):
    (module,) = sweep_lib.import_recorded_modules(recorded_sweep)
    assert module.module == MODULE and MODULE in sys.modules
    assert METHOD in registry.registered_methods()


def test_collect_imports_the_recorded_modules_before_it_expands_the_sweep(recorded_sweep):
    # Without the import, expanding the recorded config fails on the unknown method; with it,
    # collect gets as far as the runs, none of which has ended.
    with pytest.raises(shards_lib.SweepIncompleteError, match="seed_0"):
        fjp.collect_sweep(recorded_sweep)
    assert METHOD in registry.registered_methods()
