"""Progress: a tqdm bar with the latest metrics; quiet prints nothing."""

import io
import os

import pytest

from fedjax_pals.experiment.progress import Progress


def test_the_bar_counts_steps_and_shows_the_latest_metrics():
    out = io.StringIO()
    with Progress(3, desc="fedpals", file=out) as bar:
        bar.update(1, target_accuracy=0.5)
        bar.update(1, target_accuracy=0.123456)
    text = out.getvalue()
    assert "fedpals" in text
    assert "2/3" in text
    assert "target_accuracy=0.1235" in text
    assert bar.n == 2 and bar.latest == {"target_accuracy": "0.1235"}


def test_a_resumed_bar_starts_at_initial():
    out = io.StringIO()
    with Progress(10, initial=4, unit="run", file=out) as bar:
        bar.update(1)
    assert "5/10" in out.getvalue() and "run" in out.getvalue()


def test_quiet_prints_nothing(capsys):
    with Progress(3, desc="x", quiet=True) as bar:
        bar.update(2, loss=1.0)
        bar.write("message")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    assert bar.n == 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(total=-1), "total must be an integer >= 0, got -1"),
        (dict(total=2, initial=3), "initial must be <= total"),
        (dict(total=2.5), "total must be an integer >= 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Progress(quiet=True, **kwargs)


def test_update_refuses_negative_steps():
    with Progress(3, quiet=True) as bar:
        with pytest.raises(ValueError, match="n must be an integer >= 0, got -1"):
            bar.update(-1)


def test_on_a_stream_that_is_not_a_terminal_there_is_no_bar_but_the_lines_remain(capsys):
    # pytest's captured stderr is not a terminal, as a log file or a pipe is not.
    with Progress(3, desc="fedpals") as bar:
        bar.update(1, loss=0.5)
        bar.write("run 1: lam=0.1")
    captured = capsys.readouterr()
    assert captured.err == "run 1: lam=0.1\n" and captured.out == ""
    assert bar.n == 1 and bar.latest == {"loss": "0.5"}


def test_the_rate_and_eta_restart_after_a_compiling_first_step(monkeypatch):
    import tqdm.std

    clock = [1000.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: clock[0])
    out = io.StringIO()
    with Progress(10, file=out, first_step_compiles=True) as bar:
        clock[0] += 100.0  # the first round: compilation
        bar.update(1)
        for _ in range(2):
            clock[0] += 2.0  # then 2 s a round
            bar.update(1)
        shown = bar._bar.format_dict
        assert shown["n"] == 3 and shown["elapsed"] == pytest.approx(4.0)
        assert (shown["n"] - shown["initial"]) / shown["elapsed"] == pytest.approx(0.5)
        text = out.getvalue()
    assert "3/10" in text and "00:14" in text  # 7 rounds left at 2 s: ETA 14 s, not 238 s


def test_metrics_given_without_a_step_show_at_once():
    out = io.StringIO()
    with Progress(3, file=out) as bar:
        bar.update(1)
        bar.update(0, acc=0.75)  # an evaluation after the round: not one round later
        assert "acc=0.75" in out.getvalue()


# -- without a terminal: plain lines -----------------------------------------------------------


class _Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def _clock(monkeypatch):
    from fedjax_pals.experiment import progress

    clock = _Clock()
    monkeypatch.setattr(progress, "_clock", clock)
    return clock


def test_without_a_terminal_each_evaluation_is_a_line_with_round_accuracy_and_eta(
    monkeypatch, capsys
):
    clock = _clock(monkeypatch)
    with Progress(10, desc="fedpals seed 0", first_step_compiles=True) as bar:
        clock.now += 20.0  # the first round compiles: not counted in the rate
        bar.update(1, loss=0.9)
        clock.now += 4.0
        bar.update(1, loss=0.5)  # 4 s a round: 8 left, ETA 0:32
        bar.update(0, **{"target acc": "85.2%", "val acc": "84.9%"})
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "fedpals seed 0: round 2/10, target acc 85.2%, val acc 84.9%, loss 0.5, ETA 0:32"
    ]


