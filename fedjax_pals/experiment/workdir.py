"""A run's working directory: what it holds, who may write it, and when it may be reused.

    <workdir>/
      .lock           an fcntl lock held while a run writes here (released when it ends or dies)
      checkpoints/    orbax checkpoints keyed by round, each with the config and its digest
      results.json    the results so far, rewritten at every evaluation
      metrics.jsonl, metrics.csv, hparams.json, events.out.tfevents.*   the metric writer's
                      files (TensorBoard's event files in the workdir: runs named by its path)
      curves.png      accuracy per round

A workdir belongs to one config (by `config_digest`): a launch with another config is refused,
naming the differing keys, unless `overwrite=True`, which deletes the files above (and
nothing else) only after the new config has been validated and its task built. The lock stops
a second launch on the same workdir at once, whatever its config.

Two exceptions, neither of which needs `overwrite`: a config that differs only by a larger
`training.rounds` extends the run (its checkpoints and results then record the new budget),
and a damaged latest checkpoint with an older intact one is deleted and the run resumes from
the older one (one warning line says so).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from typing import Any

from fedjax_pals.experiment.checkpoints import Checkpointer, identity_differences
from fedjax_pals.experiment import diskspace
from fedjax_pals.experiment.config import as_dict
from fedjax_pals.experiment.errors import WorkdirError

LOCK_FILE = ".lock"
CHECKPOINT_DIR = "checkpoints"
RESULTS_FILE = "results.json"
# What a run writes into its workdir; `overwrite` removes exactly these.
RUN_FILES = (
    CHECKPOINT_DIR,
    RESULTS_FILE,
    "metrics.jsonl",
    "metrics.csv",
    "hparams.json",
    "tensorboard",  # the event files of fedjax_pals <= 0.1
    "curves.png",
    "checkpoint.msgpack",  # the single-file checkpoint of fedjax_pals <= 0.1
)
# ... and TensorBoard's event files, in the workdir itself.
RUN_FILE_PATTERNS = ("events.out.tfevents.*",)
OVERWRITE_REMEDY = "pass --overwrite (overwrite=True) to replace it, or choose another --workdir"


class WorkdirLockedError(WorkdirError):
    """Another launch is writing the workdir."""


def write_json(path: str, payload: Any) -> None:
    """Writes JSON atomically (temporary file, then rename): a reader never sees half a file.
    The file gets the mode of any file the process creates (0644 under umask 022), not
    mkstemp's 0600: results on a shared runs folder are readable by the group. A full disk
    raises `DiskFullError` naming `path` (and the old file is intact)."""
    text = json.dumps(payload, indent=2)
    directory = os.path.dirname(os.path.abspath(path))
    with diskspace.writing(path, needed=len(text.encode())):
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise


class Workdir:
    """The workdir of one run (see the module docstring).

    Args:
      path: the directory (created if missing).
      config: the run's resolved config; digest: its `config_digest`.
      lock: take the workdir's lock (the main process does; the others only read).
    """

    def __init__(self, path: str | os.PathLike, config: Any, digest: str, *, lock: bool = True):
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise WorkdirError(f"workdir must be a non-empty path, got {path!r}.")
        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        self.config = as_dict(config)
        self.digest = digest
        self._want_lock = lock
        self._lock_fd: int | None = None
        # `check_reusable`'s line about a damaged checkpoint it fell back from (None: none).
        self.fallback_note: str | None = None

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def identity(self) -> dict:
        return {"config_digest": self.digest, "config": self.config}

    # -- opening -----------------------------------------------------------------------------

    def open(self) -> "Workdir":
        """Creates the directory, checks that it can be written, and takes the lock."""
        try:
            os.makedirs(self.path, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=self.path)
            os.close(fd)
            os.remove(probe)
        except OSError as error:
            if diskspace.is_disk_full(error):
                raise diskspace.disk_full_error(self.file(".write-test")) from None
            raise WorkdirError(
                f"cannot write to the workdir {self.path} ({type(error).__name__}: "
                f"{error.strerror or error}); choose a writable --workdir."
            ) from None
        if self._want_lock:
            self._acquire_lock()
        return self

    def _acquire_lock(self) -> None:
        from fedjax_pals.experiment import locks  # locks imports this module

        what = f"the workdir {self.path}"
        self._lock_fd = locks.acquire(self.file(LOCK_FILE), what, holder_kind="run")

    def close(self) -> None:
        """Releases the lock (the lock file stays; a dead process's lock is released by the OS)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> "Workdir":
        return self.open()

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- what it holds -----------------------------------------------------------------------

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(
            self.file(CHECKPOINT_DIR),
            identity=self.identity,
            remedy=OVERWRITE_REMEDY,
            allow_extension=True,
        )

    def _pattern_files(self) -> list[str]:
        return sorted(
            os.path.basename(path)
            for pattern in RUN_FILE_PATTERNS
            for path in glob.glob(self.file(pattern))
        )

    def held_run_files(self) -> list[str]:
        held = [name for name in RUN_FILES if os.path.lexists(self.file(name))]
        return held + self._pattern_files()

    def check_reusable(self) -> int | None:
        """Checks that whatever run the workdir holds is this config's; returns the round of
        its latest checkpoint (None when there is none).

        Raises:
          WorkdirError: the workdir holds another config's checkpoint or results (naming the
            differing keys), an unreadable results.json, or an old-format checkpoint.
          CheckpointError: a checkpoint that cannot be read (its path and the remedy).
        """
        if os.path.lexists(self.file("checkpoint.msgpack")):
            raise WorkdirError(
                f"{self.path} holds a checkpoint of an older fedjax_pals "
                f"({self.file('checkpoint.msgpack')}), which this version cannot resume; "
                f"{OVERWRITE_REMEDY}."
            )
        checkpoints = self.file(CHECKPOINT_DIR)
        if os.path.lexists(checkpoints) and not os.path.isdir(checkpoints):
            raise WorkdirError(
                f"{checkpoints} is not a directory, so it holds no checkpoints of this library; "
                f"{OVERWRITE_REMEDY}."
            )
        checkpointer = self.checkpointer()
        try:
            # A damaged latest checkpoint with an older intact one: resume from that one.
            self.fallback_note = checkpointer.fall_back_to_intact()
            step = checkpointer.check_identity()
        finally:
            checkpointer.close()
        results = self.file(RESULTS_FILE)
        if os.path.exists(results):
            try:
                with open(results) as f:
                    saved = json.load(f)
                stored = {"config_digest": saved["config_digest"], "config": saved["config"]}
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise WorkdirError(
                    f"cannot read {results} ({type(error).__name__}: {error}); it is not the "
                    f"results file of a fedjax_pals run; {OVERWRITE_REMEDY}."
                ) from None
            differences = identity_differences(stored, self.identity, allow_extension=True)
            if differences:
                raise WorkdirError(
                    f"the workdir {self.path} holds the results of another config "
                    f"({results}); it differs in: {'; '.join(differences)}. "
                    f"{OVERWRITE_REMEDY[0].upper()}{OVERWRITE_REMEDY[1:]}."
                )
        return step

    def clear(self) -> list[str]:
        """Deletes the run files (`RUN_FILES`) and nothing else; returns what it removed."""
        removed = []
        for name in (*RUN_FILES, *self._pattern_files()):
            path = self.file(name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
            else:
                continue
            removed.append(name)
        return removed
