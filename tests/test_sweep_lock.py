"""One sweep per workdir, and a run another process holds is "busy", never "failed"."""

import json
import os
import socket
import time

import ml_collections
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import locks
from fedjax_pals.experiment import sweep as sweep_lib


def _sweep_config():
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 1
    config.sweep = ml_collections.ConfigDict(dict(seeds=(0, 1), methods=("fedavg",)))
    return config


def _fake_many(held):
    """train_and_evaluate_many, the run in `held` being locked by another process."""

    def many(configs, workdirs, *, on_done=None, **kwargs):
        outcomes = []
        for index, (config, workdir) in enumerate(zip(configs, workdirs)):
            resolved = fjp.validate_config(config)
            if workdir.endswith(held):
                outcome = fjp.WorkdirLockedError(
                    f"the workdir {workdir} is in use by another run (process 1 on elsewhere "
                    f"holds {workdir}/.lock); wait for it to finish, or choose another --workdir."
                )
            else:
                outcome = {
                    "config": resolved.to_dict(),
                    "config_digest": fjp.config_digest(resolved),
                    "rounds": [1],
                    "val_accuracy": [0.5],
                    "target_accuracy": [0.5],
                    "target_macro_f1": [0.5],
                    "best_val_round": 1,
                    "projection_distance": 0.0,
                }
                os.makedirs(workdir, exist_ok=True)
                with open(os.path.join(workdir, "results.json"), "w") as f:
                    json.dump(outcome, f)
            outcomes.append(outcome)
            if on_done is not None:
                on_done(index, outcome)
        return outcomes

    return many


def test_a_second_sweep_on_a_workdir_fails_at_once_naming_the_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(fjp.experiment.train, "train_and_evaluate_many", _fake_many(held="nothing"))
    lease = locks.Lease(str(tmp_path / sweep_lib.SWEEP_LOCK_FILE), "test").acquire()
    try:
        start = time.perf_counter()
        with pytest.raises(fjp.WorkdirLockedError) as info:
            fjp.run_sweep(_sweep_config(), str(tmp_path), quiet=True)
        assert time.perf_counter() - start < 1.0
    finally:
        lease.release()
    message = str(info.value)
    assert f"the sweep workdir {tmp_path} is in use" in message
    assert f"process {os.getpid()} on {socket.gethostname()}" in message
    assert not (tmp_path / "runs" / "fedavg").exists()  # nothing ran
    # Released: the same command now runs.
    summary = fjp.run_sweep(_sweep_config(), str(tmp_path), quiet=True)
    assert set(summary["runs"].values()) == {"done"}


def test_a_run_held_by_another_process_is_busy_not_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(fjp.experiment.train, "train_and_evaluate_many", _fake_many(held="seed_1"))
    summary = fjp.run_sweep(_sweep_config(), str(tmp_path), quiet=True)
    assert summary["runs"] == {"fedavg/seed_0": "done", "fedavg/seed_1": "busy"}
    assert not (tmp_path / "runs" / "fedavg" / "seed_1" / "error.txt").exists()
    assert summary["table"]["runs"]["not_finished"] == {"fedavg/seed_1": "busy"}


def test_a_run_workdir_lock_names_pid_and_host(tmp_path):
    one_run = _sweep_config().to_dict()
    del one_run["sweep"]
    resolved = fjp.resolve_config(one_run)
    from fedjax_pals.experiment.workdir import Workdir

    with Workdir(tmp_path, resolved):
        holder = f"{os.getpid()} on {socket.gethostname()}"
        with pytest.raises(fjp.WorkdirLockedError, match=holder):
            Workdir(tmp_path, resolved).open()
