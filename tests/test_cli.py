"""Command-line mistakes of the mains: one `error:` line, exit status 2, before any data is read."""

import json
import os
import subprocess
import sys
import time

import pytest

from experiments import config_args
from fedjax_pals.experiment import config as config_lib
from fedjax_pals.experiment import sweep as sweep_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = set(config_lib.flatten(config_lib.default_config()))


def _check(*args, config="configs/demo.py"):
    argv = ["prog", f"--config={os.path.join(ROOT, config)}", *args]
    return config_args.check_config_argv(
        argv, "config", None, schema_paths=SCHEMA, sweep_keys=sweep_lib.SWEEP_KEYS
    )


def _main(module, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def _one_error_line(completed):
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr
    return lines[0]


@pytest.mark.parametrize(
    "arg, expected",
    [
        ("--config.training.learning_rat=0.1", "did you mean 'learning_rate'?"),
        ("--config.training.round=3", "did you mean 'rounds'?"),
        ("--config.trainin.rounds=3", "config has no key 'trainin' (did you mean 'training'?)"),
        ("--config.foo=1", "--config.foo: config has no key 'foo'"),
        ("--config.sweep.sedes=(0,1)", "'sedes' is not a sweep key (did you mean 'seeds'?)"),
        ("--config.sweep.grid.algorithm.lamb=(0.0,)", "did you mean 'algorithm.lam'?"),
        ("--config.training.rounds.x=3", "config.training.rounds is a value (4), not a section"),
    ],
)
def test_a_key_path_that_names_no_key_is_named_with_the_near_key(arg, expected):
    with pytest.raises(config_args.ConfigArgError) as info:
        start = time.perf_counter()
        _check(arg)
    assert time.perf_counter() - start < 1.0
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_existing_keys_pass_through_and_new_axes_over_config_keys_are_taken_out():
    argv, new = _check(
        "--config.training.rounds=2",
        "--config.sweep.grid.algorithm.lam=(0.0,)",
        "--config.sweep.axes.training.local_epochs",
        "(1, 2)",
        "--config.sweep.row=demo",
        "--quiet",
    )
    assert argv[2:] == ["--config.training.rounds=2", "--quiet"]
    assert new == {
        "sweep.grid.algorithm.lam": (0.0,),
        "sweep.axes.training.local_epochs": (1, 2),
        "sweep.row": "demo",
    }
    # A grid section gains a new axis; an axis it has is overridden by ml_collections.
    argv, new = _check(
        "--config.sweep.grid.training.batch_size=(4,)",
        "--config.sweep.grid.algorithm.lam=(0.1,)",
        config="configs/synthetic_fig9.py",
    )
    assert new == {"sweep.grid.training.batch_size": (4,)}
    assert argv[2:] == ["--config.sweep.grid.algorithm.lam=(0.1,)"]


def test_a_key_given_twice_keeps_only_the_last_value():
    # ml_collections would append (0, 1) and (5,) into seeds (0, 1, 5); absl's rule: last wins.
    argv, new = _check(
        "--config.sweep.seeds=(0,1)",
        "--config.training.rounds",
        "3",
        "--config.sweep.seeds=(5,)",
        "--config.training.rounds=2",
        "--config.sweep.row=a",
        "--config.sweep.row=b",
    )
    assert argv[2:] == ["--config.sweep.seeds=(5,)", "--config.training.rounds=2"]
    assert new == {"sweep.row": "b"}


def test_a_missing_or_broken_config_file_is_named(tmp_path):
    with pytest.raises(config_args.ConfigArgError, match="configs/dmo.py does not exist"):
        config_args.load_config_file("configs/dmo.py")
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config(:\n    pass\n")
    with pytest.raises(config_args.ConfigArgError, match=f"syntax error in {broken}, line 1"):
        config_args.load_config_file(str(broken))
    raising = tmp_path / "raising.py"
    raising.write_text("def get_config():\n    return {}['x']\n")
    with pytest.raises(config_args.ConfigArgError, match="get_config\\(\\) raised KeyError"):
        config_args.load_config_file(str(raising))


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--config.training.learning_rat=0.1"], "did you mean 'learning_rate'?"),
        (["--config.sweep.grid.algorithm.lamb=(0.0,)"], "did you mean 'algorithm.lam'?"),
        (["--config.training.rounds=abc"], "--config.training.rounds=abc"),
        (["--listt"], "Unknown command line flag 'listt'"),
    ],
)
def test_the_sweep_command_reports_a_command_line_mistake_in_one_line(args, expected):
    line = _one_error_line(_main("experiments.sweep", "--config=configs/demo.py", "--list", *args))
    assert expected in line


