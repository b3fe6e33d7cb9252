"""A full disk: one error naming the path and the space, nothing damaged, the same call resumes."""

import errno
import json
import os

import pytest

import fedjax_pals as fjp
from experiments import flags as common
from fedjax_pals.experiment import diskspace, workdir as workdir_lib

SYNTHETIC = {
    "dataset": {"name": "synthetic"},
    "training": {"rounds": 4, "batch_size": 8, "learning_rate": 0.05, "eval_every": 1},
}


def _full_disk_from(call, monkeypatch):
    """os.replace (the commit of every JSON file, and of others' files) fails with ENOSPC from
    its `call`-th call."""
    real, calls = os.replace, []

    def replace(src, dst, *args, **kwargs):
        calls.append(dst)
        if len(calls) >= call:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(workdir_lib.os, "replace", replace)
    return calls


def test_a_full_disk_mid_run_is_one_error_and_the_same_call_resumes(tmp_path, monkeypatch):
    clean = fjp.train_and_evaluate(SYNTHETIC, str(tmp_path / "clean"), quiet=True)
    workdir = tmp_path / "run"
    _full_disk_from(3, monkeypatch)  # full after the first writes
    with pytest.raises(fjp.DiskFullError) as info:
        fjp.train_and_evaluate(SYNTHETIC, str(workdir), quiet=True)
    message = str(info.value)
    assert f"no space left to write {workdir / 'results.json'} (" in message
    assert "free on its file system, about" in message and "needed" in message
    assert "run the same command again to resume" in message and "\n" not in message
    with open(workdir / "results.json") as f:
        rounds = json.load(f)["rounds"]  # intact: the last complete write
    assert rounds and rounds == list(range(1, len(rounds) + 1)) and rounds[-1] < 4
    assert not [n for n in os.listdir(workdir) if n.startswith(".tmp")]
    monkeypatch.undo()  # space freed
    resumed = fjp.train_and_evaluate(SYNTHETIC, str(workdir), quiet=True)
    assert resumed["train_loss"] == clean["train_loss"]
    assert resumed["target_accuracy"] == clean["target_accuracy"]


def test_a_full_disk_at_launch_names_the_workdir(tmp_path, monkeypatch):
    def mkstemp(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(workdir_lib.tempfile, "mkstemp", mkstemp)
    with pytest.raises(fjp.DiskFullError, match=f"no space left to write {tmp_path / 'w'}"):
        fjp.train_and_evaluate(SYNTHETIC, str(tmp_path / "w"), quiet=True)


def test_a_wrapped_full_disk_is_recognised_and_the_launchers_show_one_line(capsys):
    wrapped = ValueError("tensorstore write failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert diskspace.is_disk_full(wrapped)
    assert not diskspace.is_disk_full(ValueError("bad value"))
    with pytest.raises(SystemExit) as info:
        with common.user_errors():
            raise diskspace.run_disk_full(wrapped, "/some/workdir")
    assert str(info.value).startswith("error: no space left to write /some/workdir (")
