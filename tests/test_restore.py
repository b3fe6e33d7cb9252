"""Runs you can keep and extend: restore_run, the best checkpoint kept, a raised round budget,
and a damaged latest checkpoint resumed from an older intact one."""

import glob
import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment.checkpoints import budget_extension


def _config(rounds, learning_rate=0.5, eval_every=1):
    return {
        "dataset": {"name": "synthetic"},
        "training": {
            "rounds": rounds,
            "eval_every": eval_every,
            "batch_size": 8,
            "learning_rate": learning_rate,
        },
    }


def _target_accuracy(run):
    partition = run.task.partition
    evaluate = fjp.metrics.make_evaluator(
        run.model.apply,
        run.task.dataset.test.x[partition.target_test_indices],
        run.task.dataset.test.y[partition.target_test_indices],
        run.model.num_classes,
    )
    return evaluate(run.params)["accuracy"]


def _leaves_equal(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(la, lb)
    )


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """20 rounds at a learning rate whose validation accuracy peaks early (round 13 on CPU)."""
    workdir = tmp_path_factory.mktemp("long")
    results = fjp.train_and_evaluate(_config(20), str(workdir), quiet=True)
    return workdir, results


# -- the best checkpoint is kept -------------------------------------------------------------


def test_the_checkpointer_keeps_the_best_validation_round_besides_the_last_two(tmp_path):
    state = fjp.ServerState(
        params={"w": np.zeros(2, np.float32)},
        client_states=(),
        algorithm_state=(),
        weighting_state=(),
        round=np.int32(0),
    )
    checkpointer = fjp.experiment.checkpoints.Checkpointer(tmp_path / "ck")
    kept = []
    for step, val in [(1, 0.5), (2, 0.9), (3, 0.7), (4, 0.9), (5, 0.6), (6, 0.8)]:
        history = fjp.TrainingHistory(
            rounds=[step],
            target_accuracy=[0.0],
            target_macro_f1=[0.0],
            val_accuracy=[val],
            val_macro_f1=[0.0],
            train_loss=[1.0] * step,
        )
        checkpointer.save(state._replace(round=np.int32(step)), history)
        kept.append(checkpointer.steps())
    checkpointer.close()
    # Round 2 is the best (round 4 ties it later: the earliest wins, as best_val_index).
    assert kept == [[1], [1, 2], [2, 3], [2, 3, 4], [2, 4, 5], [2, 5, 6]]


def test_restore_run_returns_the_best_and_the_last_model_after_20_rounds(long_run):
    workdir, results = long_run
    best_round = results["best_val_round"]
    # The best round is early: without the best-checkpoint policy it would be deleted.
    assert best_round < 19
    assert fjp.experiment.checkpoints.Checkpointer(workdir / "checkpoints").steps() == [best_round, 19, 20]

    best = fjp.restore_run(workdir, which="best")
    assert isinstance(best, fjp.RestoredRun)
    assert best.round == best_round and int(best.state.round) == best_round
    assert _target_accuracy(best) == results["target_accuracy_at_best_val"]
    assert best.config.to_dict() == fjp.validate_config(_config(20)).to_dict()
    # The config counts the target among the clients; the partition (and the state) do not.
    assert best.config.partition.num_clients == 3 and best.task.partition.num_clients == 2
    assert len(jax.tree_util.tree_leaves(best.state.client_states)) == 0 or all(
        leaf.shape[0] == 2 for leaf in jax.tree_util.tree_leaves(best.state.client_states)
    )
    assert best.history.rounds == results["rounds"]
    assert best.history.val_accuracy == results["val_accuracy"]
    assert best.history.train_loss == results["train_loss"]

    last = fjp.restore_run(str(workdir), which="last")
    assert last.round == 20
    assert _target_accuracy(last) == results["final_target_accuracy"]
    assert not _leaves_equal(best.params, last.params)


