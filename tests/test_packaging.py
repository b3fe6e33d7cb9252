"""pyproject.toml: what an install puts into the environment, and the launchers it provides."""

import ast
import os
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _main_module(module: str) -> ast.Module:
    """The source of experiments/<module>.py (read, not imported: each main defines flags)."""
    with open(os.path.join(ROOT, "experiments", *module.split(".")) + ".py") as f:
        return ast.parse(f.read())


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_an_install_puts_no_top_level_experiments_into_the_environment(tmp_path):
    # A researcher's own experiments/ folder is a common name: ours is fedjax_pals_experiments.
    probe = "import importlib.util; print(importlib.util.find_spec('experiments'))"
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert completed.stdout.strip() == "None", completed.stderr[-2000:]
    packages = _pyproject()["tool"]["setuptools"]["packages"]
    assert not [p for p in packages if p.split(".")[0] == "experiments"]


@pytest.fixture
def users_own_experiments(tmp_path):
    """A directory holding the user's own experiments/ package, whose every module fails."""
    own = tmp_path / "experiments"
    own.mkdir()
    (own / "__init__.py").write_text("")
    for name in ("run", "sweep", "flags", "cli"):
        (own / f"{name}.py").write_text("raise SystemExit('the user experiments')\n")
    return tmp_path


@pytest.mark.parametrize("script, module, flag", [
    ("fedjax-pals-run", "run", "--workdir"),
    ("fedjax-pals-sweep", "sweep", "--shard"),
    ("fedjax-pals-benchmark-round", "benchmarks.round", "--max_seconds_per_case"),
])
def test_the_launchers_work_from_a_directory_holding_the_users_own_experiments(
    users_own_experiments, script, module, flag
):
    entry = _pyproject()["project"]["scripts"][script]
    assert entry == f"fedjax_pals_experiments.{module}:entry"
    for command in ([os.path.join(BIN, script)],
                    [sys.executable, "-m", f"fedjax_pals_experiments.{module}"]):
        completed = subprocess.run(
            [*command, "--help"], capture_output=True, text=True, timeout=300,
            cwd=users_own_experiments,
        )
        assert completed.returncode == 0, completed.stderr[-2000:]
        assert flag in completed.stdout and "the user experiments" not in completed.stderr
    # The help is the module's own, as `python -m experiments.<module>` prints it.
    first_line = ast.get_docstring(_main_module(module)).splitlines()[0]
    assert completed.stdout.lstrip().startswith(first_line)


def test_every_console_script_names_the_entry_function_of_a_main():
    scripts = _pyproject()["project"]["scripts"]
    assert len(scripts) >= 11
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        package, _, main = module.partition(".")
        assert package == "fedjax_pals_experiments" and function == "entry", name
        tree = _main_module(main)
        assert any(isinstance(node, ast.FunctionDef) and node.name == "entry"
                   for node in tree.body), name
        # Named after its module: fedjax-pals-unknown-target-report, -benchmark-solve-time.
        assert name == "fedjax-pals-" + main.replace("benchmarks.", "benchmark-").replace("_", "-")


def test_one_version_in_pyproject_the_package_and_the_changelog_s_newest_entry():
    import re

    import fedjax_pals as fjp

    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        newest = re.search(r"^## (\d+\.\d+\.\d+)\b", f.read(), re.M).group(1)
    assert _pyproject()["project"]["version"] == fjp.__version__ == newest
