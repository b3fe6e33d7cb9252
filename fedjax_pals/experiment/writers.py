"""Metric writer: TensorBoard event files (tensorboardX, no TensorFlow), JSONL and CSV logs,
and optionally MLflow (`mlflow_writer.py`).

A run's `logdir` gets

* `metrics.jsonl`: one JSON object per `write_scalars` call, `{"step": s, name: value, ...}`
  (and one per `write_histogram`, `{"step": s, name: [values]}`), flushed at every call so a
  killed run loses nothing that was written;
* `metrics.csv`: the scalars again, one `step,name,value` row each (for spreadsheets, pandas);
* `hparams.json`: the run's hyperparameters (flattened, written once per run; unset ones null);
* `events.out.tfevents.*`: event files in the logdir itself, so that `tensorboard --logdir
  <runs>` names each run by its workdir path (scalars under their own names, NaN and inf
  included so that a divergence shows; histograms; hyperparameters through the HParams
  plugin, unset ones left out; a Custom Scalars layout that puts curves on one chart).
  Written in the caller's thread, each call's events handed to the OS before it returns and
  `flush()` syncing them to disk: tensorboardX's SummaryWriter queues events for a thread of
  its own, which its flush() does not drain, so a run killed after an evaluation lost them.

Each file is named to the optional `record` callback before it is created (train passes the
workdir's record of what the run created, which --overwrite deletes).

HParams (`write_hparams(..., metrics=...)`): TensorBoard's HParams dashboard takes its columns
from one experiment summary, the first it finds among the runs, so every run writes the same
one: every hyperparameter key it has, set or not (a run of one method lacks another's keys'
values, never the keys: FedAvg's `algorithm.lam` column exists and is empty for it), and the
declared metrics only (without them the dashboard lists every scalar tag as a metric). A run
records only its set values: a placeholder ("None") for the unset ones would turn a numeric
column into a string one, its filter and sort with it. A key's type is that of this run's
value (unset keys: no type). The dashboard shows five hyperparameter columns by default,
those marked "differs" first, each group by name: `shown` marks them (the method key, the
seed, ...).

Constant quantities (`MetricWriter(..., changed_only=regex)`: the scalars and histograms whose
names match it): a value equal to the last one written under its name is not written again,
so a quantity constant for the run (FedPALS' weights, lambda, ESS) is one point, not a flat
line every round; when it changes, the last value it held is written again at the step it was
last given (so that the curve steps where the value did) before the new one, and a quantity
that has changed is written once more at `close` if it held a value since (so that its curve
runs to the run's last step).

Resume: a run killed after its last checkpoint re-does the rounds after it, so a new writer
on the same `logdir` rewinds the log at its first `write_scalars(step, ...)`: JSONL lines with
a step >= `step` are dropped, and a TensorBoard `SessionLog.START` event at `step` makes
TensorBoard purge the old events from that step on (the mechanism behind tensorboardX's
`purge_step`). Passing `resume_step=r` rewinds at once to the lines with step <= r. Either way a
resumed run's log never holds a round twice. Within one writer the steps given must not
decrease; a step may be written by several calls (e.g. the training loss, then the evaluation,
of one round). With `changed_only`, a call writes a line only for what changed (none, when
nothing did), and a held value is written again at the earlier step it was last given: the
lines of metrics.jsonl are then not in step order (`read_metrics` users sort by step).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import glob
import json
import math
import numbers
import os
import re
import socket
import struct
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

import numpy as np

METRICS_FILE = "metrics.jsonl"
CSV_FILE = "metrics.csv"
HPARAMS_FILE = "hparams.json"
EVENTS_PATTERN = "events.out.tfevents.*"


class _EventFile:
    """A TensorBoard event file written synchronously: what tensorboardX's SummaryWriter
    writes, without its queue and writer thread (see the module docstring)."""

    def __init__(self, path: str):
        from tensorboardX.proto.event_pb2 import Event

        self.path = path
        self._file = open(path, "xb")  # a fresh name (see `_event_file_name`): never reused
        self.write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write(self, *events) -> None:
        """Appends `events` (tensorboardX `Event` protos) and hands them to the OS, so that a
        killed process loses none of them."""
        from tensorboardX.record_writer import masked_crc32c

        for event in events:
            data = event.SerializeToString()
            header = struct.pack("<Q", len(data))  # TFRecord framing
            self._file.write(header + struct.pack("<I", masked_crc32c(header)))
            self._file.write(data + struct.pack("<I", masked_crc32c(data)))
        self._file.flush()

    def summaries(self, step: int, *summaries) -> None:
        from tensorboardX.proto.event_pb2 import Event

        now = time.time()
        self.write(*(Event(wall_time=now, step=step, summary=s) for s in summaries))

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())  # on disk: survives the machine too

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()


def _event_file_name() -> str:
    # tensorboardX's name (the second it was opened in, the host), with a suffix that keeps a
    # resumed writer opened within the same second from reusing the first writer's name.
    stamp, host = int(time.time()), socket.gethostname()
    return f"events.out.tfevents.{stamp}.{host}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


@functools.cache
def _histogram_bins() -> tuple[float, ...]:
    # SummaryWriter's default buckets (TensorFlow's), computed as it does: +-1e-12 * 1.1^k, 0.
    value, buckets = 1e-12, []
    while value < 1e20:
        buckets.append(value)
        value *= 1.1
    return (*(-b for b in reversed(buckets)), 0, *buckets)


def _check_step(step: Any) -> int:
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step must be an integer >= 0, got {step!r} ({type(step).__name__}).")
    if step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step}.")
    return int(step)


def _scalar(name: str, value: Any) -> float:
    if not isinstance(name, str) or not name:
        raise TypeError(f"scalar names must be non-empty strings, got {name!r}.")
    if name == "step":
        raise ValueError("'step' is reserved for the step of a metrics.jsonl line.")
    array = np.asarray(value)
    if array.ndim != 0 or array.dtype.kind not in "biuf":
        raise TypeError(f"scalar {name!r} must be a real number, got {value!r}.")
    return float(array)


def _hparam_value(value: Any) -> bool | int | float | str | None:
    # TensorBoard's HParams plugin takes bool, number or string values only (None: unset).
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return json.dumps(value) if isinstance(value, (list, tuple)) else str(value)


def _same(a: Any, b: Any) -> bool:
    """Equal values (NaN equal to NaN): scalars (floats) or histograms (tuples of floats)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        both = isinstance(a, tuple) and isinstance(b, tuple)
        return both and np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    both_float = isinstance(a, float) and isinstance(b, float)
    return a == b or (both_float and math.isnan(a) and math.isnan(b))


