"""results.json records the backend and devices each round ran on; a resume on another engine
says so in one warning line (and is not refused)."""

import logging

import jax
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import engine_record
from fedjax_pals.experiment import writers as writers_lib


def _config(backend):
    # FedAvg: what is recorded does not depend on the method, and its round programs do not
    # hold FedPALS' solver (seconds to compile on each backend).
    return {
        "dataset": {"name": "synthetic"},
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": 4, "batch_size": 8, "learning_rate": 0.05, "eval_every": 1},
        "engine": {"backend": backend},
    }


def test_segments_keep_the_engine_and_name_a_change():
    first, warning = engine_record.engine_segments(None, 0, "vmap_scan")
    assert warning is None
    assert first == [
        {"first_round": 1, "backend": "vmap_scan", "devices": jax.device_count(), "processes": 1}
    ]
    same, warning = engine_record.engine_segments({"engine": first}, 3, "vmap_scan")
    assert same == first and warning is None
    changed, warning = engine_record.engine_segments({"engine": first}, 3, "host_loop")
    assert [s["backend"] for s in changed] == ["vmap_scan", "host_loop"]
    assert changed[1]["first_round"] == 4
    assert "resuming after round 3 on backend host_loop" in warning
    assert "rounds 1-3 ran on backend vmap_scan" in warning and "\n" not in warning
    assert "same backend and number of devices" in warning
    # Results of an older version name only the backend.
    _, warning = engine_record.engine_segments({"backend": "vmap_scan"}, 2, "host_loop")
    assert "rounds 1-2 ran on backend vmap_scan" in warning
    # Segments after the checkpoint resumed from are void.
    later = [*changed, {"first_round": 9, "backend": "x", "devices": 1, "processes": 1}]
    assert engine_record.engine_segments({"engine": later}, 5, "host_loop")[0] == changed


def test_a_resume_on_another_backend_is_recorded_and_warned_once(tmp_path, monkeypatch, caplog):
    workdir = str(tmp_path / "run")
    real = writers_lib.MetricWriter.write_scalars

    def interrupted(self, step, scalars):
        if step == 3:
            raise KeyboardInterrupt  # killed during round 3
        return real(self, step, scalars)

    monkeypatch.setattr(writers_lib.MetricWriter, "write_scalars", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fjp.train_and_evaluate(_config("vmap_scan"), workdir, quiet=True)
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING):
        results = fjp.train_and_evaluate(_config("host_loop"), workdir, quiet=True)
    backends = [(s["backend"], s["devices"]) for s in results["engine"]]
    assert backends == [("vmap_scan", jax.device_count()), ("host_loop", jax.device_count())]
    resumed_at = results["engine"][1]["first_round"]
    assert 2 <= resumed_at <= 4
    warnings = [r.getMessage() for r in caplog.records if "bit-identical resume" in r.getMessage()]
    assert len(warnings) == 1 and f"resuming after round {resumed_at - 1}" in warnings[0]
