"""A user's modules: which registered what, which a sweep needs, and importing them again."""

import json
import os
import subprocess
import sys

import ml_collections
import pytest

import fedjax_pals as fjp
from fedjax_pals import extensions, models
from fedjax_pals.algorithms import registry
from fedjax_pals.experiment import sweep as sweep_lib
from fedjax_pals.experiment.config import flatten

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER_MODULE = """
import dataclasses
import fedjax_pals as fjp

@dataclasses.dataclass(frozen=True)
class H(fjp.Hyperparameters):
    {prefix}_scale: float = fjp.hyperparameter(1.0, low=0.0, low_open=True, doc="scale")

fjp.register_method(fjp.Method(name="{prefix}_method", label="M", build=lambda hp, c: fjp.fedavg(),
                               hyperparameters=H), replace=True)
fjp.register_model("{prefix}_model", fjp.models.MODELS["logistic_regression"], replace=True)
"""


@pytest.fixture
def user_module(tmp_path):
    """Writes and imports a user module (a package `userpkg.ext` under tmp_path) registering a
    method and a model; everything is unregistered and unimported afterwards."""
    prefix = f"u{os.getpid()}"
    package = tmp_path / "src" / "userpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ext.py").write_text(USER_MODULE.format(prefix=prefix))
    sys.path.insert(0, str(tmp_path / "src"))
    try:
        __import__("userpkg.ext")
        yield prefix, str(tmp_path / "src"), str(package / "ext.py")
    finally:
        sys.path.remove(str(tmp_path / "src"))
        for name in ("userpkg.ext", "userpkg"):
            sys.modules.pop(name, None)
        registry._METHODS.pop(f"{prefix}_method", None)
        models.MODELS.pop(f"{prefix}_model", None)
        extensions.forget_registration("method", f"{prefix}_method")
        extensions.forget_registration("model", f"{prefix}_model")


def test_only_registrations_from_outside_the_package_are_remembered(user_module):
    prefix, root, file = user_module
    mine = {(r.kind, r.name): r for r in extensions.registrations()}
    assert set(mine) >= {("method", f"{prefix}_method"), ("model", f"{prefix}_model")}
    assert not any(r.module.startswith("fedjax_pals") for r in mine.values())
    assert ("method", "fedpals") not in mine and ("feature", "fedpals_lambda") not in mine
    method = mine[("method", f"{prefix}_method")]
    assert method.module == "userpkg.ext" and method.file == file
    assert method.config_keys == (f"algorithm.{prefix}_scale",)


def test_a_sweep_records_the_modules_its_runs_need_with_the_path_to_import_them_from(user_module):
    prefix, root, file = user_module
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.model = f"{prefix}_model"
    config.sweep = ml_collections.ConfigDict(dict(seeds=(0,), methods=(f"{prefix}_method",)))
    (module,) = sweep_lib.expand(config).imports
    assert module.module == "userpkg.ext" and module.file == file and module.path == root
    assert set(module.registers) == {f"method '{prefix}_method'", f"model '{prefix}_model'"}
    # Named by nothing of the runs: not needed (its hyperparameter key is then absent too).
    plain = {"dataset": {"name": "synthetic"}, "algorithm": {"name": "fedavg"}}
    assert extensions.modules_for([flatten(plain)]) == ()
    # A resolved config holds every registered key (None where unused): not a need.
    resolved = fjp.validate_config(plain).to_dict()
    assert resolved["algorithm"][f"{prefix}_scale"] is None
    assert extensions.modules_for(resolved=[flatten(resolved)]) == ()
    # A config holding the method's key (a config made after the import) needs it.
    assert extensions.modules_for([{f"algorithm.{prefix}_scale": 1.0}])[0].path == root
    # A method key that puts a server optimiser in front names it as well.
    assert extensions.modules_for(
        [flatten(plain)], [f"fedadam_{prefix}_method"])[0].module == "userpkg.ext"


