"""Checkpoints of a run: an orbax `CheckpointManager` keyed by round, with the run's identity.

Each checkpoint (`<directory>/<round>/`) is an orbax Composite of three items:

* `state`: the `ServerState` (as flax's state dict of numpy arrays);
* `history`: the `TrainingHistory` so far (JSON; floats round-trip exactly);
* `identity`: what the checkpoint belongs to (JSON): `train_and_evaluate` stores the resolved
  config and its digest (the run's one identity, `config_digest`); a library user of
  `run_training` names their own.

Kept: the latest `max_to_keep` checkpoints and the best-validation one (the round whose
validation accuracy is the highest so far, the earliest on ties: the round the results report),
by an orbax preservation policy over the `metrics` each save records (`val_accuracy`, `round`).

The identity travels with the state, so a checkpoint can never be resumed under another
run's label, whatever else the directory holds. Orbax writes a checkpoint into a temporary
directory and renames it when complete, so a run killed while saving leaves the previous
checkpoint intact. A checkpoint that cannot be read (truncated, emptied, written by something
else) raises `DamagedCheckpointError` naming its round, its path and the remedy, never a raw
orbax trace.

Damage is handled alike whichever round and item it hits. Before a run resumes,
`fall_back_to_intact` reads every kept checkpoint: a checkpoint whose `state`, `history` or
`identity` cannot be read is deleted (its rounds are trained again when it was the latest) and
the run resumes from the newest intact one; a damaged `metrics` item of an intact checkpoint
is rewritten from its `history` (the metrics are a copy of it), so the checkpoint, the
best-validation one included, is kept. Both are said in one warning line naming the rounds and
the directory. Only when no checkpoint is intact is the damage an error. A read-only
`Checkpointer` (`restore_run`) never reads the metrics, so damaged ones cannot stop it.
"""

from __future__ import annotations

import json
import logging as _py_logging
import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pals.experiment.config import config_differences, mapping_differences
from fedjax_pals.training import TrainingHistory

ITEMS = ("state", "history", "identity")
# Orbax's item of the per-checkpoint metrics (a JSON file of the same name inside it).
METRICS = "metrics"
# What the messages tell the user to do; "{directory}" is the checkpoint directory.
DEFAULT_REMEDY = "delete {directory}, or use another checkpoint location"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or one that belongs to another run."""


class CheckpointMismatchError(CheckpointError):
    """A readable checkpoint of another run (another identity)."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint that cannot be read: `step` is its round, `reason` the error, in short."""

    def __init__(self, message: str, step: int, reason: str):
        super().__init__(message)
        self.step = step
        self.reason = reason


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 160:
        first = first[:157] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def identity_differences(
    stored: Mapping, current: Mapping, *, allow_extension: bool = False
) -> list[str]:
    """The keys on which two identities differ, as "key: stored -> current" lines.

    Identities with a `config_digest` are compared by digest, and their differences named
    from their `config`s (identity keys only: `engine` and `dataset.data_dir` do not count).
    With `allow_extension`, a larger `training.rounds` alone is no difference: the run is
    extended (see `budget_extension`).
    """
    if "config_digest" in stored or "config_digest" in current:
        if stored.get("config_digest") == current.get("config_digest"):
            return []
        try:
            lines = config_differences(stored.get("config") or {}, current.get("config") or {})
        except Exception:  # a foreign "config": name the digests only
            lines = []
        if allow_extension and lines:
            lines = budget_extension(stored.get("config") or {}, lines)
            if not lines:
                return []
        return lines or [
            f"config_digest: {stored.get('config_digest')!r} -> {current.get('config_digest')!r}"
        ]
    return mapping_differences(dict(stored), dict(current))