@pytest.mark.parametrize(
    "module, args, expected",
    [
        ("experiments.run", ["--workdir=w", "--cpu_devices=abc"], "--cpu_devices=abc: must be"),
        ("experiments.sweep", ["--workdir=w", "--cpu_devices=0"], "--cpu_devices=0: must be"),
        ("experiments.sweep", ["--workdir="], "--workdir needs a directory"),
        ("experiments.demo", ["--workdir="], "--workdir needs a directory"),
        ("experiments.run", ["--workdir=w", "--mlflow_tracking_uri="], "needs a tracking URI"),
        ("experiments.run", ["--workdir=w", "--process_id=-1"], "-1 is not >= 0"),
        ("experiments.run", ["--workdir=w", "extra"], "unexpected arguments"),
    ],
)
def test_runtime_flags_and_an_empty_workdir_are_refused_while_parsing(tmp_path, module, args, expected):
    args = [a.replace("--workdir=w", f"--workdir={tmp_path / 'w'}") for a in args]
    line = _one_error_line(_main(module, "--config=configs/demo.py", *args))
    assert expected in line
    assert not (tmp_path / "w").exists() and not os.path.exists(os.path.join(ROOT, "runs", "fedavg"))


@pytest.mark.parametrize(
    "module, args, expected",
    [
        ("experiments.compare", ["--tables="], "--tables needs at least one"),
        ("experiments.restricted_eval", ["--sweeps="], "--sweeps needs at least one"),
        ("experiments.restricted_eval", ["--sweeps=a", "--methods="], "--methods needs at least"),
    ],
)
def test_an_empty_list_flag_is_refused_in_one_line(tmp_path, module, args, expected):
    line = _one_error_line(_main(module, f"--workdir={tmp_path / 'w'}", *args))
    assert expected in line
    assert not (tmp_path / "w").exists()


def test_the_run_command_names_a_missing_config_file(tmp_path):
    line = _one_error_line(
        _main("experiments.run", "--config=configs/nope.py", f"--workdir={tmp_path / 'w'}")
    )
    assert "configs/nope.py does not exist" in line
    assert not (tmp_path / "w").exists()


