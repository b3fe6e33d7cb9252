"""A run's working directory: what it holds, who may write it, and when it may be reused.

    <workdir>/
      .lock           an fcntl lock held while a run writes here (released when it ends or dies)
      .run-files      the record of what the run created here, each entry added before it is
                      created (see `Workdir.record`)
      checkpoints/    orbax checkpoints keyed by round, each with the config and its digest
      results.json    the results so far, rewritten at every evaluation
      metrics.jsonl, metrics.csv, hparams.json, events.out.tfevents.*   the metric writer's
                      files (TensorBoard's event files in the workdir: runs named by its path)
      curves.png      accuracy per round

A workdir belongs to one config (by `config_digest`): a launch with another config is refused,
naming the differing keys, unless `overwrite=True`, which deletes the run's files only after
the new config has been validated and its task built: the entries of `.run-files` and the
fixed names a new run writes over anyway (`RUN_FILES`), nothing else. A workdir without an
intact record (written before it existed, or damaged) keeps every event file and any
`tensorboard/` directory, as a user's own may be among them. The lock stops a second launch
on the same workdir at once, whatever its config.

Two exceptions, neither of which needs `overwrite`: a config that differs only by a larger
`training.rounds` extends the run (its checkpoints and results then record the new budget),
and a damaged latest checkpoint with an older intact one is deleted and the run resumes from
the older one (one warning line says so).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from absl import logging

from fedjax_pals import deprecation, extensions
from fedjax_pals.experiment.checkpoints import Checkpointer, identity_differences
from fedjax_pals.experiment import diskspace, locks
from fedjax_pals.experiment.config import ResolvedConfig, as_dict
# Defined in errors.py (locks raises WorkdirLockedError too); importable from here as before.
from fedjax_pals.experiment.errors import WorkdirError, WorkdirLockedError

LOCK_FILE = ".lock"
RECORD_FILE = ".run-files"
CHECKPOINT_DIR = "checkpoints"
RESULTS_FILE = "results.json"
CURVES_FILE = "curves.png"
CURVES_PDF = "curves.pdf"  # plots.py writes the same figure as a vector PDF beside the PNG
# What `train` writes itself (the metric writer records its own files as it creates them).
OWN_FILES = (CHECKPOINT_DIR, RESULTS_FILE, CURVES_FILE, CURVES_PDF)
# What `overwrite` deletes whether recorded or not (the record may predate the workdir): the
# paths a new run writes over, and checkpoint.msgpack (fedjax_pals <= 0.1's single-file
# checkpoint, which `check_reusable` refuses). Not event files nor `tensorboard/` (module doc).
RUN_FILES = (*OWN_FILES, "metrics.jsonl", "metrics.csv", "hparams.json", "checkpoint.msgpack")
# The record's first line; then one JSON string a line, each a name in the workdir.
RECORD_HEADER = "# fedjax_pals: what the run created in this workdir (--overwrite deletes these)"
OVERWRITE_REMEDY = "pass --overwrite (overwrite=True) to replace it, or choose another --workdir"


def _recordable(name: Any) -> bool:
    # One entry of the workdir itself: a record can never name a path outside it.
    return (
        isinstance(name, str)
        and name not in ("", ".", "..", LOCK_FILE, RECORD_FILE)
        and "/" not in name
        and os.sep not in name
        and "\0" not in name
    )


def read_record(path: str) -> list[str] | None:
    """The names in the record at `path`; None when there is none.

    Raises:
      ValueError: a damaged record (its reason): not a regular file, another first line, or a
        complete line that is not a JSON string naming an entry of the workdir. A torn last
        line (the run killed while recording) is no damage: its file was never created.
    """
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) or not os.path.isfile(path):
        raise ValueError("it is not a regular file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{type(error).__name__}: {error}") from None
    header, newline, body = text.partition("\n")
    if not newline and RECORD_HEADER.startswith(header):
        return []  # killed while starting the record, before any entry
    if header != RECORD_HEADER:
        raise ValueError("its first line is not the record's")
    names = []
    for line in body.split("\n")[:-1]:  # the last piece: "" or a torn line
        try:
            name = json.loads(line)
        except ValueError:
            name = None
        if not _recordable(name):
            raise ValueError(f"it holds the line {line[:80]!r}, not the name of a file")
        names.append(name)
    return names


def _ends_a_line(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"
    except OSError:  # absent, or empty (seeking before its start)
        return False


def _remove(path: str) -> None:
    # A symlink is removed, never followed: its target is not the run's.
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


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
      resolved: the run's `ResolvedConfig` (`resolve_config`): its config and digest.
      lock: take the workdir's lock (the main process does; the others only read).

    `Workdir(path, config, digest)` (a resolved ConfigDict and its `config_digest`), the form
    before 0.2.0, still works and warns; 0.3.0 will refuse it.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        resolved: ResolvedConfig | Any,
        digest: str | None = None,
        *,
        lock: bool = True,
    ):
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise WorkdirError(f"workdir must be a non-empty path, got {path!r}.")
        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        if isinstance(resolved, ResolvedConfig):
            if digest is not None:
                raise TypeError("Workdir(path, resolved): the digest is the ResolvedConfig's.")
            self.config, self.digest = resolved.plain, resolved.digest
            self.imports = resolved.imports
        else:
            if digest is None:
                raise TypeError(
                    "Workdir(path, resolved) takes a ResolvedConfig (fjp.experiment."
                    f"resolve_config), got {type(resolved).__name__}."
                )
            deprecation.warn(
                "Workdir(path, config, digest) is deprecated: pass the ResolvedConfig of "
                "fjp.experiment.resolve_config(config), which holds both.",
                refused_in="0.3.0",
            )
            self.config, self.digest, self.imports = as_dict(resolved), digest, None
        self._want_lock = lock
        self._lock_fd: int | None = None
        # `check_reusable`'s line about a damaged checkpoint it fell back from (None: none).
        self.fallback_note: str | None = None
        # The record's names as this process last read or wrote them (None: not read yet).
        self._recorded: set[str] | None = None

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
            what = f"the workdir {self.path}"
            self._lock_fd = locks.acquire(self.file(LOCK_FILE), what, holder_kind="run")
        return self

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

    # -- the record of what the run created ---------------------------------------------------

    def record_launch(self) -> None:
        """Records the files every launch of the run writes (`OWN_FILES`) and writes its
        imports.json where its config needs a user's modules (`restore_run` in another process
        imports them first); before any other file is created (see `record`)."""
        self.record(*OWN_FILES)
        if self.imports and self._lock_fd is not None:
            self.record(extensions.RUN_IMPORTS_FILE)
            write_json(self.file(extensions.RUN_IMPORTS_FILE), self.imports)

    def record(self, *names: str) -> None:
        """Adds `names` (entries of the workdir) to its record of what the run created, before
        the run creates them: a run killed in between has recorded a file it never made, which
        `clear` skips, never a file it made unrecorded. Only the lock holder (the main
        process) records; in the others this does nothing, as they create none of the run's
        files but orbax's shards inside checkpoints/. A damaged record is started afresh (its
        entries were not to be trusted anyway). The lines are appended and synced, no rename:
        a kill mid-line leaves a torn last line, which `read_record` ignores.
        """
        for name in names:
            if not _recordable(name):
                raise ValueError(f"a run records entries of its workdir by name, got {name!r}.")
        if self._lock_fd is None:
            return
        fresh = False
        if self._recorded is None:
            path = self.file(RECORD_FILE)
            try:
                self._recorded = set(read_record(path) or ())
            except ValueError:
                self._recorded = set()
                fresh = True
            else:
                # Absent, or ending in a torn line that an appended one would join.
                fresh = not _ends_a_line(path)
        new = [name for name in dict.fromkeys(names) if name not in self._recorded]
        if fresh:
            new = [*sorted(self._recorded), *new]
        elif not new:
            return
        lines = "".join(json.dumps(name) + "\n" for name in new)
        self._write_record(RECORD_HEADER + "\n" + lines if fresh else lines, fresh=fresh)
        self._recorded.update(new)

    def _write_record(self, text: str, *, fresh: bool) -> None:
        path = self.file(RECORD_FILE)
        data = text.encode("utf-8")
        with diskspace.writing(path, needed=len(data)):
            if fresh and os.path.islink(path):
                os.remove(path)  # replaced, never written through
            if os.path.isdir(path):
                raise WorkdirError(f"{path} is a directory, not a run's record; move it away.")
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(path, flags | (os.O_TRUNC if fresh else 0), 0o666)
            try:
                os.write(fd, data)
                os.fsync(fd)  # on disk before the file it names is created
            finally:
                os.close(fd)

    def _deletable(self) -> tuple[list[str], str | None]:
        """The run's files present now, and the reason the record is not used (None: it is
        intact, or there is none)."""
        problem = None
        try:
            recorded = read_record(self.file(RECORD_FILE)) or []
        except ValueError as error:
            recorded, problem = [], str(error)
        names = dict.fromkeys((*RUN_FILES, *recorded))
        return [name for name in names if os.path.lexists(self.file(name))], problem

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
        """Deletes the run's files (the record's entries and `RUN_FILES`) and nothing else;
        returns what it removed. A damaged record is not trusted: only `RUN_FILES` go, and
        one warning line says so. The record is then emptied (after the deletions: a run
        killed among them leaves a record naming files already gone, which is harmless)."""
        names, problem = self._deletable()
        if problem is not None:
            logging.warning(
                "overwrite: the record %s is damaged (%s), so only %s were deleted and every "
                "other file kept (event files included); delete the old ones yourself if need be",
                self.file(RECORD_FILE),
                problem,
                ", ".join(RUN_FILES),
            )
        for name in names:
            _remove(self.file(name))
        if self._lock_fd is not None:
            self._write_record(RECORD_HEADER + "\n", fresh=True)
            self._recorded = set()
        return names
