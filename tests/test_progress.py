"""Progress: a tqdm bar with the latest metrics; quiet prints nothing."""

import io

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