def _replace(path: str, write: Callable[[Any], Any], newline: str | None = None) -> None:
    """Rewrites `path` atomically: `write(file)` into a temporary file, then renamed."""
    with open(path + ".tmp", "w", newline=newline) as f:
        write(f)
    os.replace(path + ".tmp", path)


def _memory_value(value: Any) -> Any:
    # A metrics.jsonl value as `_same` compares it: a histogram's list as a tuple.
    return tuple(value) if isinstance(value, list) else value


# HParamInfo.differs = true, serialized: field 7, varint 1.
_DIFFERS = bytes([7 << 3, 1])


def _hparams_experiment(flat: Mapping[str, Any], metrics: Mapping[str, str], shown: Sequence[str]):
    """The HParams plugin's experiment summary: every key of `flat` (set or not, see the module
    docstring), `shown` first and marked "differs", then the declared metrics in order."""
    from tensorboardX.proto.api_pb2 import DataType, Experiment, HParamInfo, MetricInfo, MetricName
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata

    def data_type(value: Any) -> int:
        if isinstance(value, bool):
            return DataType.DATA_TYPE_BOOL
        if isinstance(value, (int, float)):
            return DataType.DATA_TYPE_FLOAT64
        if isinstance(value, str):
            return DataType.DATA_TYPE_STRING
        return DataType.DATA_TYPE_UNSET  # unset here: another run's value gives it its type

    def info(name: str) -> HParamInfo:
        hparam = HParamInfo(name=name, type=data_type(flat[name]))
        if name in shown:
            # TensorBoard's `differs` (field 7), which tensorboardX's copy of api.proto lacks:
            # parsed as an unknown field, kept when serialized.
            hparam.MergeFromString(_DIFFERS)
        return hparam

    names = [*(k for k in shown if k in flat), *(k for k in flat if k not in shown)]
    experiment = Experiment(
        hparam_infos=[info(k) for k in names],
        metric_infos=[
            MetricInfo(name=MetricName(tag=tag), description=description)
            for tag, description in metrics.items()
        ],
    )
    content = HParamsPluginData(experiment=experiment, version=0).SerializeToString()
    metadata = SummaryMetadata(
        plugin_data=SummaryMetadata.PluginData(plugin_name="hparams", content=content)
    )
    return Summary(value=[Summary.Value(tag="_hparams_/experiment", metadata=metadata)])