def test_without_a_terminal_rounds_between_evaluations_print_at_most_a_line_every_30_s(
    monkeypatch, capsys
):
    from fedjax_pals.experiment.progress import LINE_INTERVAL_SECONDS

    clock = _clock(monkeypatch)
    with Progress(100, desc="fedavg seed 1") as bar:
        for _ in range(20):  # 20 rounds of 5 s: a line after 30 s, 60 s and 90 s
            clock.now += 5.0
            bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert LINE_INTERVAL_SECONDS == 30.0
    assert lines == [
        "fedavg seed 1: round 6/100, ETA 7:50",
        "fedavg seed 1: round 12/100, ETA 7:20",
        "fedavg seed 1: round 18/100, ETA 6:50",
    ]


class _ZeroColumnPty:
    """A pty whose window is 0 x 0 (a terminal that tqdm draws nothing in)."""

    def __init__(self):
        self.text = []

    def isatty(self):
        return True

    def fileno(self):
        return 2

    def write(self, text):
        self.text.append(text)

    def flush(self):
        pass


def test_a_zero_column_terminal_gets_plain_lines_instead_of_a_vanishing_bar(monkeypatch):
    import os
    import sys

    pty = _ZeroColumnPty()
    monkeypatch.setattr(sys, "stderr", pty)
    monkeypatch.setattr(os, "get_terminal_size", lambda fd=None: os.terminal_size((0, 0)))
    with Progress(4, desc="fedpals seed 0") as bar:
        bar.update(1)
        bar.update(0, **{"target acc": "50.0%"})
    text = "".join(pty.text)
    assert bar._bar is None
    assert text.startswith("fedpals seed 0: round 1/4, target acc 50.0%, ETA ")


def test_on_screen_accuracies_are_percentages_like_the_tables():
    from fedjax_pals.experiment.progress import duration, percent

    assert percent(0.8523) == "85.2%" and percent(1.0) == "100.0%"
    assert duration(85) == "1:25" and duration(3725) == "1:02:05" and duration(float("nan")) == "?"


# -- what an interrupted command says ---------------------------------------------------------


def test_a_runs_result_line_is_in_percent_and_states_this_launchs_time():
    from fedjax_pals.experiment.progress import result_line

    results = {
        "final_target_accuracy": 0.8523,
        "best_val_round": 48,
        "target_accuracy_at_best_val": 0.856,
        "wall_seconds": 41.6,  # training time summed over the launches (results.json's)
    }
    assert result_line(results, 95.3) == (
        "final target accuracy 85.2%; at best val (round 48) 85.6%; 95.3 s this launch"
    )
    # Extended or resumed: this launch's time and where it began; one clock (two read as a
    # contradiction: "65.3 s this launch (...; training over all launches 65.4 s)").
    assert result_line(results, 12.0, start_round=30) == (
        "final target accuracy 85.2%; at best val (round 48) 85.6%; 12.0 s this launch, which "
        "resumed after round 30"
    )


@pytest.mark.parametrize("rows, columns, bar", [(24, 80, True), (0, 80, False), (24, 0, False)])
def test_a_pty_without_rows_or_columns_gets_plain_lines_not_a_bar(rows, columns, bar):
    # Some CI runners and `docker -t` give a pty of 0 rows: a bar there showed nothing at all.
    import fcntl
    import pty
    import struct
    import termios

    from fedjax_pals.experiment import progress

    leader, follower = pty.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        with os.fdopen(os.dup(follower), "w") as stream:
            assert progress._is_terminal(stream) is bar
    finally:
        os.close(leader)
        os.close(follower)


def test_without_a_terminal_a_line_carries_only_what_was_measured_at_its_round(
    monkeypatch, capsys
):
    # Not round 2 under round 1's accuracy, not round 1 twice, no "ETA ?".
    clock = _clock(monkeypatch)
    with Progress(3, desc="fedpals seed 0", first_step_compiles=True) as bar:
        clock.now += 40.0  # the compiling first round: no line of its own...
        bar.update(1, loss=0.9)
        bar.update(0, **{"target acc": "54.3%"})  # ...its evaluation's line is round 1's
        clock.now += 35.0  # a round longer than the line interval: a line before its eval
        bar.update(1, loss=0.5)
        bar.update(0, **{"target acc": "89.1%"})
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "fedpals seed 0: round 1/3, target acc 54.3%, loss 0.9",
        "fedpals seed 0: round 2/3, loss 0.5, ETA 0:35",
        "fedpals seed 0: round 2/3, target acc 89.1%, loss 0.5, ETA 0:35",
    ]