def _import_in_child(modules, cwd):
    code = (
        "import json, sys\n"
        "from fedjax_pals import extensions\n"
        "modules = [extensions.ExtensionModule.from_json(m) for m in json.loads(sys.argv[1])]\n"
        "try:\n"
        "    extensions.import_modules(modules)\n"
        "except extensions.ExtensionImportError as error:\n"
        "    print('ERROR', error); sys.exit(2)\n"
        "import fedjax_pals as fjp\n"
        "print(sorted(fjp.registered_methods()))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps([m.to_json() for m in modules])],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )


def test_another_process_in_another_directory_imports_the_recorded_modules(user_module, tmp_path):
    prefix, root, file = user_module
    modules = extensions.describe(r for r in extensions.registrations() if r.module == "userpkg.ext")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    child = _import_in_child(modules, elsewhere)
    assert child.returncode == 0, child.stderr[-2000:]
    assert f"'{prefix}_method'" in child.stdout


def test_a_module_loaded_from_its_file_is_loaded_from_its_file_again(tmp_path):
    path = tmp_path / "my config.py"  # not an importable name
    path.write_text(USER_MODULE.format(prefix="fromfile"))
    module = extensions.ExtensionModule("config_loaded", str(path), None, ("method 'fromfile_method'",))
    child = _import_in_child([module], tmp_path)
    assert child.returncode == 0, child.stderr[-2000:]
    assert "'fromfile_method'" in child.stdout


@pytest.mark.parametrize(
    "module, match",
    [
        (extensions.ExtensionModule("gone", "/nonexistent/gone.py", "/nonexistent", ("method 'x'",)),
         r"cannot import gone \(/nonexistent/gone.py\), which registers method 'x': "
         "ModuleNotFoundError"),
        (extensions.ExtensionModule("loose", "/nonexistent/a b.py", None, ("model 'y'",)),
         r"cannot import loose \(/nonexistent/a b.py\), which registers model 'y': "
         "FileNotFoundError"),
        (extensions.ExtensionModule("__main__", "/home/me/run.py", None, ("method 'z'",)),
         r"method 'z' is registered in __main__ \(/home/me/run.py\), which this process cannot "
         "import; move the registration into a module"),
    ],
)
def test_a_module_that_cannot_be_imported_is_one_line_naming_it_and_its_file(module, match):
    with pytest.raises(extensions.ExtensionImportError, match=match) as raised:
        extensions.import_modules([module])
    assert "\n" not in str(raised.value)


def test_a_module_that_raises_on_import_is_named_with_its_error(tmp_path):
    (tmp_path / "broken_ext.py").write_text("raise RuntimeError('needs the login node')\n")
    module = extensions.ExtensionModule(
        "broken_ext", str(tmp_path / "broken_ext.py"), str(tmp_path), ("method 'b'",)
    )
    try:
        with pytest.raises(extensions.ExtensionImportError,
                           match="broken_ext .*: RuntimeError: needs the login node"):
            extensions.import_modules([module])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("broken_ext", None)


def test_a_damaged_record_of_imports_is_one_line(tmp_path):
    path = tmp_path / "sweep_imports.json"
    assert extensions.read_imports(str(path)) == ()
    for text in ("{", "[]", '{"modules": [{"file": "x"}]}'):
        path.write_text(text)
        with pytest.raises(extensions.ExtensionImportError, match=str(path)):
            extensions.read_imports(str(path))


def test_the_record_round_trips(tmp_path):
    modules = (extensions.ExtensionModule("a.b", "/x/a/b.py", "/x", ("method 'm'", "model 'n'")),)
    (tmp_path / "i.json").write_text(json.dumps(extensions.imports_record(modules)))
    assert extensions.read_imports(str(tmp_path / "i.json")) == modules


@pytest.mark.parametrize(
    "module, file, root",
    [("a.b", "/x/a/b.py", "/x"), ("a", "/x/a/__init__.py", "/x"), ("m", "/x/m.py", "/x"),
     ("config_check", "/x/my_config.py", None), ("a.b", None, None)],
)
def test_the_import_root_is_the_path_entry_that_finds_the_file(module, file, root):
    assert extensions._import_root(module, file) == root


def test_a_sweep_of_built_in_methods_records_no_imports(user_module, tmp_path):
    prefix, root, file = user_module
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.sweep = ml_collections.ConfigDict(dict(seeds=(0,), methods=(f"{prefix}_method",)))
    path = tmp_path / sweep_lib.IMPORTS_FILE
    sweep_lib.expand(config).record_imports(str(tmp_path))
    assert [m.module for m in extensions.read_imports(str(path))] == ["userpkg.ext"]
    # The same workdir, now a sweep of FedAvg (a config that does not hold the user's key).
    built_in = {"dataset": {"name": "synthetic"}, "sweep": {"seeds": (0,), "methods": ("fedavg",)}}
    sweep_lib.expand(built_in).record_imports(str(tmp_path))
    assert not path.exists()  # no stale record of the earlier sweep's modules
