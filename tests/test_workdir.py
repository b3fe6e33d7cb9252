"""Checkpoints (orbax, with the run's identity inside) and workdirs (one config, one writer)."""

import ast
import glob
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import task as task_lib
from fedjax_pals.experiment import workdir as workdir_lib
from fedjax_pals.experiment.workdir import Workdir

# -- Checkpointer ----------------------------------------------------------------------------


def _state(round_=2, value=1.5):
    return fjp.ServerState(
        params={"dense": {"w": jnp.full((2, 3), value, jnp.float32), "b": jnp.zeros(3)}},
        client_states={"c": jnp.arange(4, dtype=jnp.float32)},
        algorithm_state=(),
        weighting_state={"lam": jnp.float32(0.25), "target": jnp.asarray([0.5, 0.5])},
        round=jnp.asarray(round_, jnp.int32),
    )


def _history(rounds=2):
    return fjp.TrainingHistory(
        rounds=[rounds],
        target_accuracy=[0.1 + 1e-9],
        target_macro_f1=[1 / 3],
        val_accuracy=[0.2],
        val_macro_f1=[0.3],
        train_loss=[2.0 / 3.0] * rounds,
        wall_seconds=1.25,
    )


def test_a_checkpoint_round_trips_exactly(tmp_path):
    checkpointer = fjp.experiment.checkpoints.Checkpointer(tmp_path / "ck", identity={"fingerprint": {"seed": "0"}})
    assert checkpointer.restore(_state(0, 0.0)) is None  # nothing saved yet
    checkpointer.save(_state(), _history())
    state, history = fjp.experiment.checkpoints.Checkpointer(
        tmp_path / "ck", identity={"fingerprint": {"seed": "0"}}
    ).restore(_state(0, 0.0))
    assert history == _history()
    expected = _state()
    for leaf, want in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(expected)):
        assert leaf.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want))
    assert int(state.round) == 2


def test_another_runs_checkpoint_is_refused_naming_the_differences(tmp_path):
    fjp.experiment.checkpoints.Checkpointer(tmp_path, identity={"fingerprint": {"seed": "0", "model": "a"}}).save(
        _state(), _history()
    )
    other = fjp.experiment.checkpoints.Checkpointer(tmp_path, identity={"fingerprint": {"seed": "1", "model": "a"}})
    with pytest.raises(fjp.CheckpointMismatchError, match=r"fingerprint\.seed: '0' -> '1'") as info:
        other.restore(_state(0))
    assert "model" not in str(info.value)
    assert f"{tmp_path}/2" in str(info.value)


def _corrupt(directory, how):
    step = os.path.join(directory, "2")
    if how == "truncated":
        for path in glob.glob(os.path.join(step, "state", "**", "d", "*"), recursive=True):
            with open(path, "r+b") as f:
                f.truncate(3)
    elif how == "emptied":
        shutil.rmtree(step)
        os.makedirs(step)
    elif how == "empty_item":
        shutil.rmtree(os.path.join(step, "state"))
        os.makedirs(os.path.join(step, "state"))
    elif how == "garbled_history":
        for path in glob.glob(os.path.join(step, "history", "*metadata")):
            with open(path, "w") as f:
                f.write("{not json")
    elif how == "foreign":
        shutil.rmtree(directory)
        os.makedirs(os.path.join(step, "model"))
        with open(os.path.join(step, "model", "weights.msgpack"), "wb") as f:
            f.write(b"\x81\xa1a\x01")


@pytest.mark.parametrize(
    "how", ["truncated", "emptied", "empty_item", "garbled_history", "foreign"]
)
def test_a_damaged_checkpoint_is_reported_with_its_path_and_remedy(tmp_path, how):
    directory = str(tmp_path / "ck")
    fjp.experiment.checkpoints.Checkpointer(directory, identity={"a": 1}).save(_state(), _history())
    _corrupt(directory, how)
    with pytest.raises(fjp.CheckpointError) as info:
        fjp.experiment.checkpoints.Checkpointer(directory, identity={"a": 1}).restore(_state(0))
    message = str(info.value)
    assert f"cannot read the checkpoint of round 2 in {directory}/2" in message
    assert f"To start afresh: delete {directory}" in message
    # The orbax error is summarised in the message, its traceback suppressed.
    assert info.value.__suppress_context__ and info.value.__cause__ is None


