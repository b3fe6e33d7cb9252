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
