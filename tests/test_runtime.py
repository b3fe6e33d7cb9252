"""configure_runtime's checks and the local multi-process launcher."""

import os
import subprocess
import sys

import pytest

from fedjax_pals import launch, runtime


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(cpu_devices=0), "cpu_devices must be an integer >= 1 or 'auto', got 0"),
        (dict(cpu_devices="many"), "cpu_devices must be an integer >= 1 or 'auto'"),
        (dict(num_processes=0), "num_processes must be an integer >= 1, got 0"),
        (dict(num_processes=2, process_id=2), r"process_id must be in \[0, 1\]"),
    ],
)
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        runtime.configure_runtime(**kwargs)


def test_host_devices_cannot_change_once_jax_has_started():
    import jax

    jax.devices()
    with pytest.raises(RuntimeError, match="before any JAX computation"):
        runtime.configure_runtime(cpu_devices=3)


def test_the_launcher_rejects_an_empty_command_and_zero_processes():
    with pytest.raises(ValueError, match="no command"):
        launch.launch([], 2)
    with pytest.raises(ValueError, match="num_processes must be >= 1"):
        launch.launch([sys.executable, "-c", "pass"], 0)


def test_the_launcher_gives_each_process_its_id_and_returns_the_first_failure():
    code = (
        "import os, sys; print(os.environ['FEDJAX_PALS_PROCESS_ID'], "
        "os.environ['FEDJAX_PALS_NUM_PROCESSES']); sys.exit(int(os.environ['FEDJAX_PALS_PROCESS_ID']) * 3)"
    )
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedjax_pals.launch",
            "--num_processes=2",
            "--",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 3
    assert "[0] 0 2" in completed.stdout and "[1] 1 2" in completed.stdout


def test_auto_or_the_same_count_once_jax_has_started_keeps_the_devices():
    import jax

    jax.devices()
    assert runtime.configure_runtime(cpu_devices="auto")["cpu_devices"] == jax.local_device_count()
    runtime.configure_runtime(cpu_devices=jax.local_device_count())


# -- JAX's persistent compilation cache -------------------------------------------------------


def test_the_compilation_cache_setting_resolves_auto_a_directory_and_none(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    home_cache = str(tmp_path / "home" / ".cache" / "fedjax_pals" / "jax")
    assert runtime.compilation_cache_dir("auto") == home_cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert runtime.compilation_cache_dir("auto") == str(tmp_path / "xdg" / "fedjax_pals" / "jax")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))  # the user's, or CI's
    assert runtime.compilation_cache_dir("auto") == str(tmp_path / "env")
    assert runtime.compilation_cache_dir(" AUTO ") == str(tmp_path / "env")  # as none/OFF
    monkeypatch.chdir(tmp_path)
    assert runtime.compilation_cache_dir("mine") == str(tmp_path / "mine")
    assert runtime.compilation_cache_dir(tmp_path / "p") == str(tmp_path / "p")
    assert runtime.compilation_cache_dir("none") is None
    assert runtime.compilation_cache_dir("OFF") is None
    with pytest.raises(ValueError, match="compilation_cache must be a directory, 'auto' or 'none'"):
        runtime.compilation_cache_dir(" ")


def test_configure_runtime_points_jax_at_the_cache_or_turns_it_off(tmp_path, monkeypatch):
    import jax

    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    keys = (
        "jax_compilation_cache_dir",
        "jax_enable_compilation_cache",
        "jax_persistent_cache_min_compile_time_secs",
    )
    saved = {key: getattr(jax.config, key) for key in keys}
    try:
        settings = runtime.configure_runtime(compilation_cache=str(tmp_path / "cache"))
        assert settings["compilation_cache"] == str(tmp_path / "cache")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
        assert jax.config.jax_enable_compilation_cache
        assert (
            jax.config.jax_persistent_cache_min_compile_time_secs
            == runtime.CACHE_MIN_COMPILE_SECONDS
        )
        assert runtime.configure_runtime(compilation_cache="none")["compilation_cache"] is None
        assert not jax.config.jax_enable_compilation_cache
    finally:
        for key, value in saved.items():
            jax.config.update(key, value)