def test_a_file_where_the_checkpoint_directory_should_be_is_refused(tmp_path):
    (tmp_path / "checkpoint.msgpack").write_bytes(b"\x80")
    with pytest.raises(fjp.CheckpointError, match=r"is a file, not a checkpoint directory"):
        fjp.experiment.checkpoints.Checkpointer(tmp_path / "checkpoint.msgpack")


# -- Workdir: lock, identity, overwrite ---------------------------------------------------------

SYNTHETIC = {
    "dataset": {"name": "synthetic"},
    "training": {"rounds": 2, "batch_size": 8, "learning_rate": 0.05},
}


def _resolved(**training):
    config = {**SYNTHETIC, "training": {**SYNTHETIC["training"], **training}}
    resolved = fjp.resolve_config(config)
    return config, resolved, resolved.digest


def test_the_pre_0_2_workdir_form_still_opens_the_same_run_and_warns(tmp_path):
    _, resolved, digest = _resolved()
    with pytest.warns(fjp.deprecation.FedjaxPalsDeprecationWarning, match="resolve_config"):
        old = Workdir(tmp_path, resolved.config, digest)
    assert old.identity == Workdir(tmp_path, resolved).identity
    with pytest.raises(TypeError, match="takes a ResolvedConfig"):
        Workdir(tmp_path, resolved.config)


def test_a_second_writer_of_a_workdir_fails_fast_and_the_lock_dies_with_its_holder(tmp_path):
    _, resolved, digest = _resolved()
    with Workdir(tmp_path, resolved):
        with pytest.raises(
            fjp.WorkdirLockedError,
            match=rf"in use by another run \(process {os.getpid()} on \S+ holds",
        ):
            Workdir(tmp_path, resolved).open()
    Workdir(tmp_path, resolved).open().close()  # released on close

    # A process that holds the lock and is killed leaves the workdir usable.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import sys, time
                import fedjax_pals as fjp
                from fedjax_pals.experiment.workdir import Workdir
                resolved = fjp.resolve_config({SYNTHETIC!r})
                Workdir({str(tmp_path)!r}, resolved).open()
                print("locked", flush=True)
                time.sleep(600)
                """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(fjp.WorkdirLockedError, match=rf"process {holder.pid} on \S+ holds"):
            Workdir(tmp_path, resolved).open()
    finally:
        holder.kill()
        holder.wait()
    Workdir(tmp_path, resolved).open().close()


def test_a_locked_workdir_stops_a_launch_before_data_loading(tmp_path, monkeypatch):
    config, resolved, digest = _resolved()
    monkeypatch.setattr(task_lib, "load_data", lambda *a: pytest.fail("data loading was reached"))
    with Workdir(tmp_path, resolved):
        with pytest.raises(fjp.WorkdirLockedError, match="in use by another run"):
            fjp.train_and_evaluate(config, str(tmp_path), quiet=True)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 2-round synthetic run (its workdir is copied by each test)."""
    workdir = tmp_path_factory.mktemp("finished")
    config, _, _ = _resolved()
    results = fjp.train_and_evaluate(config, str(workdir), quiet=True)
    return workdir, config, results