def test_a_new_grid_axis_on_the_command_line_is_a_sweep_axis():
    completed = _main(
        "experiments.sweep",
        "--config=configs/demo.py",
        "--list",
        "--config.sweep.grid.algorithm.lam=(0.0,0.1)",
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "fedpals/lam=0.1/seed_1" in completed.stdout and "6 runs" in completed.stdout


@pytest.mark.parametrize(
    "module, args, expected",
    [  # modules of experiments.benchmarks
        ("scaling", ["--num_clients="], "--num_clients needs at least one"),
        ("scaling", ["--participants_curve=20000"], "exceeds --participants_curve_"),
        ("scaling", ["--rounds=x"], "--rounds=x"),
        ("scaling", ["--bogus=1"], "Unknown command line flag 'bogus'"),
        ("scaling", ["extra"], "unexpected arguments ['extra']"),
        ("solve_time", ["--lam_over_n=x"], "'x' is not a number"),
        ("solve_time", ["--num_clients="], "--num_clients needs at least one"),
        ("round", ["--output="], "--output needs a file path"),
        ("flower", ["--actors=0"], "0 is not >= 1"),
        ("torch_step", ["--bogus"], "unrecognized arguments: --bogus"),
        ("torch_step", ["--output="], "--output needs a file path"),
    ],
)
def test_the_measurement_commands_refuse_a_bad_flag_in_one_line_before_measuring(
    tmp_path, module, args, expected
):
    # Every output is pointed into tmp_path: a check that let the command start would write it.
    outputs = [f"--output={tmp_path / 'out.json'}"] if not any("--output" in a for a in args) else []
    if module in ("scaling", "solve_time"):
        outputs.append(f"--plot={tmp_path / 'plot'}")
    line = _one_error_line(_main(f"experiments.benchmarks.{module}", *outputs, *args, timeout=60))
    assert expected in line
    assert not list(tmp_path.iterdir())


def test_a_warning_is_a_warning_line_not_an_absl_log_line(tmp_path):
    config = tmp_path / "grid_sweep.py"
    config.write_text(
        "import ml_collections\nimport fedjax_pals as fjp\n\n\ndef get_config():\n"
        "    c = fjp.default_config()\n    c.dataset.name = 'synthetic'\n"
        "    c.sweep = ml_collections.ConfigDict(dict(seeds=(0,), methods=('fedprox',)))\n"
        "    return c\n"
    )
    completed = _main("experiments.sweep", f"--config={config}", "--list")
    assert completed.returncode == 0, completed.stderr[-2000:]
    (line,) = [l for l in completed.stderr.splitlines() if "fedprox" in l]
    assert line.startswith("warning: the sweep selects fedprox without the grid"), line


# configs/synthetic.py with a user's feature whose Monitor.update_state returns a state of
# another shape (its parameters cut to one column): registered by the config file itself.
_SHRINKING_FEATURE_CONFIG = '''
import dataclasses
import runpy

import jax

import fedjax_pals as fjp


@dataclasses.dataclass(frozen=True)
class Shrink(fjp.Hyperparameters):
    shrink: bool | None = fjp.hyperparameter(None, kind="bool", optional=True)


class ShrinkMonitor(fjp.Monitor):
    def update_state(self, round_index, state_of):
        state = state_of()
        return state._replace(params=jax.tree_util.tree_map(lambda p: p[..., :1], state.params))


fjp.register_feature(fjp.Feature(
    "shrink", "Shrink", Shrink, lambda values, facts: dict(values), stage="algorithm",
    monitor=lambda hp, task: ShrinkMonitor()), replace=True)


def get_config():
    config = runpy.run_path({synthetic!r})["get_config"]()
    config.algorithm.shrink = True
    config.training.rounds = 1
    return config
'''


def test_a_feature_s_update_state_of_another_shape_is_one_error_line_naming_it(tmp_path):
    config = tmp_path / "shrink.py"
    config.write_text(_SHRINKING_FEATURE_CONFIG.format(
        synthetic=os.path.join(ROOT, "configs", "synthetic.py")))
    completed = _main("experiments.run", f"--config={config}", f"--workdir={tmp_path / 'w'}",
                      "--quiet")
    assert completed.returncode == 1, completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr, completed.stderr[-2000:]
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith("error: feature 'shrink': its Monitor.update_state returned a state "
                           "whose params["), line
    assert "(before round 1)" in line
    # A sweep reports such a run as failed, with this message.
    from fedjax_pals.experiment.task import TaskError

    assert sweep_lib._failure_status(TaskError(line[len("error: "):])) == "failed"


# -- a config file that imports a module beside it; the commands the hints name -----------------

BIN = os.path.dirname(sys.executable)

_MY_EXT = """
import fedjax_pals as fjp

fjp.register_method(fjp.Method("my_avg", "MyAvg", lambda hp, context: fjp.fedavg()))
"""
_MY_CFG = """
import fedjax_pals as fjp
import my_ext  # noqa: F401  (beside this file: registers my_avg)


def get_config():
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.algorithm.name = "my_avg"
    config.training.rounds = 1
    config.training.batch_size = 8
    return config
"""
_MY_SWEEP = """
import ml_collections
import my_cfg  # beside this file


def get_config():
    config = my_cfg.get_config()
    config.sweep = ml_collections.ConfigDict(dict(seeds=(0,), methods=("my_avg",)))
    return config
"""


@pytest.fixture
def users_files(tmp_path):
    """tmp/ext holding my_ext.py (registers the method my_avg), my_cfg.py and my_sweep.py that
    import it, and tmp/elsewhere, a directory to run the commands from."""
    ext = tmp_path / "ext"
    ext.mkdir()
    (ext / "my_ext.py").write_text(_MY_EXT)
    (ext / "my_cfg.py").write_text(_MY_CFG)
    (ext / "my_sweep.py").write_text(_MY_SWEEP)
    (tmp_path / "elsewhere").mkdir()
    return tmp_path


def _command(command, cwd, timeout=600):
    # The venv's bin first on PATH, as when it is active: the hints name `fedjax-pals-sweep`.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SGE_"))},
        "PATH": BIN + os.pathsep + os.environ.get("PATH", ""),
        "JAX_PLATFORMS": "cpu",
    }
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env)