def flatten_hparams(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings (e.g. a ConfigDict's `to_dict()`) as one level: `{"a.b": v}`."""
    flat: dict[str, Any] = {}
    for key, value in hparams.items():
        name = f"{prefix}{key}"
        if hasattr(value, "to_dict"):  # ml_collections.ConfigDict
            value = value.to_dict()
        if isinstance(value, Mapping):
            flat.update(flatten_hparams(value, name + "."))
        else:
            flat[name] = _hparam_value(value)
    return flat


def read_metrics(logdir: str) -> list[dict[str, Any]]:
    """The lines of `<logdir>/metrics.jsonl` (empty if there is none); a torn last line
    (a kill in the middle of a write) is skipped."""
    path = os.path.join(logdir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
    return records


class MetricWriter:
    """Scalars to TensorBoard event files and `metrics.jsonl`; hyperparameters once per run.

    Args:
      logdir: the run's directory (created if missing).
      enabled: False writes nothing at all (processes other than the main one).
      resume_step: when resuming from a checkpoint of round r, pass r to drop at once every
        logged step > r; without it the log is rewound at the first write (see module doc).
      mlflow_tracking_uri: also log params and scalars to this MLflow tracking store (one
        MLflow run per logdir; `mlflow_writer.py`). None: `$MLFLOW_TRACKING_URI` where set,
        else no MLflow.
      mlflow_experiment: the MLflow experiment of that run (None: `$MLFLOW_EXPERIMENT_NAME`
        where set, else `fedjax_pals`).
      mlflow_run_name: the MLflow run's name (default: the logdir's name); the absolute logdir
        is its tag `fedjax_pals.workdir`, which finds the run again.
      record: called with the name of each file the writer creates in `logdir`, before it
        creates it (the workdir's record of the run's files). None: no record.
      changed_only: a regular expression (`re.fullmatch`) of the scalar and histogram names
        written only when their value changes (module docstring). None: every value written.
    """

    def __init__(
        self,
        logdir: str,
        *,
        enabled: bool = True,
        resume_step: int | None = None,
        mlflow_tracking_uri: str | None = None,
        mlflow_experiment: str | None = None,
        mlflow_run_name: str | None = None,
        record: Callable[[str], None] | None = None,
        changed_only: str | None = None,
    ):
        if not isinstance(logdir, (str, os.PathLike)) or not str(logdir):
            raise TypeError(f"logdir must be a non-empty path, got {logdir!r}.")
        self.logdir = str(logdir)
        self.enabled = bool(enabled)
        self._tb = self._file = self._csv = None
        self._last_step: int | None = None
        self._rewound = False  # the log was rewound for this writer's first step
        # name -> (step, value) last written; name -> (step, value) last given unchanged;
        # names written more than once (a quantity that changed); histogram names.
        self._written: dict[str, tuple[int, Any]] = {}
        self._held: dict[str, tuple[int, Any]] = {}
        self._changed_names: set[str] = set()
        self._histograms: set[str] = set()
        self._closed = False
        self._mlflow = None
        self._record = record if record is not None else lambda name: None
        self._changed_only = re.compile(changed_only) if changed_only else None
        if not self.enabled:
            return
        from fedjax_pals.experiment.mlflow_writer import MlflowWriter, tracking_uri

        if tracking_uri(mlflow_tracking_uri) is not None:  # given, or $MLFLOW_TRACKING_URI
            self._mlflow = MlflowWriter(
                mlflow_tracking_uri,
                self.logdir,
                **({"experiment": mlflow_experiment} if mlflow_experiment is not None else {}),
                run_name=mlflow_run_name,
            )
        os.makedirs(self.logdir, exist_ok=True)
        self._jsonl_path = os.path.join(self.logdir, METRICS_FILE)
        self._csv_path = os.path.join(self.logdir, CSV_FILE)
        self._had_events = bool(glob.glob(os.path.join(self.logdir, EVENTS_PATTERN)))
        if resume_step is not None:
            self._rewind(_check_step(resume_step) + 1)
            self._rewound = True

    # -- internals -------------------------------------------------------------

    def _writer(self) -> _EventFile:
        if self._tb is None:
            name = _event_file_name()
            self._record(name)
            self._tb = _EventFile(os.path.join(self.logdir, name))
        return self._tb

    def _open_log(self, name: str, newline: str | None = None):
        self._record(name)
        return open(os.path.join(self.logdir, name), "a", newline=newline)

    def _rewind(self, step: int) -> None:
        """Drops every logged step >= `step` (JSONL rewritten atomically; TensorBoard purge);
        the values kept are the last ones written, for `changed_only` (held until `step` - 1)."""
        kept = [r for r in read_metrics(self.logdir) if r["step"] < step]
        self._written, self._held, self._changed_names = {}, {}, set()
        for record in sorted(kept, key=lambda r: r["step"]):
            for name, value in record.items():
                if name != "step":
                    if name in self._written:
                        self._changed_names.add(name)
                    if isinstance(value, list):
                        self._histograms.add(name)
                    self._written[name] = (record["step"], _memory_value(value))
        pattern = self._changed_only
        for name, (written, value) in self._written.items():
            if written < step - 1 and pattern is not None and pattern.fullmatch(name):
                self._held[name] = (step - 1, value)
        if os.path.exists(self._jsonl_path):
            _replace(self._jsonl_path, lambda f: f.writelines(json.dumps(r) + "\n" for r in kept))
        if os.path.exists(self._csv_path):
            with open(self._csv_path, newline="") as f:
                rows = [row for row in csv.reader(f) if len(row) == 3]
            rows = [row for row in rows if not row[0].isdigit() or int(row[0]) < step]
            _replace(self._csv_path, lambda f: csv.writer(f).writerows(rows), newline="")
        if self._had_events:
            from tensorboardX.proto.event_pb2 import Event, SessionLog

            # TensorBoard drops events of step >= this one written before it.
            start = SessionLog(status=SessionLog.START)
            self._writer().write(Event(wall_time=time.time(), step=step, session_log=start))
        self._had_events = False  # purged once: later rewinds need no second event

    # -- public ----------------------------------------------------------------

    def write_hparams(
        self,
        hparams: Mapping[str, Any],
        metrics: Mapping[str, str] | Sequence[str] = (),
        *,
        shown: Sequence[str] = (),
    ) -> None:
        """Writes the run's hyperparameters (nested mappings flattened to "a.b" keys) to
        `hparams.json` and TensorBoard's HParams plugin; a resumed run with the same ones
        writes nothing again.

        Args:
          hparams: the hyperparameters (None: unset).
          metrics: the scalar tags the HParams dashboard shows as metric columns, in order (a
            mapping gives each a description); none: it lists every scalar tag instead.
          shown: hyperparameters the dashboard shows by default (at most five, by name).
        """
        if not isinstance(hparams, Mapping) and not hasattr(hparams, "to_dict"):
            raise TypeError(f"hparams must be a mapping, got {type(hparams).__name__}.")
        self._check_open()
        if not self.enabled:
            return
        flat = flatten_hparams(hparams.to_dict() if hasattr(hparams, "to_dict") else hparams)
        if self._mlflow is not None:
            self._mlflow.write_hparams(flat)
        path = os.path.join(self.logdir, HPARAMS_FILE)
        if os.path.exists(path):
            with open(path) as f, contextlib.suppress(json.JSONDecodeError):
                if json.load(f) == json.loads(json.dumps(flat)):
                    return
        self._record(HPARAMS_FILE)
        _replace(path, lambda f: json.dump(flat, f, indent=2, sort_keys=True))
        from tensorboardX.summary import hparams as hparams_summary

        _, session_start, session_end = hparams_summary(
            {k: v for k, v in flat.items() if v is not None}, {}
        )
        summaries = [session_start, session_end]
        if metrics:
            # Without it the HParams plugin builds one from the sessions, every scalar tag a
            # metric; with it, the same in every run (module docstring).
            if not isinstance(metrics, Mapping):
                metrics = {tag: "" for tag in metrics}
            summaries.insert(0, _hparams_experiment(flat, metrics, list(shown)))
        self._writer().summaries(0, *summaries)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Logs `scalars` at `step` (one JSONL line, one TensorBoard scalar each; those that
        `changed_only` matches only if their value changed)."""
        step = _check_step(step)
        if not isinstance(scalars, Mapping):
            raise TypeError(f"scalars must be a mapping name -> number, got {scalars!r}.")
        values = {name: _scalar(name, value) for name, value in scalars.items()}
        if not self._begin(step):
            return
        values, held = self._changed(step, values)
        for held_step, held_values in sorted(held.items()):
            self._emit_scalars(held_step, held_values)
        if values:
            self._emit_scalars(step, values)

    def _emit_scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._log(step, values)
        if self._mlflow is not None:
            self._mlflow.write_scalars(step, values)
        if self._csv is None:
            new = not os.path.exists(self._csv_path) or not os.path.getsize(self._csv_path)
            self._csv = self._open_log(CSV_FILE, newline="")
            if new:
                csv.writer(self._csv).writerow(["step", "name", "value"])
        csv.writer(self._csv).writerows([step, name, repr(value)] for name, value in values.items())
        self._csv.flush()
        from tensorboardX.summary import scalar

        # NaN and inf too: TensorBoard marks them, and a divergence must show.
        self._writer().summaries(step, *(scalar(name, value) for name, value in values.items()))

    def write_histogram(self, step: int, name: str, values: Any) -> None:
        """Logs the distribution of `values` (e.g. the server's weight per client) at `step`:
        a TensorBoard histogram and a JSONL line `{"step": step, name: [values]}` (if
        `changed_only` matches `name`, only when they changed)."""
        step = _check_step(step)
        if not isinstance(name, str) or not name or name == "step":
            raise ValueError(f"a histogram needs a name other than 'step', got {name!r}.")
        array = np.asarray(values, np.float64).ravel()
        if array.size == 0:
            raise ValueError(f"histogram {name!r} has no values.")
        if not self._begin(step):
            return
        self._histograms.add(name)
        values, held = self._changed(step, {name: tuple(array.tolist())})
        for held_step, held_values in sorted(held.items()):
            self._emit_histogram(held_step, name, held_values[name])
        if values:
            self._emit_histogram(step, name, values[name])

    def _emit_histogram(self, step: int, name: str, values: tuple) -> None:
        from tensorboardX.summary import histogram

        self._log(step, {name: list(values)})
        self._writer().summaries(
            step, histogram(name, np.asarray(values, np.float64), _histogram_bins())
        )

    def write_layout(self, charts: Mapping[str, Sequence[str]], title: str = "fedjax_pals") -> None:
        """TensorBoard Custom Scalars charts: `{chart: [tags drawn together]}`. Each entry is a
        regular expression that TensorBoard matches at the start of a tag (`re.match`):
        `server/alpha/client_\\d+$` draws every client's weight; end a plain tag with `$`
        ("target/accuracy$") so that it does not draw "target/accuracy_at_best_val" too."""
        self._check_open()
        if self.enabled:
            from tensorboardX.summary import custom_scalars

            layout = {title: {chart: ["Multiline", list(tags)] for chart, tags in charts.items()}}
            self._writer().summaries(0, custom_scalars(layout))

    def _begin(self, step: int) -> bool:
        """Checks a write at `step` and rewinds the logs at this writer's first step (unless
        `resume_step` already did); False when this writer is disabled (it only keeps the step)."""
        self._check_open()
        if self._last_step is not None and step < self._last_step:
            raise ValueError(
                f"step must not decrease within a run: got {step} after {self._last_step}."
            )
        if self.enabled and not self._rewound:
            self._rewind(step)  # a resumed run re-does the rounds from `step` on
            self._rewound = True
        self._last_step = step
        return self.enabled

    def _changed(
        self, step: int, values: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
        """(the values to write at `step`, {earlier step: held values to write again first})
        for `changed_only` (module docstring); remembers what is written."""
        write: dict[str, Any] = {}
        held: dict[int, dict[str, Any]] = {}
        pattern = self._changed_only
        only = {n for n in values if pattern is not None and pattern.fullmatch(n)}
        for name, value in values.items():
            last = self._written.get(name)
            if name in only and last is not None and _same(last[1], value):
                if step > last[0]:
                    self._held[name] = (step, value)
                continue
            previous = self._held.pop(name, None)
            if name in only and previous is not None and previous[0] < step:
                held.setdefault(previous[0], {})[name] = previous[1]
            if last is not None:
                self._changed_names.add(name)
            self._written[name] = (step, value)
            write[name] = value
        return write, held

    def _log(self, step: int, values: Mapping[str, Any]) -> None:
        """One JSONL line."""
        if self._file is None:
            self._file = self._open_log(METRICS_FILE)
        self._file.write(json.dumps({"step": step, **values}) + "\n")
        self._file.flush()

    def write_artifacts(self, paths: Sequence[str]) -> None:
        """Copies the run's files `paths` (results.json, curves.png, ...) to its MLflow run, if
        any (those that do not exist are skipped); TensorBoard has no artifacts."""
        self._check_open()
        if self.enabled and self._mlflow is not None:
            self._mlflow.write_artifacts([p for p in paths if os.path.isfile(p)])

    def flush(self) -> None:
        """Syncs the event file to disk. Every call has already handed its lines and events
        to the OS (a killed process loses none of them); a run flushes at every evaluation so
        that a machine that goes down loses none either."""
        for handle in (self._file, self._csv, self._tb):
            if handle is not None:
                handle.flush()

    def _write_held(self) -> None:
        """The last value of each quantity that changed, held since (module docstring)."""
        held: dict[int, dict[str, Any]] = {}
        for name, (step, value) in self._held.items():
            if name in self._changed_names and step > self._written[name][0]:
                held.setdefault(step, {})[name] = value
        self._held = {}
        for step, values in sorted(held.items()):
            scalars = {n: v for n, v in values.items() if n not in self._histograms}
            if scalars:
                self._emit_scalars(step, scalars)
            for name in values.keys() & self._histograms:
                self._emit_histogram(step, name, values[name])

    def close(self) -> None:
        if self._closed:
            return
        if self.enabled:
            self._write_held()
        self.flush()
        for attribute in ("_file", "_csv", "_tb"):
            handle = getattr(self, attribute)
            if handle is not None:
                handle.close()
                setattr(self, attribute, None)
        if self._mlflow is not None:
            self._mlflow.close()
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this MetricWriter for {self.logdir} is closed.")

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