def _copy(finished_run, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(finished_run[0], workdir)
    return workdir


def test_another_config_in_the_workdir_is_refused_naming_the_differences(finished_run, tmp_path):
    workdir = _copy(finished_run, tmp_path)
    config, _, _ = _resolved(learning_rate=0.1)
    with pytest.raises(
        fjp.CheckpointMismatchError,
        match=r"checkpoints/2 belongs to another run; it differs in: training\.learning_rate: "
        r"0\.05 -> 0\.1\. To start afresh: pass --overwrite",
    ):
        fjp.train_and_evaluate(config, str(workdir), quiet=True)
    # Its results alone (no checkpoint) are refused the same way: they are not overwritten.
    shutil.rmtree(workdir / "checkpoints")
    with pytest.raises(
        fjp.WorkdirError, match=r"holds the results of another config .*learning_rate"
    ):
        fjp.train_and_evaluate(config, str(workdir), quiet=True)


def test_a_foreign_checkpoint_next_to_this_runs_results_is_refused(finished_run, tmp_path):
    workdir = _copy(finished_run, tmp_path)
    other = tmp_path / "other"
    config, _, _ = _resolved(learning_rate=0.1)
    fjp.train_and_evaluate(config, str(other), quiet=True)
    shutil.rmtree(workdir / "checkpoints")
    shutil.copytree(other / "checkpoints", workdir / "checkpoints")
    with pytest.raises(
        fjp.CheckpointMismatchError,
        match=r"checkpoints/2 belongs to another run; it differs in: "
        r"training\.learning_rate: 0\.1 -> 0\.05",
    ):
        fjp.train_and_evaluate(finished_run[1], str(workdir), quiet=True)


def test_overwrite_deletes_nothing_until_the_new_config_and_its_data_are_good(
    finished_run, tmp_path, monkeypatch
):
    workdir = _copy(finished_run, tmp_path)
    (workdir / "notes.txt").write_text("mine")
    before = sorted(os.listdir(workdir))
    with pytest.raises(fjp.ConfigError, match="learning_rate"):
        fjp.train_and_evaluate(
            {**SYNTHETIC, "training": {"learning_rate": -1.0}}, str(workdir), overwrite=True
        )

    def unavailable(config):
        raise fjp.DatasetUnavailableError("no data here")

    monkeypatch.setattr(task_lib, "load_data", unavailable)
    with pytest.raises(fjp.DatasetUnavailableError, match="no data here"):
        fjp.train_and_evaluate(_resolved(learning_rate=0.1)[0], str(workdir), overwrite=True)
    assert sorted(os.listdir(workdir)) == before
    monkeypatch.undo()

    old_events = glob.glob(str(workdir / "events.out.tfevents.*"))
    assert old_events
    config, _, digest = _resolved(learning_rate=0.1)
    results = fjp.train_and_evaluate(config, str(workdir), overwrite=True, quiet=True)
    assert results["config_digest"] == digest
    assert not any(os.path.exists(path) for path in old_events)  # the old run's events went
    assert (workdir / "notes.txt").read_text() == "mine"  # not a run file: kept
    assert fjp.experiment.checkpoints.Checkpointer(workdir / "checkpoints").read_identity()["config_digest"] == digest


def test_an_old_single_file_checkpoint_is_refused_with_the_remedy(tmp_path):
    (tmp_path / "checkpoint.msgpack").write_bytes(b"\x80")
    with pytest.raises(fjp.WorkdirError, match=r"checkpoint of an older fedjax_pals .*--overwrite"):
        fjp.train_and_evaluate(SYNTHETIC, str(tmp_path), quiet=True)


def test_an_unreadable_results_file_is_refused(tmp_path):
    (tmp_path / "results.json").write_text('{"config_digest": ')
    with pytest.raises(fjp.WorkdirError, match=r"cannot read .*results\.json .*--overwrite"):
        fjp.train_and_evaluate(SYNTHETIC, str(tmp_path), quiet=True)


def test_a_truncated_checkpoint_in_a_workdir_names_its_path_and_overwrite(finished_run, tmp_path):
    workdir = _copy(finished_run, tmp_path)
    # Without an older intact checkpoint (else the run resumes from it: tests/test_restore.py).
    shutil.rmtree(workdir / "checkpoints" / "1")
    _corrupt(str(workdir / "checkpoints"), "emptied")
    with pytest.raises(
        fjp.CheckpointError,
        match=rf"{workdir}/checkpoints/2: it is truncated, empty "
        r".*To start afresh: pass --overwrite",
    ):
        fjp.train_and_evaluate(finished_run[1], str(workdir), quiet=True)


def test_json_files_get_the_mode_of_any_new_file_not_0600(tmp_path):
    from fedjax_pals.experiment.workdir import write_json

    previous = os.umask(0o022)
    try:
        write_json(str(tmp_path / "results.json"), {"a": 1})
    finally:
        os.umask(previous)
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == 0o644


# -- Workdir: what --overwrite deletes -----------------------------------------------------------


def _mkfile(path, text="x"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


USERS_OWN = (
    "notes.txt",
    "tensorboard/events.out.tfevents.1700000000.laptop",  # the old layout, kept by its user
    "events.out.tfevents.1700000000.laptop",
    "events.out.tfevents.1700000000.laptop.4242.0123abcd",  # even one named like the run's
)


def test_overwrite_keeps_a_users_own_tensorboard_directory_and_event_files(finished_run, tmp_path):
    workdir = _copy(finished_run, tmp_path)
    runs_events = {os.path.basename(p) for p in glob.glob(str(workdir / "events.out.tfevents.*"))}
    assert runs_events
    for name in USERS_OWN:
        _mkfile(workdir / name, "mine")
    config, _, digest = _resolved(learning_rate=0.1)
    results = fjp.train_and_evaluate(config, str(workdir), overwrite=True, quiet=True)
    assert results["config_digest"] == digest
    for name in USERS_OWN:
        assert (workdir / name).read_text() == "mine", name
    assert not any(os.path.exists(workdir / name) for name in runs_events)  # the run's went
    assert runs_events <= set(_record(finished_run[0]))  # as the old run had recorded them
    # The new run recorded what it created, its event file by its exact name.
    (new_events,) = {
        os.path.basename(p) for p in glob.glob(str(workdir / "events.out.tfevents.*"))
    } - {os.path.basename(name) for name in USERS_OWN}
    assert set(_record(workdir)) == {
        *("checkpoints", "results.json", "curves.png", "curves.pdf"),
        *("metrics.jsonl", "metrics.csv", "hparams.json", new_events),
    }


def _record(directory):
    return workdir_lib.read_record(os.path.join(directory, workdir_lib.RECORD_FILE))


@pytest.fixture
def workdir(tmp_path):
    """An empty workdir, locked as the main process of a run locks it."""
    _, resolved, digest = _resolved()
    with Workdir(tmp_path / "run", resolved) as opened:
        yield opened


RUNS_FIXED_FILES = (
    "checkpoints/2/state",
    "results.json",
    "metrics.jsonl",
    "metrics.csv",
    "hparams.json",
    "curves.png",
    "curves.pdf",
    "checkpoint.msgpack",
)


def test_a_workdir_from_before_the_record_loses_only_the_files_a_new_run_writes_over(workdir):
    for name in (*RUNS_FIXED_FILES, *USERS_OWN):
        _mkfile(os.path.join(workdir.path, name))
    removed = workdir.clear()
    assert sorted(removed) == sorted(name.split("/")[0] for name in RUNS_FIXED_FILES)
    assert all(os.path.exists(os.path.join(workdir.path, name)) for name in USERS_OWN)
    assert _record(workdir.path) == []  # cleared: nothing of the run is left


def test_overwrite_deletes_what_the_run_recorded_removing_a_link_not_its_target(
    workdir, tmp_path
):
    outside = tmp_path / "elsewhere"
    _mkfile(outside / "precious")
    events = "events.out.tfevents.1700000000.host.1.0123abcd"
    workdir.record(events, "linked")
    _mkfile(workdir.file(events))
    os.symlink(outside, workdir.file("linked"))
    for name in USERS_OWN:
        _mkfile(os.path.join(workdir.path, name))
    assert sorted(workdir.clear()) == [events, "linked"]
    assert (outside / "precious").exists()
    assert all(os.path.exists(os.path.join(workdir.path, name)) for name in USERS_OWN)
    assert _record(workdir.path) == []


@pytest.mark.parametrize(
    "damage",
    [
        "garbled",
        '"events.out.tfevents.1700000000.laptop"\n"../elsewhere"\n',  # outside the workdir
        '"events.out.tfevents.1700000000.laptop"\n{"not": "a name"}\n',
    ],
)
def test_a_damaged_record_deletes_nothing_unrecorded_and_says_so_in_one_line(
    workdir, tmp_path, damage, caplog
):
    _mkfile(tmp_path / "elsewhere")
    for name in (*RUNS_FIXED_FILES, *USERS_OWN):
        _mkfile(os.path.join(workdir.path, name))
    text = damage if damage == "garbled" else workdir_lib.RECORD_HEADER + "\n" + damage
    _mkfile(workdir.file(workdir_lib.RECORD_FILE), text)
    with caplog.at_level("WARNING"):
        removed = workdir.clear()
    assert sorted(removed) == sorted(name.split("/")[0] for name in RUNS_FIXED_FILES)
    assert all(os.path.exists(os.path.join(workdir.path, name)) for name in USERS_OWN)
    assert (tmp_path / "elsewhere").exists()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"the record {workdir.file(workdir_lib.RECORD_FILE)} is damaged" in warning
    assert "every other file kept" in warning and "\n" not in warning


def test_a_run_killed_while_recording_leaves_a_record_that_still_works(workdir):
    # Killed mid-line: the torn name's file was never created (names are recorded first).
    torn = workdir_lib.RECORD_HEADER + '\n"results.json"\n"events.out.tf'
    _mkfile(workdir.file(workdir_lib.RECORD_FILE), torn)
    assert _record(workdir.path) == ["results.json"]
    workdir.record("curves.png")  # the next run appends a whole line, not a torn one
    assert _record(workdir.path) == ["results.json", "curves.png"]
    # Killed while starting the record: an empty record, not a damaged one.
    _mkfile(workdir.file(workdir_lib.RECORD_FILE), workdir_lib.RECORD_HEADER[:10])
    assert _record(workdir.path) == []


def test_only_the_process_holding_the_lock_records(tmp_path):
    _, resolved, digest = _resolved()
    other = Workdir(tmp_path, resolved, lock=False).open()  # a process other than 0
    other.record("results.json")
    assert not os.path.exists(other.file(workdir_lib.RECORD_FILE))
    with pytest.raises(ValueError, match="by name"):
        other.record("../results.json")


# -- imports -----------------------------------------------------------------------------------


def _module_imports(package_dir):
    """{module: the fedjax_pals modules it imports}, at the top or inside functions (not under
    `if TYPE_CHECKING:`): the module an import names, and the packages above it that do not
    hold the importer (importing fedjax_pals.algorithms.base from outside runs
    fedjax_pals/algorithms/__init__.py first, and everything it imports)."""
    root = os.path.dirname(package_dir)
    modules = {}
    for dirpath, _, files in os.walk(package_dir):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                modules[module.removesuffix(".__init__")] = path

    def known(name):  # the module `name` is, or the package holding the object it names
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in modules.items():
        tree = ast.parse(open(path).read(), path)
        skipped = {
            id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test) for b in node.body for n in ast.walk(b)
        }
        graph[module] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for target in {known(n) for n in names if n.startswith("fedjax_pals")}:
                while target and not (module + ".").startswith(target + "."):
                    graph[module].add(target)
                    target = target.rpartition(".")[0]
            graph[module].discard(module)
    return graph


def test_no_module_of_the_package_imports_itself_back():
    # WorkdirLockedError lives in errors.py so that locks.py no longer imports workdir.py,
    # which imports locks.py: every fedjax_pals module now imports only modules that do not
    # import it back, lazily or not.
    assert fjp.WorkdirLockedError is workdir_lib.WorkdirLockedError
    assert fjp.WorkdirLockedError.__module__ == "fedjax_pals.experiment.errors"
    graph = _module_imports(os.path.dirname(fjp.__file__))
    assert "fedjax_pals.experiment.errors" in graph["fedjax_pals.experiment.locks"]

    def reaches(start, goal, seen):
        return any(
            nxt == goal or (nxt not in seen and not seen.add(nxt) and reaches(nxt, goal, seen))
            for nxt in graph[start]
        )

    cycles = sorted(m for m in graph if reaches(m, m, set()))
    assert not cycles, f"modules importing themselves back: {cycles}"