def test_the_config_file_s_directory_goes_first_on_the_import_path_once(tmp_path, monkeypatch):
    config = tmp_path / "my_cfg.py"
    config.write_text("def get_config():\n    return {}\n")
    path = ["/somewhere", "/else"]
    assert config_args.add_config_directory(f"{config}:argument", path) == str(tmp_path)
    assert path == [str(tmp_path), "/somewhere", "/else"]
    config_args.add_config_directory(str(config), path)  # again: not a second entry
    assert path == [str(tmp_path), "/somewhere", "/else"]
    # `python -m` run from that directory: its '' entry is it; nothing is added.
    monkeypatch.chdir(tmp_path)
    path = ["", "/somewhere"]
    config_args.add_config_directory("my_cfg.py", path)
    assert path == ["", "/somewhere"]
    # No such file: nothing (the config check names it).
    assert config_args.add_config_directory("nope.py", path) is None and path == ["", "/somewhere"]


def test_a_module_the_config_file_cannot_import_is_named_where_it_failed_with_a_hint(
    tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(tmp_path))  # as the launcher does (add_config_directory)
    (tmp_path / "my_ext.py").write_text("import my_helpers  # not there\n")
    config = tmp_path / "my_cfg.py"
    config.write_text("import my_ext\n\n\ndef get_config():\n    return {}\n")
    with pytest.raises(config_args.ConfigArgError) as info:
        config_args.load_config_file(str(config), command="fedjax-pals-run")
    message, hint = str(info.value), info.value.hint
    assert message.endswith(
        "raised ModuleNotFoundError: No module named 'my_helpers' "
        f"(at {tmp_path / 'my_ext.py'}, line 1: import my_helpers  # not there)"
    ), message
    assert hint.startswith(f"hint: 'my_helpers' is looked for beside the config file (in {tmp_path})")
    assert "PYTHONPATH=/its/directory fedjax-pals-run ..." in hint


def test_the_command_says_what_to_do_about_a_module_it_cannot_import(users_files):
    (users_files / "ext" / "my_ext.py").write_text("import my_helpers\n")
    completed = _command(
        [os.path.join(BIN, "fedjax-pals-run"), "--config=../ext/my_cfg.py", "--workdir=w"],
        users_files / "elsewhere", timeout=300,
    )
    assert completed.returncode == 2, completed.stderr[-2000:]
    error, hint = completed.stderr.strip().splitlines()
    assert error.startswith("error: --config=../ext/my_cfg.py: loading ../ext/my_cfg.py raised "
                            "ModuleNotFoundError: No module named 'my_helpers' (at ")
    assert hint.startswith("hint: 'my_helpers' is looked for beside the config file")
    assert "PYTHONPATH=/its/directory fedjax-pals-run ..." in hint
    assert not (users_files / "elsewhere" / "w").exists()


