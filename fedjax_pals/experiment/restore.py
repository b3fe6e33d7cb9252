"""`restore_run(workdir, which)`: a trained run's model back from its workdir, nothing trained.

    run = fjp.restore_run("runs/fedpals", which="best")
    logits = run.model.apply(run.params, x)   # x as the data set stores it (uint8 pixels)
    run.evaluate("target")   # {"accuracy", "macro_f1", "loss"}: what results.json recorded
                             # (fractions in [0, 1]; its repr shows them in % too)

The run's resolved config comes from its newest readable checkpoint (the identity saved with
it; a damaged newer one is skipped, with one warning line naming its round), the task is
rebuilt from it (`build_task`: data, partition, algorithm, model), the initial server state is
the template the checkpoint is restored into (with the partition's clients:
`config.partition.num_clients` counts the target too, the state's clients do not), and
`params` are the algorithm's evaluated parameters (`eval_params`: the averaged iterate for AFL,
the global model otherwise): the model whose accuracy the run recorded at that round.

Only reads: a damaged checkpoint stays (the next resume deletes it); one whose state, history
or identity cannot be read is never restored, and when it is the best-validation round's the
error names that round (which='last' still restores the newest intact one).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import ml_collections
from absl import logging

from fedjax_pals import extensions
from fedjax_pals.algorithms import ServerState, init_server_state
from fedjax_pals.experiment.checkpoints import CheckpointError, Checkpointer, DamagedCheckpointError
from fedjax_pals.experiment.config import validate_config
from fedjax_pals.experiment.task import Task, build_task
from fedjax_pals.experiment.workdir import CHECKPOINT_DIR
from fedjax_pals.metrics import Scores, make_evaluator
from fedjax_pals.models import Model
from fedjax_pals.training import TrainingHistory

WHICH = ("best", "last")
# The sets `RestoredRun.evaluate` knows ("test": "target" under training's name for it).
SPLITS = ("target", "val", "test")


class RestoredRun(NamedTuple):
    """A run restored by `restore_run`.

    model: the `Model` (`model.apply(params, x)` gives logits); params: its evaluated
    parameters at `round`; config: the run's resolved config; history: the run's whole
    `TrainingHistory` (to its latest checkpoint); round: the round restored (the
    best-validation round for which="best", `history.rounds[history.best_val_index()]`);
    state: the full `ServerState` of that round; task: the rebuilt `Task` (data, partition,
    algorithm), e.g. to evaluate on its target sets (`evaluate`).
    """

    model: Model
    params: Any
    config: ml_collections.ConfigDict
    history: TrainingHistory
    round: int
    state: ServerState
    task: Task

    def evaluate(self, split: str = "target") -> Scores:
        """{"accuracy", "macro_f1", "loss"} of `params` on one of the run's target sets:
        accuracy and macro-F1 as fractions in [0, 1], as results.json records them (not the
        percentages of the screen and the tables); a `fedjax_pals.metrics.Scores`, a dict whose
        repr shows the percentages too: Scores(accuracy=0.969 (96.9%), ...).

        split: "target" (the target's test set: results.json's target_accuracy and
        target_macro_f1 at `round`; "test" is a synonym, training's name for it) or "val" (the
        target's validation set: val_accuracy, val_macro_f1). The evaluation is training's own
        (`fedjax_pals.metrics.make_evaluator` on the same examples, the same compiled program),
        so the numbers are those the run recorded at `round`: accuracy and macro-F1 come from
        the confusion counts, which agree exactly wherever the logits' argmax does. The loss
        (not in results.json; target/loss and val/loss in metrics.jsonl) is the mean
        cross-entropy.
        """
        if split not in SPLITS:
            raise ValueError(
                f"split must be one of {SPLITS} ('target' is the target's test set, 'val' its "
                f"validation set), got {split!r}."
            )
        dataset, partition = self.task.dataset, self.task.partition
        if split == "val":
            examples, indices = dataset.train, partition.target_val_indices
        else:
            examples, indices = dataset.test, partition.target_test_indices
        evaluate = make_evaluator(
            self.model.apply, examples.x[indices], examples.y[indices], self.model.num_classes
        )
        return evaluate(self.params)  # a Scores


def restore_run(
    workdir: str | os.PathLike, which: str = "best", *, data_dir: str | None = None
) -> RestoredRun:
    """The model of the run in `workdir` at its best-validation round or its last checkpoint.

    Args:
      workdir: a workdir of `train_and_evaluate` (finished or not; it is only read).
      which: "best": the round of the best validation accuracy (earliest on ties), the model
        the results report (`best_val_round`); "last": the latest checkpoint that can be read
        (a damaged newer one is named in a warning line).
      data_dir: where the data set is, when it has moved since the run (default: the
        config's `dataset.data_dir`).

    Raises:
      CheckpointError: no checkpoint in the workdir, none that can be read, or a best round
        whose checkpoint is damaged or was not kept (runs of fedjax_pals before it kept the
        best one).
      DatasetUnavailableError, TaskError: the data cannot be had to rebuild the task.
      ExtensionImportError: a user module the run recorded (`imports.json`: its method, data
        set, ...) cannot be imported.
    """
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}.")
    path = os.path.abspath(os.path.expanduser(os.fspath(workdir)))
    directory = os.path.join(path, CHECKPOINT_DIR)
    if not os.path.isdir(directory):
        raise CheckpointError(f"{path} holds no checkpoints ({directory} does not exist).")
    # The user's modules the run's config names (its method, data set, ...), if it recorded any.
    recorded = extensions.read_imports(os.path.join(path, extensions.RUN_IMPORTS_FILE))
    extensions.import_modules(recorded)
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        steps = checkpointer.steps()
        if not steps:
            raise CheckpointError(f"{path} holds no checkpoints ({directory} is empty).")
        damaged: dict[int, DamagedCheckpointError] = {}
        task = None
        for latest in reversed(steps):  # the newest checkpoint that can be read
            try:
                identity = checkpointer.read_identity(latest)
                if task is None:
                    config, task, template = _rebuild(identity, directory, latest, data_dir)
                state, history = checkpointer.restore(template, step=latest)
                break
            except DamagedCheckpointError as error:
                damaged[latest] = error
        else:
            raise CheckpointError(
                f"no checkpoint of the run in {path} can be read: every one in {directory} is "
                f"damaged (round {steps[-1]}: {damaged[steps[-1]].reason})."
            )
        if damaged:
            rounds = ", ".join(map(str, sorted(damaged)))
            logging.warning(
                "the checkpoint of round%s %s in %s cannot be read (%s); restoring from the "
                "intact checkpoint of round %d.",
                "s" if len(damaged) > 1 else "",
                rounds,
                directory,
                damaged[max(damaged)].reason,
                latest,
            )
        step = latest
        if which == "best":
            step = history.rounds[history.best_val_index()]
            if step not in checkpointer.steps():
                raise CheckpointError(
                    f"the best-validation round {step} of the run in {path} has no checkpoint "
                    f"(kept: {', '.join(map(str, checkpointer.steps()))}; a run of an older "
                    "fedjax_pals kept only the last 2, and a resumed run deletes a damaged "
                    "one); use which='last'."
                )
            if step != latest:
                try:
                    # Read whole, as the newest one: a checkpoint with any item damaged is
                    # damaged (a resumed run deletes it).
                    checkpointer.read_identity(step)
                    state, _ = checkpointer.restore(template, step=step)
                except DamagedCheckpointError as error:
                    raise CheckpointError(
                        f"the checkpoint of the best-validation round {step} in "
                        f"{directory}/{step} cannot be read ({error.reason}); which='last' "
                        f"restores the intact checkpoint of round {latest}."
                    ) from None
    finally:
        checkpointer.close()
    return RestoredRun(
        model=task.model,
        params=task.algorithm.eval_params(state),
        config=config,
        history=history,
        round=int(step),
        state=state,
        task=task,
    )


def _rebuild(
    identity: dict, directory: str, step: int, data_dir: str | None
) -> tuple[ml_collections.ConfigDict, Task, ServerState]:
    """(config, task, the state template) of the run whose checkpoint `step` has `identity`."""
    if not isinstance(identity.get("config"), dict):
        raise CheckpointError(
            f"the checkpoint in {directory}/{step} records no config: it was not written "
            "by train_and_evaluate (restore it with fjp.experiment.checkpoints.Checkpointer)."
        )
    config = ml_collections.ConfigDict(identity["config"])
    if data_dir is not None:
        config.dataset.data_dir = data_dir
    config = validate_config(config)
    task = build_task(config)
    params = task.model.init(jax.random.PRNGKey(0))
    return config, task, init_server_state(task.algorithm, params, task.partition.num_clients)