def budget_extension(stored_config: Mapping, lines: list[str]) -> list[str]:
    """`lines` (config differences) with a raised round budget accepted as an extension.

    A run may be trained further when all that differs is a larger `training.rounds`: no
    schedule depends on the budget (the client sample, the data order and the weights are
    functions of the seed and the round alone), so its first rounds are those of the longer
    run. Not under `algorithm.lam_schedule='hypergradient'`, whose state records lambda in
    arrays as long as the budget: that difference stays, with the reason.
    """
    if len(lines) != 1 or not lines[0].startswith("training.rounds: "):
        return lines
    old, _, new = lines[0][len("training.rounds: ") :].partition(" -> ")
    try:
        old_rounds, new_rounds = int(old), int(new)
    except ValueError:
        return lines
    if new_rounds < old_rounds:
        return lines
    if (stored_config.get("algorithm") or {}).get("lam_schedule") == "hypergradient":
        return [
            f"{lines[0]} (a run under algorithm.lam_schedule='hypergradient' cannot be "
            "extended: its state records lambda in arrays as long as the round budget)"
        ]
    return []


def _metrics(step: int, history: Mapping) -> dict | None:
    """The metrics `save` records with checkpoint `step` (None: none, without validation)."""
    val = history.get("val_accuracy") or []
    return {"val_accuracy": float(val[-1]), "round": int(step)} if val else None


def _best_key(metrics: Mapping) -> tuple:
    """How orbax ranks checkpoints for the best one: validation accuracy, then the earlier round
    (orbax keeps the last of its ascending sort, so ties go to the earliest round)."""
    return (float(metrics["val_accuracy"]), -int(metrics["round"]))


def _not_orbax_chatter(record: _py_logging.LogRecord) -> bool:
    """Drops orbax's chatter (a line per file it writes, warnings about the files of a damaged
    checkpoint, which `Checkpointer` reports itself) from absl's log; orbax's errors pass."""
    return record.levelno >= _py_logging.ERROR or "orbax" not in record.pathname


def _silence_closed_loop_noise() -> None:
    """After a failed read, orbax's async I/O may still call into its closed event loop, and
    Python prints that RuntimeError as an "Exception ignored" traceback: our CheckpointError
    has already said what is wrong, so that one message is dropped."""
    previous = sys.unraisablehook
    if getattr(previous, "_fedjax_pals", False):
        return

    def hook(unraisable):
        error = unraisable.exc_value
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        previous(unraisable)

    hook._fedjax_pals = True
    sys.unraisablehook = hook


