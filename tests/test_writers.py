"""MetricWriter: JSONL + TensorBoard events, hyperparameters once, resume never duplicates."""

import glob
import json
import math
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

from fedjax_pals.experiment import writers as writers_lib
from fedjax_pals.experiment.writers import MetricWriter, flatten_hparams, read_metrics


def _events(logdir):
    """Every Event in <logdir>/events.out.tfevents.*, in file order (TFRecord framing, no
    TensorFlow); a record cut short (a killed writer) ends its file."""
    from tensorboardX.proto.event_pb2 import Event

    events = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        offset = 0
        while offset + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            offset += 12  # length + its masked crc
            if offset + length + 4 > len(data):
                break
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
            "algorithm.lam": None,
            "training.rounds": 3,
        }
    session_starts = [
        v
        for e in _events(str(tmp_path))
        for v in e.summary.value
        if v.tag == "_hparams_/session_start_info"
    ]
    assert len(session_starts) == 1
    # TensorBoard's HParams get the set values only: no "None" strings for unused settings.
    from tensorboardX.proto import plugin_hparams_pb2

    info = plugin_hparams_pb2.HParamsPluginData.FromString(
        session_starts[0].metadata.plugin_data.content
    ).session_start_info
    assert set(info.hparams) == {"algorithm.name", "training.rounds"}


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


