"""What an interrupted command says, and the signals that interrupt it."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest


def test_the_interruption_line_names_the_round_reached_and_the_round_it_resumes_from():
    from fedjax_pals.experiment.interruption import Activity, interruption_message

    activity = Activity()
    assert interruption_message(signal.SIGINT, activity) == (
        "interrupted (SIGINT); the same command starts again."  # nothing began
    )
    activity.reset()  # as train_and_evaluate begins
    assert interruption_message(signal.SIGINT, activity) == (
        "interrupted (SIGINT) before training began; the same command starts again."
    )
    activity.run_prepared("/abs/runs/a", "runs/a", 50)
    activity.run_saved("/abs/runs/a", 20)
    assert interruption_message(signal.SIGTERM, activity) == (
        "interrupted (SIGTERM) before round 21/50 of runs/a; the same command resumes from "
        "round 20 (the last checkpoint)."
    )
    activity.run_training(["/abs/runs/a"])
    activity.run_round("/abs/runs/a", 26)
    assert interruption_message(signal.SIGINT, activity) == (
        "interrupted (SIGINT) in round 27/50 of runs/a; the same command resumes from round 20 "
        "(the last checkpoint)."
    )


def test_an_interrupted_sweep_names_its_run_and_how_many_runs_finished():
    from fedjax_pals.experiment.interruption import Activity, interruption_message

    activity = Activity()
    activity.reset()  # as a sweep's execute_runs begins
    activity.sweep_started(8, 3)
    activity.name_runs({"/w/runs/fedavg/seed_1": "fedavg/seed_1"})
    assert interruption_message(signal.SIGINT, activity) == (
        "interrupted (SIGINT) with 3 of 8 runs finished; the same command resumes the sweep."
    )
    activity.run_prepared("/w/runs/fedavg/seed_1", "/w/runs/fedavg/seed_1", 4)
    activity.run_training(["/w/runs/fedavg/seed_1"])
    activity.run_round("/w/runs/fedavg/seed_1", 1)
    activity.sweep_run_finished()
    assert interruption_message(signal.SIGTERM, activity) == (
        "interrupted (SIGTERM) in round 2/4 of run fedavg/seed_1, with 4 of 8 runs finished; "
        "the same command resumes the sweep, this run from round 0 (no checkpoint yet)."
    )


@pytest.fixture
def signal_handlers():
    """`handle_signals` for one test; the process's own handlers back afterwards."""
    from fedjax_pals.experiment import interruption

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    interruption.handle_signals()
    yield interruption
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    interruption._Signals.raised = interruption._Signals.pending = None
    interruption._Signals.installed = False


def test_a_signal_during_a_write_takes_effect_once_the_write_is_whole(signal_handlers):
    interruption = signal_handlers
    written = []
    with pytest.raises(interruption.Interrupted) as caught:
        with interruption.uninterrupted():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes: it is well past now
                pass
            written.append("the whole checkpoint")
    assert written == ["the whole checkpoint"]
    assert caught.value.signum == signal.SIGTERM and caught.value.exit_status == 143
    assert interruption.exit_status(KeyboardInterrupt()) == 130


@pytest.mark.parametrize("finalizer", ["__del__", "weakref.finalize"])
def test_a_signal_that_lands_in_a_finalizer_still_stops_the_command(finalizer):
    # The garbage collector runs finalizers (JAX's among them) between any two bytecodes; an
    # Interrupted raised inside one was printed as "Exception ignored in ..." and lost.
    # SIGTERM: a command started in the background (`cmd &`, CI) inherits SIGINT ignored.
    script = textwrap.dedent(f"""
        import os, signal, sys, time, weakref
        from fedjax_pals.experiment import interruption

        def finalize():
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:  # the handler runs here, inside the finalizer
                pass

        class WithDel:
            def __del__(self):
                finalize()

        class Plain:
            pass

        interruption.handle_signals()
        try:
            if {finalizer!r} == "__del__":
                held = WithDel()
            else:
                held = Plain()
                weakref.finalize(held, finalize)
            del held
            time.sleep(60)  # not interrupted: "not interrupted" after a minute
            print("not interrupted")
        except interruption.Interrupted as error:
            print("interrupted", error.signum)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.strip() == f"interrupted {int(signal.SIGTERM)}", done.stderr
    assert "Exception ignored" not in done.stderr


def test_a_signal_the_process_was_started_ignoring_stays_ignored():
    from fedjax_pals.experiment import interruption

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` in a script starts cmd
        interruption.handle_signals()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is interruption._on_signal
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        interruption._Signals.installed = False


# A main stopped while a background thread works, as orbax's async checkpoint save does: the
# thread fails as the interpreter shuts down and logs its error with a traceback
# (orbax/checkpoint/_src/futures/future.py, _SignalingThread.run).
_STOPPED_DURING_A_SAVE = textwrap.dedent("""
    import concurrent.futures.thread, os, threading, time  # as orbax's, imported before
    from absl import logging
    from experiments import flags as common

    def save():
        while threading.main_thread().is_alive():  # until the interpreter shuts down
            time.sleep(0.01)
        try:
            concurrent.futures.ThreadPoolExecutor().submit(print)
        except RuntimeError as error:  # cannot schedule new futures after interpreter shutdown
            logging.exception("_SignalingThread.run() raised an exception: %s", error)
        logging.error("an error the stop did not cause")  # still shown
        concurrent.futures.ThreadPoolExecutor().submit(print)  # to threading.excepthook

    def main(argv):
        threading.Thread(target=save).start()
        time.sleep(0.2)
        if os.environ["STOP"] == "peer":
            raise ValueError("UNKNOWN: Gloo AllGather failed: Connection reset by peer")
        raise KeyboardInterrupt

    common.run(main)
""")


@pytest.mark.parametrize("stop", ["interrupted", "peer"])
def test_a_background_thread_failing_at_shutdown_adds_nothing_under_the_stop_line(stop, tmp_path):
    script = tmp_path / "main.py"
    script.write_text(_STOPPED_DURING_A_SAVE)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "STOP": stop}
    if stop == "peer":  # a process of a multi-process run (is_lost_peer_error asks the runtime)
        script.write_text(_STOPPED_DURING_A_SAVE.replace(
            "common.run(main)",
            "from fedjax_pals import runtime\nruntime._configured['distributed'] = True\n"
            "common.run(main)"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env)
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and "raised an exception" not in done.stderr, done.stderr
    assert lines[-1].endswith("an error the stop did not cause"), done.stderr
    if stop == "peer":
        assert done.returncode == 1 and lines[-2].startswith("error: process 0 of 1 lost contact")
    else:
        assert done.returncode == 130 and lines[-2].startswith("interrupted (SIGINT)")
