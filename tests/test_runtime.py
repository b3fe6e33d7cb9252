"""configure_runtime's checks and the local multi-process launcher."""

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