def test_non_finite_values_are_logged_everywhere_so_a_divergence_shows(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        writer.write_scalars(1, {"train/loss": 1.0})
        writer.write_scalars(2, {"train/loss": float("nan")})
        writer.write_scalars(3, {"train/loss": float("inf")})
    records = read_metrics(str(tmp_path))
    assert math.isnan(records[1]["train/loss"]) and records[2]["train/loss"] == math.inf
    (step1, one), (step2, nan), (step3, inf) = _scalars(str(tmp_path), "train/loss")
    assert (step1, step2, step3) == (1, 2, 3)
    assert one == 1.0 and math.isnan(nan) and inf == math.inf
    with open(tmp_path / "metrics.csv") as f:
        assert f.read().splitlines()[2:] == ["2,train/loss,nan", "3,train/loss,inf"]


def test_event_files_lie_in_the_logdir_so_tensorboard_names_the_run_by_its_path(tmp_path):
    with MetricWriter(str(tmp_path / "runs" / "fedpals")) as writer:
        writer.write_scalars(1, {"a": 1.0})
    events = glob.glob(str(tmp_path / "runs" / "fedpals" / "events.out.tfevents.*"))
    assert len(events) == 1
    assert not os.path.exists(tmp_path / "runs" / "fedpals" / "tensorboard")


def test_csv_has_one_row_per_scalar_and_is_rewound_with_the_jsonl(tmp_path):
    logdir = str(tmp_path)
    with MetricWriter(logdir) as writer:
        for step in (1, 2, 3):
            writer.write_scalars(step, {"target/accuracy": step / 4, "val/accuracy": 0.5})
    with MetricWriter(logdir, resume_step=1) as writer:  # resumed after round 1
        writer.write_scalars(2, {"target/accuracy": 0.125})
    with open(tmp_path / "metrics.csv") as f:
        assert f.read().splitlines() == [
            "step,name,value",
            "1,target/accuracy,0.25",
            "1,val/accuracy,0.5",
            "2,target/accuracy,0.125",
        ]


def test_histograms_go_to_tensorboard_and_jsonl_and_layouts_to_custom_scalars(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        writer.write_layout({"accuracy": ["target/accuracy", "val/accuracy"]})
        writer.write_histogram(1, "server/alpha", [0.2, 0.3, 0.5])
        writer.write_scalars(1, {"server/ess": 12.0})
        with pytest.raises(ValueError, match="has no values"):
            writer.write_histogram(2, "server/alpha", [])
        with pytest.raises(ValueError, match="step must not decrease"):
            writer.write_histogram(0, "server/alpha", [1.0])
    assert read_metrics(str(tmp_path)) == [
        {"step": 1, "server/alpha": [0.2, 0.3, 0.5]},
        {"step": 1, "server/ess": 12.0},
    ]
    events = _events(str(tmp_path))
    (histogram,) = [v.histo for e in events for v in e.summary.value if v.tag == "server/alpha"]
    assert histogram.num == 3 and histogram.sum == pytest.approx(1.0)
    layouts = [v for e in events for v in e.summary.value if v.tag == "custom_scalars__config__"]
    assert len(layouts) == 1


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


def test_the_last_evaluation_reaches_tensorboard_when_the_run_is_killed_after_it(tmp_path):
    # A run's evaluation: its scalars, then the writer's flush; then the process is killed
    # (SIGKILL: no atexit, no close). Only writers.py is loaded, so the child starts fast.
    child = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("writers", {writers_lib.__file__!r})
        writers = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(writers)
        writer = writers.MetricWriter({str(tmp_path)!r})
        for step in (1, 2, 3):
            writer.write_scalars(step, {{"train/loss": 1.0 / step}})
            writer.write_scalars(step, {{"target/accuracy": step / 10, "val/accuracy": 0.5}})
            writer.flush()  # the per-evaluation flush
        print("evaluated", flush=True)
        sys.stdin.read()  # until killed
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", child],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    hung = threading.Timer(300, process.kill)  # a generous bound, never a fixed wait
    hung.start()
    try:
        line = process.stdout.readline()  # blocks until the evaluation is done (or it died)
        assert line == "evaluated\n", process.stderr.read()
    finally:
        hung.cancel()
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=120)
    assert process.returncode == -signal.SIGKILL
    accuracy = _scalars(str(tmp_path), "target/accuracy")
    assert [step for step, _ in accuracy] == [1, 2, 3]
    assert [value for _, value in accuracy] == pytest.approx([0.1, 0.2, 0.3])
    assert _scalars(str(tmp_path), "val/accuracy") == [(1, 0.5), (2, 0.5), (3, 0.5)]
    assert [step for step, _ in _scalars(str(tmp_path), "train/loss")] == [1, 2, 3]


def test_each_file_is_named_to_the_record_before_the_writer_creates_it(tmp_path):
    recorded = []

    def record(name):
        assert not os.path.lexists(tmp_path / name), f"{name} was created before it was recorded"
        recorded.append(name)

    with MetricWriter(str(tmp_path), record=record) as writer:
        writer.write_hparams({"a": 1})
        writer.write_layout({"accuracy": ["a"]})
        writer.write_scalars(1, {"a": 1.0})
        writer.write_histogram(1, "h", [1.0, 2.0])
    (events,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    created = {"hparams.json", "metrics.jsonl", "metrics.csv", os.path.basename(events)}
    assert set(recorded) == created == set(os.listdir(tmp_path))
    # A disabled writer (not the main process) creates nothing, so it records nothing.
    with MetricWriter(str(tmp_path / "other"), enabled=False, record=record) as writer:
        writer.write_scalars(1, {"a": 1.0})
    assert set(recorded) == created


def _hparams_plugin_data(logdir, tag):
    from tensorboardX.proto import plugin_hparams_pb2

    return [
        plugin_hparams_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
        for e in _events(logdir)
        for v in e.summary.value
        if v.tag == tag
    ]


def _differs(info):
    # TensorBoard's HParamInfo.differs (field 7), absent from tensorboardX's api.proto: kept as
    # an unknown field, serialized after the known ones.
    from tensorboardX.proto.api_pb2 import HParamInfo

    known = HParamInfo(name=info.name, type=info.type).SerializeToString()
    return info.SerializeToString() == known + bytes([7 << 3, 1])


METRICS = {"target/accuracy_at_best_val": "the headline", "target/accuracy": "", "val/accuracy": ""}


def test_every_run_declares_the_same_hparams_columns_and_only_the_declared_metrics(tmp_path):
    # TensorBoard takes the HParams columns from the first experiment summary it finds: FedAvg's
    # (no lambda) must declare the lambda column that FedPALS' sets.
    runs = {
        "fedavg": {"method": "fedavg", "seed": 0, "algorithm": {"lam": None, "name": "fedavg"}},
        "fedprox_fedpals": {
            "method": "fedprox_fedpals",
            "seed": 1,
            "algorithm": {"lam": 0.5, "name": "fedprox"},
        },
    }
    experiments = {}
    for name, hparams in runs.items():
        with MetricWriter(str(tmp_path / name)) as writer:
            writer.write_hparams(hparams, METRICS, shown=("method", "seed"))
            writer.write_scalars(1, {"target/accuracy": 0.5, "server/alpha/client_0": 0.3})
        (data,) = _hparams_plugin_data(str(tmp_path / name), "_hparams_/experiment")
        experiments[name] = data.experiment
    for experiment in experiments.values():
        names = [info.name for info in experiment.hparam_infos]
        assert names == ["method", "seed", "algorithm.lam", "algorithm.name"]
        assert [_differs(info) for info in experiment.hparam_infos] == [True, True, False, False]
        assert [m.name.tag for m in experiment.metric_infos] == list(METRICS)  # not every scalar
    from tensorboardX.proto.api_pb2 import DataType

    lam = {name: e.hparam_infos[2].type for name, e in experiments.items()}
    assert lam == {
        "fedavg": DataType.DATA_TYPE_UNSET,  # unset there: no type
        "fedprox_fedpals": DataType.DATA_TYPE_FLOAT64,
    }
    # Each run's own values: the set ones only (no "None" string in a numeric column).
    (start,) = _hparams_plugin_data(str(tmp_path / "fedavg"), "_hparams_/session_start_info")
    assert set(start.session_start_info.hparams) == {"method", "seed", "algorithm.name"}
    assert start.session_start_info.hparams["method"].string_value == "fedavg"


def test_a_constant_quantity_is_one_point_and_a_changing_one_steps_where_it_changed(tmp_path):
    with MetricWriter(str(tmp_path), changed_only="lam|ess|alpha") as writer:
        for step, ess in enumerate([5.0, 5.0, 5.0, 7.0, 7.0], start=1):
            writer.write_scalars(step, {"train/loss": 1.0 / step, "lam": 0.1, "ess": ess})
            writer.write_histogram(step, "alpha", [0.5, 0.5])
    assert _scalars(str(tmp_path), "lam") == [(1, pytest.approx(0.1))]
    # 5 through step 3 (written again before the change, so the curve steps at 4), 7 from 4 to
    # the end (written again at close: it changed).
    assert _scalars(str(tmp_path), "ess") == [(1, 5.0), (3, 5.0), (4, 7.0), (5, 7.0)]
    assert [s for s, _ in _scalars(str(tmp_path), "train/loss")] == [1, 2, 3, 4, 5]
    events = _events(str(tmp_path))
    assert [e.step for e in events for v in e.summary.value if v.tag == "alpha"] == [1]
    assert [r["step"] for r in read_metrics(str(tmp_path)) if "alpha" in r] == [1]


def test_a_resumed_writer_remembers_the_constants_so_its_log_is_the_uninterrupted_one(tmp_path):
    def rounds(writer, steps):
        for step in steps:
            ess = 5.0 if step < 4 else 7.0
            writer.write_scalars(step, {"loss": 1.0 / step, "ess": ess, "lam": 0.1})

    with MetricWriter(str(tmp_path / "whole"), changed_only="ess|lam") as writer:
        rounds(writer, range(1, 6))
    with MetricWriter(str(tmp_path / "resumed"), changed_only="ess|lam") as writer:
        rounds(writer, range(1, 4))  # killed after round 3, its checkpoint at round 2
    with MetricWriter(str(tmp_path / "resumed"), resume_step=2, changed_only="ess|lam") as writer:
        rounds(writer, range(3, 6))
    assert read_metrics(str(tmp_path / "resumed")) == read_metrics(str(tmp_path / "whole"))
    assert [step for step, _ in _scalars(str(tmp_path / "resumed"), "lam")] == [1]


def test_a_write_at_the_resume_step_keeps_what_the_log_holds_up_to_it(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        for step in (1, 2):
            writer.write_scalars(step, {"acc": step / 10})
    # A finished run launched again: its writer resumes at round 2 and may log at round 2.
    with MetricWriter(str(tmp_path), resume_step=2) as writer:
        writer.write_scalars(2, {"extra": 1.0})
    assert read_metrics(str(tmp_path)) == [
        {"step": 1, "acc": 0.1},
        {"step": 2, "acc": 0.2},
        {"step": 2, "extra": 1.0},
    ]


def test_a_resumed_writer_writes_nothing_again_of_what_changed_only_does_not_match(tmp_path):
    with MetricWriter(str(tmp_path), changed_only="ess") as writer:
        writer.write_scalars(5, {"target/accuracy": 0.5, "ess": 3.0})
        writer.write_scalars(10, {"target/accuracy": 0.6})
    with MetricWriter(str(tmp_path), resume_step=12, changed_only="ess"):
        pass  # resumed after round 12, then stopped before writing
    assert read_metrics(str(tmp_path)) == [
        {"step": 5, "target/accuracy": 0.5, "ess": 3.0},
        {"step": 10, "target/accuracy": 0.6},
    ]


def test_the_custom_scalars_charts_draw_exactly_their_tags_and_alpha_per_client():
    import re

    from fedjax_pals.experiment import train as train_lib

    tags = [
        "target/accuracy", "target/accuracy_at_best_val", "val/accuracy", "target/macro_f1",
        "val/macro_f1", "train/loss", "target/loss", "val/loss", "server/alpha",
        "server/alpha/client_0", "server/alpha/client_12", "server/ess",
    ]  # fmt: skip

    def drawn(chart):  # TensorBoard's Custom Scalars: re.match of each regex against each tag
        return [t for t in tags if any(re.match(r, t) for r in train_lib.CHARTS[chart])]

    assert drawn("accuracy (target, validation)") == ["target/accuracy", "val/accuracy"]
    assert drawn("alpha per client (server weights)") == [
        "server/alpha/client_0",
        "server/alpha/client_12",
    ]


@pytest.mark.integration
def test_a_run_gives_tensorboard_its_headline_method_key_and_constants_once(tmp_path):
    import fedjax_pals as fjp

    config = {
        "dataset": {"name": "synthetic"},
        "algorithm": {"name": "fedprox", "weights": "fedpals"},
        "training": {"rounds": 3, "eval_every": 1, "batch_size": 8, "learning_rate": 0.05},
    }
    results = fjp.train_and_evaluate(config, str(tmp_path), quiet=True)
    logdir = str(tmp_path)
    # The headline, at every evaluation as results.json had it; the last one is the run's.
    headline = _scalars(logdir, "target/accuracy_at_best_val")
    assert [s for s, _ in headline] == [1, 2, 3]
    assert headline[-1][1] == pytest.approx(results["target_accuracy_at_best_val"])
    (experiment,) = _hparams_plugin_data(logdir, "_hparams_/experiment")
    assert experiment.experiment.metric_infos[0].name.tag == "target/accuracy_at_best_val"
    (start,) = _hparams_plugin_data(logdir, "_hparams_/session_start_info")
    values = start.session_start_info.hparams
    assert values["method"].string_value == "fedprox_fedpals"  # not algorithm.name's "fedprox"
    assert values["seed"].number_value == 0
    # FedPALS' weights with every client in every round: ESS, lambda, d(T,S) and alpha's
    # histogram are constant for the run, one point each; alpha per client is drawn as lines
    # (the "alpha per client" chart), so it is written every round.
    for tag in ("server/ess", "server/lambda", "server/projection_distance", "server/alpha"):
        assert [e.step for e in _events(logdir) for v in e.summary.value if v.tag == tag] == [1]
    assert [s for s, _ in _scalars(logdir, "server/alpha/client_0")] == [1, 2, 3]
    assert [s for s, _ in _scalars(logdir, "train/loss")] == [1, 2, 3]
    events = _events(logdir)
    (layout,) = [v for e in events for v in e.summary.value if v.tag == "custom_scalars__config__"]
    assert b"server/alpha/client_" in layout.tensor.string_val[0]