@pytest.mark.parametrize("main_module, argv0, path_has_bin, main, expected", [
    ("experiments.sweep", "/r/experiments/sweep.py", True, "sweep", "python -m experiments.sweep"),
    ("experiments.run", "/r/experiments/run.py", True, "sweep", "python -m experiments.sweep"),
    ("fedjax_pals_experiments.sweep", "/x/sweep.py", True, "sweep",
     "python -m fedjax_pals_experiments.sweep"),
    ("", os.path.join(BIN, "fedjax-pals-sweep"), True, "sweep", "fedjax-pals-sweep"),
    ("", os.path.join(BIN, "fedjax-pals-run"), True, "sweep", "fedjax-pals-sweep"),
    ("", os.path.join(BIN, "fedjax-pals-sweep"), False, "sweep",
     os.path.join(BIN, "fedjax-pals-sweep")),  # the venv not active: the script's path
    ("", os.path.join(BIN, "fedjax-pals-run"), True, "benchmarks.solve_time",
     "fedjax-pals-benchmark-solve-time"),
    ("", "/usr/bin/pytest", True, "sweep", "fedjax-pals-sweep"),  # called from Python
])
def test_a_hint_names_the_launcher_actually_used(
    monkeypatch, main_module, argv0, path_has_bin, main, expected
):
    from experiments import cli

    monkeypatch.setenv("PATH", (BIN + os.pathsep if path_has_bin else "") + "/usr/bin:/bin")
    command = cli.command_for(main, argv0=argv0, main_module=main_module)
    if expected.startswith("python -m"):  # the interpreter as typed: `python` on that PATH
        expected = expected.replace("python", cli._python(), 1)
        assert cli._python() in ("python", "python3", os.path.basename(sys.executable))
    assert command == expected


@pytest.mark.integration
def test_a_config_importing_a_module_beside_it_runs_from_any_directory(users_files):
    """The layout of docs/extending.md, run from another directory: the console script and
    `python -m experiments.run`; a sweep's shard, whose `--collect` hint names the launcher
    used, and the collect from a third directory (it imports my_ext from where it was found)."""
    ext, elsewhere = users_files / "ext", users_files / "elsewhere"
    run = _command(
        [os.path.join(BIN, "fedjax-pals-run"), "--config=../ext/my_cfg.py", "--workdir=w", "--quiet"],
        elsewhere,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with open(elsewhere / "w" / "results.json") as f:
        assert json.load(f)["config"]["algorithm"]["name"] == "my_avg"
    run = _command([sys.executable, "-m", "experiments.run", f"--config={ext / 'my_cfg.py'}",
                    f"--workdir={users_files / 'w2'}", "--quiet"], ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert os.path.exists(users_files / "w2" / "results.json")

    sweep = str(users_files / "sweep")
    shard = _command([os.path.join(BIN, "fedjax-pals-sweep"), "--config=../ext/my_sweep.py",
                      f"--workdir={sweep}", "--shard=0/1", "--quiet"], elsewhere)
    assert shard.returncode == 0, shard.stderr[-3000:]
    assert shard.stdout.strip().endswith(
        f"Once every shard has ended: fedjax-pals-sweep --workdir={sweep} --collect"
    ), shard.stdout
    # Again as `python -m experiments.sweep` (its run is done: skipped): the hint says so.
    shard = _command([sys.executable, "-m", "experiments.sweep", f"--config={ext / 'my_sweep.py'}",
                      f"--workdir={sweep}", "--shard=0/1", "--quiet"], ROOT)
    assert shard.returncode == 0, shard.stderr[-3000:]
    hint = shard.stdout.strip().splitlines()[-1]
    assert hint.endswith(f" -m experiments.sweep --workdir={sweep} --collect"), hint
    collected = _command([os.path.join(BIN, "fedjax-pals-sweep"), f"--workdir={sweep}",
                          "--collect", "--quiet"], users_files)
    assert collected.returncode == 0, collected.stderr[-3000:]
    assert "| Synthetic | **" in collected.stdout and os.path.exists(os.path.join(sweep, "table.md"))
