"""MetricWriter: JSONL + TensorBoard events, hyperparameters once, resume never duplicates."""

import glob
import json
import math
import os
import struct

import pytest

from fedjax_pals.experiment.writers import MetricWriter, flatten_hparams, read_metrics


def _events(logdir):
    """Every Event in <logdir>/tensorboard/*, in file order (TFRecord framing, no TensorFlow)."""
    from tensorboardX.proto.event_pb2 import Event

    events = []
    for path in sorted(glob.glob(os.path.join(logdir, "tensorboard", "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            offset += 12  # length + its masked crc
            events.append(Event.FromString(data[offset : offset + length]))
            offset += length + 4  # payload + its masked crc
    return events


def _scalars(logdir, tag):
    return [
        (e.step, v.simple_value) for e in _events(logdir) for v in e.summary.value if v.tag == tag
    ]


def test_scalars_go_to_jsonl_and_tensorboard(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        writer.write_scalars(1, {"target_accuracy": 0.5, "train_loss": 2.0})
        writer.write_scalars(2, {"target_accuracy": 0.75})
    assert read_metrics(str(tmp_path)) == [
        {"step": 1, "target_accuracy": 0.5, "train_loss": 2.0},
        {"step": 2, "target_accuracy": 0.75},
    ]
    assert _scalars(str(tmp_path), "target_accuracy") == [(1, 0.5), (2, 0.75)]
    assert _scalars(str(tmp_path), "train_loss") == [(1, 2.0)]


def test_a_resumed_writer_rewinds_the_log_so_no_round_appears_twice(tmp_path):
    logdir = str(tmp_path)
    with MetricWriter(logdir) as writer:
        for step in (1, 2, 3, 4):
            writer.write_scalars(step, {"acc": step / 10})
    # Killed after round 4 with a checkpoint at round 2: the resumed run re-does 3 and 4.
    with MetricWriter(logdir) as writer:
        writer.write_scalars(3, {"acc": 0.33})
        writer.write_scalars(4, {"acc": 0.44})
    assert [(r["step"], r["acc"]) for r in read_metrics(logdir)] == [
        (1, 0.1),
        (2, 0.2),
        (3, 0.33),
        (4, 0.44),
    ]
    # TensorBoard is told to purge the old events from step 3 on.
    starts = [e.step for e in _events(logdir) if e.HasField("session_log")]
    assert starts == [3]


def test_resume_step_drops_later_lines_at_once(tmp_path):
    logdir = str(tmp_path)
    with MetricWriter(logdir) as writer:
        for step in (1, 2, 3):
            writer.write_scalars(step, {"acc": 0.1 * step})
    MetricWriter(logdir, resume_step=1).close()
    assert [r["step"] for r in read_metrics(logdir)] == [1]


def test_one_step_may_be_written_by_several_calls_but_steps_never_decrease(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        writer.write_scalars(5, {"train_loss": 1.0})
        writer.write_scalars(5, {"target_accuracy": 0.5})
        with pytest.raises(ValueError, match="step must not decrease.*got 4 after 5"):
            writer.write_scalars(4, {"train_loss": 1.0})
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [5, 5]


def test_hyperparameters_are_flattened_and_written_once_per_run(tmp_path):
    hparams = {"algorithm": {"name": "fedpals", "lam": None}, "training": {"rounds": 3}}
    for _ in range(2):  # the second writer is a resumed run with the same hyperparameters
        with MetricWriter(str(tmp_path)) as writer:
            writer.write_hparams(hparams)
    with open(tmp_path / "hparams.json") as f:
        assert json.load(f) == {
            "algorithm.name": "fedpals",
            "algorithm.lam": "None",
            "training.rounds": 3,
        }
    session_starts = [
        e
        for e in _events(str(tmp_path))
        for v in e.summary.value
        if v.tag == "_hparams_/session_start_info"
    ]
    assert len(session_starts) == 1


def test_flatten_hparams_accepts_config_dicts():
    import ml_collections

    config = ml_collections.ConfigDict({"a": {"b": 1, "c": [1, 2]}, "d": True})
    assert flatten_hparams(config.to_dict()) == {"a.b": 1, "a.c": "[1, 2]", "d": True}


def test_a_disabled_writer_writes_nothing(tmp_path):
    logdir = tmp_path / "run"
    with MetricWriter(str(logdir), enabled=False) as writer:
        writer.write_hparams({"a": 1})
        writer.write_scalars(1, {"acc": 0.5})
    assert not logdir.exists()


def test_non_finite_values_are_logged_in_jsonl_and_skipped_in_tensorboard(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        writer.write_scalars(1, {"train_loss": float("nan")})
    (record,) = read_metrics(str(tmp_path))
    assert math.isnan(record["train_loss"])
    assert _scalars(str(tmp_path), "train_loss") == []


@pytest.mark.parametrize(
    "step, scalars, error, match",
    [
        (-1, {"a": 1.0}, ValueError, "step must be an integer >= 0, got -1"),
        (1.5, {"a": 1.0}, TypeError, "step must be an integer >= 0, got 1.5"),
        (1, {"a": "high"}, TypeError, "scalar 'a' must be a real number"),
        (1, {"step": 1.0}, ValueError, "'step' is reserved"),
        (1, [("a", 1.0)], TypeError, "scalars must be a mapping"),
    ],
)
def test_bad_scalars_are_refused_naming_the_problem(tmp_path, step, scalars, error, match):
    with MetricWriter(str(tmp_path)) as writer:
        with pytest.raises(error, match=match):
            writer.write_scalars(step, scalars)


def test_a_closed_writer_refuses_writes(tmp_path):
    writer = MetricWriter(str(tmp_path))
    writer.close()
    with pytest.raises(ValueError, match="is closed"):
        writer.write_scalars(1, {"a": 1.0})


def test_a_torn_last_line_is_skipped_when_reading(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        writer.write_scalars(1, {"a": 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "a":')  # killed mid-write
    assert read_metrics(str(tmp_path)) == [{"step": 1, "a": 1.0}]