def test_run_evaluate_gives_the_accuracy_and_macro_f1_that_results_json_recorded(long_run):
    workdir, results = long_run
    with open(workdir / "results.json") as f:
        recorded = json.load(f)
    for which in ("best", "last"):
        run = fjp.restore_run(workdir, which=which)
        at = recorded["rounds"].index(run.round)
        # Exact: both are computed on the host in float64 from the same integer confusion
        # counts, by training's own evaluator on the same examples and params, and results.json
        # holds Python floats (repr round-trips exactly).
        target, val = run.evaluate("target"), run.evaluate("val")
        assert target["accuracy"] == recorded["target_accuracy"][at]
        assert target["macro_f1"] == recorded["target_macro_f1"][at]
        assert val["accuracy"] == recorded["val_accuracy"][at]
        assert val["macro_f1"] == recorded["val_macro_f1"][at]
        assert run.evaluate("test") == target  # training's name for the target's test set
        assert np.isfinite(target["loss"]) and np.isfinite(val["loss"])
        assert run.evaluate() == target
        # Fractions, as results.json has them; the repr says the percentages too.
        assert isinstance(target, fjp.metrics.Scores) and 0.0 <= target["accuracy"] <= 1.0
        assert f"accuracy={target['accuracy']:.4g} ({100 * target['accuracy']:.1f}%)" in repr(
            target)
    assert run.round == 20 and target["accuracy"] == recorded["final_target_accuracy"]
    best = fjp.restore_run(workdir, which="best")
    assert best.evaluate("target")["accuracy"] == recorded["target_accuracy_at_best_val"]
    assert best.evaluate("target")["macro_f1"] == recorded["target_macro_f1_at_best_val"]
    with pytest.raises(ValueError, match=r"split must be one of \('target', 'val', 'test'\)"):
        best.evaluate("train")


def test_restore_run_refuses_what_it_cannot_restore(tmp_path):
    with pytest.raises(ValueError, match=r"which must be one of \('best', 'last'\)"):
        fjp.restore_run(tmp_path, which="final")
    with pytest.raises(fjp.CheckpointError, match="holds no checkpoints"):
        fjp.restore_run(tmp_path)


# -- a raised round budget extends the run ----------------------------------------------------


@pytest.mark.parametrize("eval_every", [1])
def test_a_finished_run_extended_to_5_rounds_equals_a_5_round_run(tmp_path, eval_every):
    extended, one_go = str(tmp_path / "extended"), str(tmp_path / "one_go")
    fjp.train_and_evaluate(_config(3, 0.05, eval_every), extended, quiet=True)
    results = fjp.train_and_evaluate(_config(5, 0.05, eval_every), extended, quiet=True)
    expected = fjp.train_and_evaluate(_config(5, 0.05, eval_every), one_go, quiet=True)
    for key in expected:
        if key != "wall_seconds":
            assert results[key] == expected[key], key
    assert _leaves_equal(
        fjp.restore_run(extended, "last").state, fjp.restore_run(one_go, "last").state
    )
    # The identity records the budget reached.
    identity = fjp.experiment.checkpoints.Checkpointer(os.path.join(extended, "checkpoints")).read_identity()
    assert identity["config"]["training"]["rounds"] == 5
    assert identity["config_digest"] == fjp.config_digest(_config(5, 0.05, eval_every))
    # A smaller budget is still another run.
    with pytest.raises(fjp.CheckpointMismatchError, match=r"training\.rounds: 5 -> 4"):
        fjp.train_and_evaluate(_config(4, 0.05, eval_every), extended, quiet=True)


def test_only_a_raised_budget_alone_is_an_extension():
    plain = {"algorithm": {"lam_schedule": None}}
    assert budget_extension(plain, ["training.rounds: 3 -> 5"]) == []
    assert budget_extension(plain, ["training.rounds: 5 -> 3"]) == ["training.rounds: 5 -> 3"]
    two = ["training.learning_rate: 0.1 -> 0.2", "training.rounds: 3 -> 5"]
    assert budget_extension(plain, two) == two
    (line,) = budget_extension(
        {"algorithm": {"lam_schedule": "hypergradient"}}, ["training.rounds: 3 -> 5"]
    )
    assert "cannot be extended" in line and "hypergradient" in line


# -- a damaged latest checkpoint --------------------------------------------------------------


def _truncate(step_dir):
    paths = glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True)
    assert paths
    for path in paths:
        with open(path, "r+b") as f:
            f.truncate(3)


def test_a_damaged_latest_checkpoint_resumes_from_the_older_intact_one(long_run, tmp_path, caplog):
    workdir, expected = long_run
    copy = tmp_path / "run"
    shutil.copytree(workdir, copy)
    _truncate(str(copy / "checkpoints" / "20"))
    with caplog.at_level(logging.WARNING):
        resumed = fjp.train_and_evaluate(_config(20), str(copy), quiet=True)
    lines = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert lines == [
        f"the checkpoint of round 20 in {copy}/checkpoints could not be read and was deleted; "
        "resuming from the intact checkpoint of round 19."
    ]
    for key in expected:
        if key != "wall_seconds":
            assert resumed[key] == expected[key], key
    assert fjp.experiment.checkpoints.Checkpointer(copy / "checkpoints").steps() == [expected["best_val_round"], 19, 20]


