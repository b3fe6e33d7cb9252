"""A dying process of a `python -m fedjax_pals.launch`: every process ends soon, in one line, and
no child outlives the launcher (even a SIGKILLed one)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fedjax_pals import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Process 1 dies by SIGKILL once both have started; process 0 ignores SIGTERM, as a JAX process
# does (its preemption notifier catches it), and would otherwise wait for a minute.
PEER = textwrap.dedent("""
    import os, signal, sys, time
    i = int(os.environ["FEDJAX_PALS_PROCESS_ID"])
    signal.signal(signal.SIGTERM, lambda *a: print("SIGTERM ignored", flush=True))
    print("started", os.getpid(), flush=True)
    if i == 1 and sys.argv[1] == "die":
        time.sleep(1.0)
        print("dying at", time.time(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if i == 1 and sys.argv[1] == "usage":
        print("error: --config.training.rounds=0: must be >= 1", file=sys.stderr, flush=True)
        sys.exit(2)
    time.sleep(120)
""")


def _launcher(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "fedjax_pals.launch", "--num_processes=2", "--", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_peer_death_stops_the_others_within_seconds_in_one_line():
    launcher = _launcher(sys.executable, "-c", PEER, "die")
    stdout, stderr = launcher.communicate(timeout=120)
    ended = time.time()
    died = float(next(l for l in stdout.splitlines() if "dying at" in l).split()[-1])
    assert ended - died < 15, ended - died
    assert launcher.returncode == 128 + signal.SIGKILL
    lines = stderr.strip().splitlines()
    assert lines == [
        "error: process 1 of 2 was killed by SIGKILL; stopped process(es) 0; run the same "
        "command again to resume the run from its last checkpoint."
    ], stderr


def test_a_childs_usage_error_is_shown_and_not_answered_with_resume():
    launcher = _launcher(sys.executable, "-c", PEER, "usage")
    stdout, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 2
    assert "[1] error: --config.training.rounds=0: must be >= 1" in stdout
    assert stderr.strip().splitlines() == [
        "error: process 1 of 2 exited with status 2; stopped process(es) 0; its command line "
        "was refused (its error is above): fix it and launch again."
    ], stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num_processes=0", "--", "true"], "--num_processes must be an integer >= 1, got 0"),
        (["--num_processes=2"], "no command to launch"),
        (["--num_processes=x", "--", "true"], "invalid int value: 'x'"),
        (["--port=70000", "--", "true"], "--port must be in [1, 65535]"),
        (["--num_processes=2", "--", "/nonexistent/cmd"],
         "cannot run '/nonexistent/cmd': no such executable"),
    ],
)
def test_bad_launch_flags_are_one_error_line(args, message):
    done = subprocess.run(
        [sys.executable, "-m", "fedjax_pals.launch", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and message in lines[0], lines


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killing_the_launcher_leaves_no_child_running():
    launcher = _launcher(sys.executable, "-c", PEER, "live")
    pids = []
    for line in launcher.stdout:
        if "started" in line:
            pids.append(int(line.split()[-1]))
        if len(pids) == 2:
            break
    assert all(_alive(pid) for pid in pids)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "children outlived the launcher"


def test_a_sigterm_to_the_launcher_stops_children_that_ignore_it():
    launcher = _launcher(sys.executable, "-c", PEER, "live")
    pids = []
    for line in launcher.stdout:
        if "started" in line:
            pids.append(int(line.split()[-1]))
        if len(pids) == 2:
            break
    start = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=30)
    # SIGKILLed after the grace a user's stop gives them, not waited for.
    assert time.monotonic() - start < launch.INTERRUPT_GRACE_SECONDS + 10
    assert launcher.returncode == 128 + signal.SIGTERM
    assert not any(_alive(pid) for pid in pids)


def test_ctrl_c_to_the_launcher_stops_the_children_in_one_line_with_status_130():
    # As from a terminal: SIGINT not ignored, even if pytest was started so (a handler here is
    # reset to the default action by exec, SIG_IGN is not).
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        launcher = _launcher(sys.executable, "-c", PEER, "live")
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    pids = []
    for line in launcher.stdout:  # waits on output: both children have started
        if "started" in line:
            pids.append(int(line.split()[-1]))
        if len(pids) == 2:
            break
    launcher.send_signal(signal.SIGINT)
    stdout, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGINT
    assert stderr.strip().splitlines() == [
        "interrupted (SIGINT): stopped the 2 process(es); the same command resumes the run from "
        "its last checkpoint."
    ]
    assert not any(_alive(pid) for pid in pids)


def test_gloo_connection_lines_are_left_out_unless_the_command_raises_verbosity():
    import io
    import threading

    from fedjax_pals import launch

    command = [sys.executable, "-m", "experiments.run", "--config=configs/synthetic.py"]
    assert launch.verbosity(command) == 0
    assert launch.verbosity([*command, "--verbosity=1"]) == 1
    assert launch.verbosity([*command, "-v", "2"]) == 2
    output = (
        "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks "
        "is : 1\nfinal target accuracy 50.0%\n"
    )
    for quiet, expected in ((True, 1), (False, 2)):
        out = io.StringIO()
        launch._pump(io.StringIO(output), "[1] ", out, threading.Event(), quiet)
        assert len(out.getvalue().splitlines()) == expected
        assert out.getvalue().endswith("[1] final target accuracy 50.0%\n")


def _children(pid):
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            children += [int(c) for c in f.read().split()]
    return children


def _process_id(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    return int(env[b"FEDJAX_PALS_PROCESS_ID"])


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_process_of_a_real_two_process_run_ends_the_launch_within_15_seconds(tmp_path):
    workdir = tmp_path / "run"
    launcher = _launcher(
        sys.executable,
        "-m",
        "experiments.run",
        "--config=configs/synthetic.py",
        "--config.training.rounds=3000",
        "--config.training.eval_every=10",
        f"--workdir={workdir}",
        "--quiet",
    )
    deadline = time.monotonic() + 300
    while not (workdir / "results.json").exists():  # both processes are training
        assert launcher.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    victim = next(p for p in _children(launcher.pid) if _process_id(p) == 1)
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    stdout, stderr = launcher.communicate(timeout=60)
    assert time.monotonic() - killed < 15
    assert launcher.returncode == 128 + signal.SIGKILL
    assert stderr.strip().splitlines()[-1] == (
        "error: process 1 of 2 was killed by SIGKILL; stopped process(es) 0; run the same "
        "command again to resume the run from its last checkpoint."
    )
    assert "Traceback" not in stdout + stderr


def test_a_process_whose_peer_died_says_so_in_one_line(monkeypatch):
    from fedjax_pals import runtime

    lost = ValueError(
        "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read "
        "error [127.0.0.1]:45978: Connection reset by peer"
    )
    assert not runtime.is_lost_peer_error(lost)  # one process: no peer to lose
    monkeypatch.setitem(runtime._configured, "distributed", True)
    assert runtime.is_lost_peer_error(lost)
    assert not runtime.is_lost_peer_error(ValueError("config.training.rounds must be >= 1"))
    message = runtime.lost_peer_message(lost)
    assert message.startswith("process 0 of 1 lost contact with another process of the run")
    assert "Connection reset by peer" in message and "run the same command again" in message
    assert "\n" not in message