class Checkpointer:
    """The orbax checkpointer of `run_training`: `save(state, history)`, `restore(template)`.

    Args:
      directory: the checkpoint directory (created on the first save); one subdirectory per
        saved round.
      identity: a JSON-able mapping saved with every checkpoint; `restore` raises
        `CheckpointMismatchError` (naming the differing keys) when the stored one differs.
        None: no check.
      max_to_keep: how many of the latest checkpoints are kept (the best-validation one is
        kept as well).
      remedy: what the error messages tell the user to do about a bad checkpoint.
      read_only: only read (no directory is created, nothing is cleaned up or saved): for
        reading the checkpoints of a run that may still be training.
      allow_extension: accept the checkpoints of the same config with a smaller
        `training.rounds` (the run is extended; see `budget_extension`).

    Every process calls `save`/`restore` (orbax writes from the primary process only).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        identity: Mapping[str, Any] | None = None,
        max_to_keep: int = 2,
        remedy: str = DEFAULT_REMEDY,
        read_only: bool = False,
        allow_extension: bool = False,
    ):
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise TypeError(f"directory must be a non-empty path, got {directory!r}.")
        if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"max_to_keep must be an integer >= 1, got {max_to_keep!r}.")
        self.directory = os.path.abspath(os.path.expanduser(os.fspath(directory)))
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise CheckpointError(
                f"{self.directory} is a file, not a checkpoint directory (an old single-file "
                f"checkpoint?). To start afresh: {remedy.format(directory=self.directory)}."
            )
        self.identity = None if identity is None else json.loads(json.dumps(dict(identity)))
        self.max_to_keep = max_to_keep
        self.read_only = bool(read_only)
        self.allow_extension = bool(allow_extension)
        self.remedy = remedy.format(directory=self.directory)
        self._manager = None

    def __repr__(self) -> str:
        return f"Checkpointer({self.directory!r})"

    # -- orbax -------------------------------------------------------------------------------

    def _ocp(self):
        import orbax.checkpoint as ocp  # deferred: ~1 s to import

        logger = _py_logging.getLogger("absl")
        if _not_orbax_chatter not in logger.filters:
            logger.addFilter(_not_orbax_chatter)
        return ocp

    def _mgr(self):
        if self._manager is None:
            ocp = self._ocp()
            policies = ocp.checkpoint_managers
            options = ocp.CheckpointManagerOptions(
                # The latest max_to_keep, and the best by validation accuracy (earliest on ties,
                # as `TrainingHistory.best_val_index`): the reported model of a long run stays.
                preservation_policy=policies.AnyPreservationPolicy(
                    [
                        policies.LatestN(n=self.max_to_keep),
                        policies.BestN(
                            get_metric_fn=_best_key, n=1, keep_checkpoints_without_metrics=False
                        ),
                    ]
                ),
                best_fn=_best_key,  # orbax writes the metrics only when it has a best_fn
                best_mode="max",
                create=False,
                read_only=self.read_only,
                # A reader never deletes, so it needs no metrics: damaged ones cannot stop it.
                lightweight_initialize=self.read_only,
                # Synchronous saves: when save() returns the checkpoint is on disk.
                enable_async_checkpointing=False,
                # Leftovers of a save killed half-way are removed, never read.
                cleanup_tmp_directories=not self.read_only,
            )
            if not self.read_only:
                os.makedirs(self.directory, exist_ok=True)
                # Leftovers of a save killed half-way (a cancelled Slurm shard), removed here,
                # at once: orbax's own clean-up deletes them in a thread, and a second deleter
                # of the same tree (its save path) failed the resumed run with
                # FileNotFoundError from rmtree.
                for name in os.listdir(self.directory):
                    if ".orbax-checkpoint-tmp" in name:
                        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
            try:
                self._manager = ocp.CheckpointManager(
                    self.directory, options=options, item_names=ITEMS
                )
            except Exception as error:
                raise CheckpointError(
                    f"cannot open the checkpoint directory {self.directory} ({_short(error)}). "
                    f"To start afresh: {self.remedy}."
                ) from None
        return self._manager

    def _step_path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _unreadable(self, step: int, error: BaseException) -> DamagedCheckpointError:
        _silence_closed_loop_noise()
        return DamagedCheckpointError(
            f"cannot read the checkpoint of round {step} in {self._step_path(step)}: it is "
            f"truncated, empty or not a fedjax_pals checkpoint ({_short(error)}). To start "
            f"afresh: {self.remedy}.",
            step,
            _short(error),
        )

    def _read(self, step: int, **items) -> dict:
        """{name: item} of checkpoint `step` (items: orbax restore args by name); raises
        CheckpointError for one that cannot be read."""
        try:
            restored = self._mgr().restore(step, args=self._ocp().args.Composite(**items))
            return {name: restored[name] for name in items}
        except Exception as error:
            raise self._unreadable(step, error) from None

    # -- queries -----------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """The saved rounds, oldest first (none when the directory does not exist)."""
        if not os.path.isdir(self.directory):
            return []
        try:
            return sorted(int(s) for s in self._mgr().all_steps())
        except CheckpointError:
            raise
        except Exception as error:
            raise CheckpointError(
                f"cannot list the checkpoints in {self.directory} ({_short(error)}). To start "
                f"afresh: {self.remedy}."
            ) from None

    def latest_round(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def read_identity(self, step: int | None = None) -> dict | None:
        """The identity stored with checkpoint `step` (default: the latest); None if none."""
        step = self.latest_round() if step is None else step
        if step is None:
            return None
        identity = self._read(step, identity=self._ocp().args.JsonRestore())["identity"]
        if not isinstance(identity, dict):
            raise self._unreadable(step, TypeError(f"identity is {type(identity).__name__}"))
        return identity

    def check_identity(self) -> int | None:
        """Raises `CheckpointMismatchError` if the latest checkpoint belongs to another run;
        returns its round (None when there is none)."""
        step = self.latest_round()
        if step is None or self.identity is None:
            return step
        self._check_stored(step, self.read_identity(step))
        return step

    def _check_stored(self, step: int, stored: Mapping) -> None:
        """Raises `CheckpointMismatchError` if `stored`, checkpoint `step`'s, is another run's."""
        differences = identity_differences(
            stored, self.identity, allow_extension=self.allow_extension
        )
        if differences:
            raise CheckpointMismatchError(
                f"the checkpoint in {self._step_path(step)} belongs to another run; it differs "
                f"in: {'; '.join(differences)}. To start afresh: {self.remedy}."
            )

    def _inspect(self, step: int) -> tuple[DamagedCheckpointError | None, dict]:
        """(the damage of checkpoint `step` or None, its history and identity when intact)."""
        args = self._ocp().args
        try:
            restored = self._read(
                step,
                state=args.StandardRestore(),
                history=args.JsonRestore(),
                identity=args.JsonRestore(),
            )
            if not isinstance(restored["identity"], dict):
                raise TypeError(f"identity is {type(restored['identity']).__name__}")
            TrainingHistory(**restored["history"])  # what `restore` will make of it
        except DamagedCheckpointError as error:
            return error, {}
        except Exception as error:
            return self._unreadable(step, error), {}
        return None, restored

    def _stored_metrics(self, step: int) -> Any:
        """The metrics item of checkpoint `step` as stored (None when absent), or the error
        reading it (orbax raises it while opening the directory, before any fallback)."""
        path = os.path.join(self._step_path(step), METRICS, METRICS)
        if not os.path.lexists(os.path.dirname(path)):
            return None
        try:
            with open(path) as f:
                return json.load(f)
        except Exception as error:
            return error

    def _rewrite_metrics(self, step: int, metrics: dict | None) -> None:
        item = os.path.join(self._step_path(step), METRICS)
        if metrics is None:
            shutil.rmtree(item, ignore_errors=True)
            return
        os.makedirs(item, exist_ok=True)
        path = os.path.join(item, METRICS)
        with open(path + ".tmp", "w") as f:  # then renamed: a reader never sees half a file
            json.dump(metrics, f)
        os.replace(path + ".tmp", path)

    def fall_back_to_intact(self) -> str | None:
        """Makes the checkpoint directory resumable whatever item of whichever round is damaged
        (module docstring); returns one line saying what it did (None when all is intact).

        Nothing is changed when the newest intact checkpoint belongs to another run
        (`CheckpointMismatchError`); when none is intact, the latest one's damage is raised.
        Every process calls it; the primary one writes.
        """
        reader = Checkpointer(self.directory, read_only=True, remedy=self.remedy)
        try:
            steps = reader.steps()
            inspected = {step: reader._inspect(step) for step in steps}
            metrics = {step: reader._stored_metrics(step) for step in steps}
        finally:
            reader.close()
        if not steps:
            return None
        damaged = [step for step in steps if inspected[step][0] is not None]
        intact = [step for step in steps if inspected[step][0] is None]
        if not intact:
            raise inspected[steps[-1]][0]
        newest = intact[-1]
        if self.identity is not None:
            self._check_stored(newest, inspected[newest][1]["identity"])
        stale = {
            step: expected
            for step in intact
            if metrics[step] != (expected := _metrics(step, inspected[step][1]["history"]))
        }
        if (damaged or stale) and jax.process_index() == 0:
            for step in damaged:
                shutil.rmtree(self._step_path(step))
            for step, expected in stale.items():
                self._rewrite_metrics(step, expected)
        if jax.process_count() > 1:  # the others read only once the primary has written
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("fedjax_pals.checkpoints.fall_back_to_intact")
        self.close()  # the next reader lists the steps afresh
        notes = []
        if damaged:
            notes.append(
                f"the checkpoint{_rounds(damaged)} in {self.directory} could not be read and "
                f"{'was' if len(damaged) == 1 else 'were'} deleted; resuming from the intact "
                f"checkpoint of round {newest}"
            )
        if stale:
            notes.append(
                f"the best-validation metrics of the checkpoint{_rounds(list(stale))} in "
                f"{self.directory} were missing or damaged and were rewritten from "
                f"{'its' if len(stale) == 1 else 'their'} history"
            )
        return "; ".join(notes) + "." if notes else None

    # -- the Checkpointer protocol -----------------------------------------------------------

    def save(self, state: Any, history: Any) -> None:
        """Saves `state` and `history` as the checkpoint of round `state.round`."""
        ocp = self._ocp()
        step = int(state.round)
        state_dict = _without_empty_opt_state(
            flax.serialization.to_state_dict(jax.device_get(state))
        )
        history_dict = history.to_dict() if hasattr(history, "to_dict") else dict(history)
        manager = self._mgr()
        if step in manager.all_steps():
            return  # a round is saved once; the same run computes the same state
        if self.read_only:
            raise CheckpointError(f"{self!r} is read-only: it cannot save.")
        manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state_dict),
                history=ocp.args.JsonSave(history_dict),
                identity=ocp.args.JsonSave(self.identity or {}),
            ),
            metrics=_metrics(step, history_dict),
        )
        manager.wait_until_finished()

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, Any] | None:
        """The latest checkpoint (or that of round `step`) as (state, TrainingHistory), shaped
        like `template`; None if there is none. Raises `CheckpointMismatchError` for another
        run's checkpoint and `CheckpointError` for an unreadable one, or a `step` not kept."""
        latest = self.check_identity()
        if latest is None:
            return None
        if step is None:
            step = latest
        elif step not in self.steps():
            raise CheckpointError(
                f"there is no checkpoint of round {step} in {self.directory} (kept: "
                f"{', '.join(map(str, self.steps()))})."
            )
        args = self._ocp().args
        full_template_dict = flax.serialization.to_state_dict(jax.device_get(template))
        template_dict = _without_empty_opt_state(full_template_dict)
        restored = self._read(
            step, state=args.StandardRestore(template_dict), history=args.JsonRestore()
        )
        try:
            state = flax.serialization.from_state_dict(
                template, {**full_template_dict, **restored["state"]}
            )
            history = TrainingHistory(**restored["history"])
        except Exception as error:
            raise self._unreadable(step, error) from None
        template_leaves, treedef = jax.tree_util.tree_flatten(template)
        leaves = jax.tree_util.tree_leaves(state)
        if len(leaves) != len(template_leaves) or any(
            np.shape(a) != np.shape(b) for a, b in zip(leaves, template_leaves)
        ):
            raise CheckpointMismatchError(
                f"the checkpoint in {self._step_path(step)} holds a state of other shapes than "
                f"this run's model and algorithm. To start afresh: {self.remedy}."
            )
        # Back to device arrays of the template's dtypes: the resumed rounds then compute
        # exactly what the uninterrupted run computed.
        leaves = [
            jnp.asarray(a, dtype=jnp.asarray(b).dtype) for a, b in zip(leaves, template_leaves)
        ]
        return jax.tree_util.tree_unflatten(treedef, leaves), history

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None


def _rounds(steps: list[int]) -> str:
    """" of round 3" or "s of rounds 3, 5": the rounds a message names after "checkpoint"."""
    plural = "s" if len(steps) > 1 else ""
    return f"{plural} of round{plural} {', '.join(map(str, sorted(steps)))}"


def _without_empty_opt_state(state_dict: Any) -> Any:
    """The state dict without an empty `server_opt_state` (no server optimiser): checkpoints
    of such runs keep the layout they had before ServerState gained the field, so the ones
    written before it still restore, and the field comes back from the template."""
    if isinstance(state_dict, Mapping) and state_dict.get("server_opt_state", None) == {}:
        return {k: v for k, v in state_dict.items() if k != "server_opt_state"}
    return state_dict
