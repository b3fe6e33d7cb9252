"""pyproject.toml: what an install puts into the environment, and the launchers it provides."""

import ast
import os
import subprocess
import sys
import tomllib

import pytest

from experiments import cli

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
        assert cli.script_name(main) == name  # what the hints name (cli.command_for)


def test_one_version_in_pyproject_the_package_and_the_changelog_s_newest_entry():
    import re

    import fedjax_pals as fjp

    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        newest = re.search(r"^## \[(\d+\.\d+\.\d+)\] - ", f.read(), re.M).group(1)
    assert _pyproject()["project"]["version"] == fjp.__version__ == newest


# -- scripts/test.sh: a selection is one pytest invocation, the whole suite two ------------------

_FAKE_PYTHON = """#!/usr/bin/env bash
# Records each invocation's arguments (one line, separated by \\x1f) and exits with $FAKE_STATUS.
{ printf '%s\\x1f' "$@"; printf '\\n'; } >> "$FAKE_LOG"
exit "${FAKE_STATUS:-0}"
"""


@pytest.fixture
def test_script(tmp_path):
    """A copy of scripts/test.sh in a tree of its own: its set-up a no-op, its venv's python a
    stand-in that records how it was called (no pytest runs)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "test.sh").write_text(
        open(os.path.join(ROOT, "scripts", "test.sh")).read())
    (tmp_path / "scripts" / "setup.sh").write_text("exit 0\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_cli.py").write_text("")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(_FAKE_PYTHON)
    python.chmod(0o755)

    def run(*args, status=0, passes=None):
        log = tmp_path / "log"
        log.unlink(missing_ok=True)
        env = {**os.environ, "FEDJAX_PALS_VENV": str(python.parent.parent),
               "FAKE_LOG": str(log), "FAKE_STATUS": str(status)}
        env.pop("FEDJAX_PALS_TEST_PASSES", None)
        if passes is not None:
            env["FEDJAX_PALS_TEST_PASSES"] = passes
        done = subprocess.run(["bash", str(tmp_path / "scripts" / "test.sh"), *args],
                              capture_output=True, text=True, timeout=120, env=env)
        calls = [line.split("\x1f")[:-1] for line in log.read_text().splitlines()]
        return done, calls

    return run


SPLIT = [["-m", "not integration"], ["-m", "integration"]]


@pytest.mark.parametrize("args, invocations", [
    ((), SPLIT),
    (("-p", "no:cacheprovider"), SPLIT),  # CI's: both passes, fully
    (("-x", "-n", "0", "--tb", "short", "-rA"), SPLIT),
    (("--basetemp", "scripts"), SPLIT),  # an option's value that is a path: no selection
    (("-W", "error::DeprecationWarning"), SPLIT),
    (("-k", "not fedprox"), SPLIT),  # most of the suite
    (("-k", "fedprox"), [[]]),
    (("-p", "no:cacheprovider", "-kfedprox"), [[]]),
    (("-xk", "fedprox"), [[]]),
    (("tests/test_cli.py",), [[]]),
    (("tests/test_cli.py::test_x", "-x"), [[]]),
    (("-m", "integration"), [[]]),  # the user's -m alone, not after ours
    (("--lf",), [[]]),
])
def test_the_test_script_runs_a_selection_as_one_invocation(test_script, args, invocations):
    done, calls = test_script(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(calls) == len(invocations), calls
    for call, marker in zip(calls, invocations):
        assert call[:3] == ["-m", "pytest", "-q"] and call[3:7] == ["-n", "2", "--dist", "loadfile"]
        assert call[7:] == [*marker, *args], call


def test_the_test_script_reports_a_selection_that_selects_nothing(test_script):
    done, calls = test_script("-k", "nothing_named_so", status=5)
    assert done.returncode == 5 and len(calls) == 1
    assert "[test] error: no test selected by -k nothing_named_so" in done.stderr
    done, calls = test_script("-x", status=5)  # two passes, neither selecting a test
    assert done.returncode == 5 and len(calls) == 2
    # One pass asked for (CI's Python 3.13 quick pass): a selection runs in it.
    done, calls = test_script("-k", "fedprox", passes="quick")
    assert done.returncode == 0 and [c[7:] for c in calls] == [["-m", "not integration", "-k",
                                                                 "fedprox"]]