def test_when_every_checkpoint_is_damaged_the_error_remains(long_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(long_run[0], copy)
    for step in fjp.experiment.checkpoints.Checkpointer(copy / "checkpoints").steps():
        _truncate(str(copy / "checkpoints" / str(step)))
    with pytest.raises(fjp.CheckpointError, match=r"checkpoints/20: it is truncated"):
        fjp.train_and_evaluate(_config(20), str(copy), quiet=True)


# -- damage to any item of any checkpoint -----------------------------------------------------

# (item, how): every item of a checkpoint, metrics (orbax's, read when it opens the folder)
# both garbled and missing.
DAMAGE = [
    ("state", "truncated"),
    ("history", "garbled"),
    ("identity", "deleted"),
    ("metrics", "garbled"),
    ("metrics", "deleted"),
]
POSITIONS = ["latest", "best"]  # round 20, or the older best-validation round the run reports


def _damage(step_dir, item, how):
    if how == "truncated":
        _truncate(step_dir)
    elif how == "deleted":
        shutil.rmtree(os.path.join(step_dir, item))
    else:
        name = "metrics" if item == "metrics" else "metadata"
        with open(os.path.join(step_dir, item, name), "w") as f:
            f.write('{"val_accuracy": 0.9')


def _damaged_copy(long_run, tmp_path, item, how, position):
    """A copy of the 20-round run with one item of one checkpoint damaged, and its round."""
    workdir, results = long_run
    step = 20 if position == "latest" else results["best_val_round"]
    copy = tmp_path / "run"
    shutil.copytree(workdir, copy)
    _damage(str(copy / "checkpoints" / str(step)), item, how)
    return copy, step


def _warnings(caplog, directory):
    # fedjax_pals's lines only: asyncio may log orbax's abandoned reads of the damaged files.
    lines = [r.getMessage() for r in caplog.records if r.name == "absl"]
    return [line for line in lines if directory in line]


def _no_delete_advice(message):
    assert "delete" not in message and "overwrite" not in message, message


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("item,how", DAMAGE)
def test_a_damaged_item_of_any_checkpoint_is_named_and_the_newest_intact_one_restored_and_resumed(
    long_run, tmp_path, caplog, item, how, position
):
    _, expected = long_run
    best = expected["best_val_round"]
    copy, step = _damaged_copy(long_run, tmp_path, item, how, position)
    directory = f"{copy}/checkpoints"
    content = item != "metrics"  # orbax's metrics are a copy of the history's

    # restore_run only reads: the newest intact checkpoint, a damaged newer one named.
    with caplog.at_level(logging.WARNING):
        last = fjp.restore_run(copy, "last")
    lines = _warnings(caplog, directory)
    if content and position == "latest":
        assert last.round == 19 and last.history.rounds == list(range(1, 20))
        (line,) = lines
        assert line.startswith(f"the checkpoint of round 20 in {directory} cannot be read")
        assert line.endswith("; restoring from the intact checkpoint of round 19.")
    else:
        assert last.round == 20 and last.history.rounds == expected["rounds"] and not lines
        assert _target_accuracy(last) == expected["final_target_accuracy"]
    if content and position == "best":
        with pytest.raises(fjp.CheckpointError) as info:
            fjp.restore_run(copy, "best")
        message = str(info.value)
        assert message.startswith(
            f"the checkpoint of the best-validation round {best} in {directory}/{best} "
            "cannot be read ("
        )
        assert message.endswith("which='last' restores the intact checkpoint of round 20.")
        _no_delete_advice(message)
    else:
        assert fjp.restore_run(copy, "best").round == best

    # The run resumes from the newest intact checkpoint, one line naming the damaged round.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        resumed = fjp.train_and_evaluate(_config(20), str(copy), quiet=True)
    lines = _warnings(caplog, directory)
    if content:
        newest = 19 if position == "latest" else 20
        assert lines == [
            f"the checkpoint of round {step} in {directory} could not be read and was "
            f"deleted; resuming from the intact checkpoint of round {newest}."
        ]
        kept = [best, 19, 20] if position == "latest" else [19, 20]  # round 20 trained again
    else:  # rewritten from the history: the checkpoint, the best one too, is kept
        assert lines == [
            f"the best-validation metrics of the checkpoint of round {step} in {directory} "
            "were missing or damaged and were rewritten from its history."
        ]
        kept = [best, 19, 20]
    for key in expected:
        if key != "wall_seconds":
            assert resumed[key] == expected[key], key
    checkpointer = fjp.experiment.checkpoints.Checkpointer(copy / "checkpoints")
    assert checkpointer.steps() == kept
    assert fjp.restore_run(copy, "last").round == 20

    # The keep policy still works from the intact checkpoints' metrics: a worse round 21
    # leaves the best-validation one in place.
    state, history = checkpointer.restore(last.state)
    history = fjp.TrainingHistory(
        **{k: v + [v[-1]] if isinstance(v, list) else v for k, v in history.to_dict().items()}
    )
    history.rounds[-1], history.val_accuracy[-1] = 21, 0.0
    checkpointer.save(state._replace(round=np.int32(21)), history)
    assert checkpointer.steps() == ([best] if best in kept else []) + [20, 21]
    checkpointer.close()


def test_when_every_checkpoint_is_damaged_restore_run_says_so_without_advising_deletion(
    long_run, tmp_path
):
    copy = tmp_path / "run"
    shutil.copytree(long_run[0], copy)
    for step in fjp.experiment.checkpoints.Checkpointer(copy / "checkpoints").steps():
        _damage(str(copy / "checkpoints" / str(step)), "identity", "deleted")
    with pytest.raises(fjp.CheckpointError) as info:
        fjp.restore_run(copy)
    assert str(info.value).startswith(
        f"no checkpoint of the run in {copy} can be read: every one in {copy}/checkpoints is "
        "damaged (round 20: "
    )
    _no_delete_advice(str(info.value))


# -- checkpoints of the dict states, from before the states were NamedTuples -----------------

# The keys of each method's state when it was a dict (main at 7ec8e82), as its checkpoints
# hold them: written out, so that renaming or reordering a field fails here.
DICT_KEYS = {
    "ScaffoldState": ("c",),
    "AflState": ("lam", "avg_params"),
    "FedShiftState": ("aggregate_label_dist",),
    "FedDiscoState": ("global_label_dist", "a", "b"),
    "AdaptiveLambdaState": (
        "client_label_dists", "client_sizes", "val_inputs", "val_labels", "val_weights",
        "opt_state", "log_lam_bounds", "lam_history", "hypergradient_history", "val_loss_history",
    ),
}


def _typed_algorithm(name):
    A, target = fjp.algorithms, [0.3, 0.3, 0.4]
    return {
        "ScaffoldState": lambda: A.scaffold(),
        "AflState": lambda: A.afl(0.1),
        "FedShiftState": lambda: A.fedshift(target),
        "FedDiscoState": lambda: A.feddisco(target),
        "AdaptiveLambdaState": lambda: A.adaptive_fedpals(
            target, [[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], [10, 20], 1.0, None, np.ones((5, 4)),
            np.zeros(5, np.int32), rounds=3, hyper_val_size=8,
        ),
    }[name]()


@pytest.mark.parametrize("name", list(DICT_KEYS))
def test_a_checkpoint_of_the_dict_state_restores_into_the_typed_state(name, tmp_path):
    cls = getattr(fjp.algorithms, name)
    params = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    template = fjp.init_server_state(_typed_algorithm(name), params, 2)
    rng = np.random.default_rng(0)  # distinct values in every leaf: a swapped field shows
    saved = jax.tree_util.tree_map(
        lambda leaf: np.asarray(rng.integers(1, 99, np.shape(leaf)), np.asarray(leaf).dtype)
        if np.issubdtype(np.asarray(leaf).dtype, np.integer)
        else np.asarray(rng.normal(size=np.shape(leaf)), np.asarray(leaf).dtype),
        template,
    )._replace(round=np.int32(3))
    is_typed = lambda node: isinstance(node, cls)
    old = jax.tree_util.tree_map(  # the state as the code before the NamedTuples saved it
        lambda node: dict(zip(DICT_KEYS[name], node)) if is_typed(node) else node,
        saved,
        is_leaf=is_typed,
    )
    old_state = old.weighting_state if name == "FedDiscoState" else old.algorithm_state
    assert isinstance(old_state, dict) and tuple(old_state) == DICT_KEYS[name]
    history = fjp.TrainingHistory(
        rounds=[3], target_accuracy=[0.0], target_macro_f1=[0.0], val_accuracy=[0.5],
        val_macro_f1=[0.0], train_loss=[1.0] * 3,
    )
    checkpointer = fjp.experiment.checkpoints.Checkpointer(tmp_path / "ck")
    checkpointer.save(old, history)
    restored, _ = checkpointer.restore(template)
    checkpointer.close()
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(saved)
    assert _leaves_equal(restored, saved)