def test_an_unusable_compilation_cache_is_one_warning_line(tmp_path, monkeypatch, capfd):
    # JAX compiles without caching when it cannot write there, and says nothing: every launch
    # then recompiles and the user never learns why.
    import collections

    afile = tmp_path / "afile"
    afile.write_text("")
    assert runtime.compilation_cache_problem(str(afile)) == "it is not a directory"
    assert runtime.compilation_cache_problem(str(afile / "below")) == f"{afile} cannot be written"
    assert runtime.compilation_cache_problem(str(tmp_path / "new" / "cache")) is None
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(runtime.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 2**20))
    assert runtime.compilation_cache_problem(str(tmp_path)) == "its file system has only 1 MiB free"
    monkeypatch.undo()
    # A directory that exists but refuses a write (a read-only mount; root passes os.access).
    def refuse(**kwargs):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(runtime.tempfile, "NamedTemporaryFile", refuse)
    assert runtime.compilation_cache_problem(str(tmp_path)) == (
        "it cannot be written: Read-only file system"
    )
    monkeypatch.undo()
    import jax

    keys = ("jax_compilation_cache_dir", "jax_enable_compilation_cache")
    saved = {key: getattr(jax.config, key) for key in keys}
    try:
        jax.config.update("jax_enable_compilation_cache", True)
        # Reported once and then not given to JAX, which would warn again at every compile.
        settings = runtime.configure_runtime(compilation_cache=str(afile))
        assert settings["compilation_cache"] is None
        assert not jax.config.jax_enable_compilation_cache
        assert jax.config.jax_compilation_cache_dir != str(afile)
        lines = capfd.readouterr().err.strip().splitlines()
        assert lines == [
            f"warning: the compilation cache {afile} is not usable (it is not a directory): this "
            "run goes on without one and compiles its programs anew; pass "
            "--compilation_cache=DIR (another directory) or none."
        ]
        # A full disk alike; a usable directory afterwards turns the cache back on.
        jax.config.update("jax_enable_compilation_cache", True)
        monkeypatch.setattr(runtime.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 2**20))
        full = tmp_path / "full"
        assert runtime.configure_runtime(compilation_cache=str(full))["compilation_cache"] is None
        assert not jax.config.jax_enable_compilation_cache
        assert capfd.readouterr().err.count("\n") == 1
        monkeypatch.undo()
        assert runtime.configure_runtime(compilation_cache=str(full))["compilation_cache"] == str(
            full
        )
        assert jax.config.jax_enable_compilation_cache
    finally:
        for key, value in saved.items():
            jax.config.update(key, value)


@pytest.mark.integration
def test_a_second_launch_loads_what_the_first_compiled_from_the_launchers_default_cache(tmp_path):
    # The launchers' path (experiments/flags.py, --compilation_cache left at 'auto'), with the
    # user's cache directory under $XDG_CACHE_HOME; every program is kept, even a small one.
    code = """
import jax, jax.numpy as jnp
from jax import monitoring
from absl import flags
from experiments import flags as common
hits = []
monitoring.register_event_listener(
    lambda event, **kw: hits.append(1) if event == "/jax/compilation_cache/cache_hits" else None)
flags.FLAGS(["main"])
common.configure_runtime()
jax.jit(lambda x: jnp.tanh(x) @ x.T + 1.0)(jnp.ones((8, 8))).block_until_ready()
print("hits", len(hits), jax.config.jax_compilation_cache_dir)
"""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
    }
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    cache = tmp_path / "xdg" / "fedjax_pals" / "jax"
    outputs = []
    for _ in range(2):
        completed = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
        )
        assert completed.returncode == 0, completed.stderr[-2000:]
        if "Machine type used for XLA:CPU compilation doesn't match" in completed.stderr:
            # XLA rejects every entry it wrote itself on some Intel CPUs (jax-ml/jax#38445,
            # open): nothing this package can load there; README says so.
            pytest.skip("XLA:CPU rejects its own cache entries on this CPU (jax-ml/jax#38445)")
        outputs.append(completed.stdout.split())
    assert outputs[0] == ["hits", "0", str(cache)] and list(cache.iterdir())
    assert int(outputs[1][1]) >= 1  # loaded, not compiled (the program and jnp.ones' own)
    assert oct(cache.stat().st_mode & 0o777) == "0o700"  # the user's own cache


_HELP_PROBE = """
import runpy, sys
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as exit_:
    code = exit_.code
print("exit", code, "imported", [m for m in ("jax", "fedjax_pals.experiment") if m in sys.modules],
      file=sys.stderr)
"""


@pytest.mark.parametrize("main", [
    "run", "sweep", "demo", "submit", "compare", "weights", "unknown_target_report",
    "restricted_eval", "dp_updates_report", "privacy", "benchmarks.round",
    "benchmarks.solve_time",
])
def test_a_mains_help_exits_0_before_jax_is_imported(main):
    # The JAX import is seconds (half a minute on a loaded machine) before the help otherwise.
    completed = subprocess.run(
        [sys.executable, "-c", _HELP_PROBE, f"experiments.{main}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert "--" in completed.stdout and "flags:" in completed.stdout, completed.stderr[-2000:]
    assert completed.stderr.strip().splitlines()[-1] == "exit 0 imported []", completed.stderr


def test_the_launchers_help_says_which_flags_are_required_and_shows_no_none_default():
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.run", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    text = completed.stdout
    assert completed.returncode == 0, completed.stderr[-2000:]  # absl's own would exit 1
    assert "--workdir" in text, completed.stderr[-2000:]
    assert "(default: 'None')" not in text
    for name in ("config", "workdir"):
        block = text.split(f"  --{name}:", 1)[1].split("\n  --", 1)[0]
        assert "(required)" in block, block
    block = text.split("  --compilation_cache:", 1)[1].split("\n  --", 1)[0]
    assert "(default: 'auto')" in block and "'none'" in block
    assert "(required)" not in text.split("  --cpu_devices:", 1)[1].split("\n  --", 1)[0]
