"""Image classification data sets as host-side numpy arrays.

The FedPALS experiments (Listo Zec et al., Sec. 5 and App. B.4) build label
shift tasks from Fashion-MNIST and CIFAR-10. This module only loads the raw
splits; `fedjax_pals.data.partitions` turns them into clients and a target.

Inputs are held in their stored dtype (uint8 pixels, int32 tokens; other features float32) and
labels as int32. A data set whose inputs are quantised says how the model sees them
(`InputScaling`): Fashion-MNIST's uint8 pixels become ``pixel / 127.5 - 1`` (in [-1, 1], the
scaling of the reference implementation) inside the jitted step, per batch, so the host holds a
quarter of the float32 bytes.

Offline behaviour is a design requirement: these machines have no route to the dataset hosts,
and ``tfds.load`` with downloading enabled retries for minutes before failing. The loaders
therefore never ask TFDS to download: they look for files on disk themselves and call
``tfds.data_source(..., download=False)`` only when a prepared copy of the data set is present.
When no source has the data, `DatasetUnavailableError` is raised at once with every way of
getting it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fedjax_pals import _validation, extensions
from fedjax_pals import hyperparameters as declared
from fedjax_pals._host import aligned_empty

DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_SPLITS = ("train", "test")

# (split, kind) -> file name stem of the official Fashion-MNIST idx files.
_FMNIST_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}
# idx magic numbers: two zero bytes, type code 0x08 (unsigned byte), ndim.
_IDX_MAGIC = {"images": 0x00000803, "labels": 0x00000801}

_TFDS_HINT = (
    "prepare it with TensorFlow Datasets (needs TensorFlow) into DATA_DIR, e.g. "
    "`tfds.builder('{name}', data_dir=DATA_DIR).download_and_prepare("
    "file_format='array_record')` on a machine with internet, then pass "
    "--data_dir DATA_DIR (data_dir=DATA_DIR), or set TFDS_DATA_DIR"
)


class DatasetUnavailableError(RuntimeError):
    """No local source holds the requested data set (nothing is downloaded)."""


# The input dtypes a split holds as they are; any other is converted (`stored_input_dtype`).
STORED_INPUT_DTYPES = (np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.float32))


def stored_input_dtype(dtype: Any) -> np.dtype:
    """The dtype a split stores inputs of `dtype` in: uint8 (pixels), int32 (tokens) and
    float32 as they are; bool as uint8, other integers as int32, other floats as float32."""
    dtype = np.dtype(dtype)
    if dtype in STORED_INPUT_DTYPES:
        return dtype
    if dtype == np.bool_:
        return np.dtype(np.uint8)
    if np.issubdtype(dtype, np.integer):
        return np.dtype(np.int32)
    if np.issubdtype(dtype, np.floating):
        return np.dtype(np.float32)
    raise ValueError(f"inputs must be numbers (integers, floats, bools), got dtype {dtype}")


@dataclasses.dataclass(frozen=True, eq=False)
class LabeledSplit:
    """One split of a data set: inputs ``x`` (N, ...) and labels ``y`` (N,).

    ``x`` is held in its stored dtype (uint8, int32, float32: `STORED_INPUT_DTYPES`; other
    integers as int32, other floats as float32) and ``y`` as int32 (converted on construction
    if needed); both arrays are made read-only because partitions index into them and silent
    in-place edits would corrupt every client at once.
    """

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        x = np.asarray(self.x)
        y = np.asarray(self.y)
        if x.ndim < 1:
            raise ValueError(f"x must have a leading example axis, got shape {x.shape}")
        if y.ndim != 1:
            raise ValueError(f"y must be 1-D (N,), got shape {y.shape}")
        if x.shape[0] != y.shape[0]:
            raise ValueError(
                f"x and y disagree on the number of examples: x has {x.shape[0]}, "
                f"y has {y.shape[0]}"
            )
        if y.size and not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"y must hold integer class labels, got dtype {y.dtype}")
        stored = stored_input_dtype(x.dtype)
        if stored == np.int32 and x.dtype != stored and x.size and (
            x.min() < np.iinfo(np.int32).min or x.max() > np.iinfo(np.int32).max
        ):
            raise ValueError(f"integer inputs must fit int32, got range [{x.min()}, {x.max()}]")
        for name, array in (("x", np.asarray(x, stored)), ("y", np.asarray(y, np.int32))):
            if array is getattr(self, name):  # do not freeze an array the caller still owns
                array = array.view()
            array.flags.writeable = False
            object.__setattr__(self, name, array)

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclasses.dataclass(frozen=True)
class InputScaling:
    """How a model sees quantised inputs: ``x / divide_by + offset`` in float32, computed
    inside the jitted step per batch (so the host keeps the stored uint8). Fashion-MNIST's:
    ``InputScaling(127.5, -1.0)``, pixels in [-1, 1]; LEAF's FEMNIST floats k/255 stored as
    k: ``InputScaling(255.0, 0.0)``, the values of the file."""

    divide_by: float
    offset: float = 0.0

    def __post_init__(self) -> None:
        for key in ("divide_by", "offset"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or (
                not np.isfinite(value)
            ):
                raise ValueError(f"InputScaling.{key} must be a finite number, got {value!r}")
            object.__setattr__(self, key, float(value))
        if self.divide_by == 0:
            raise ValueError("InputScaling.divide_by must not be 0")

    def table(self) -> np.ndarray:
        """The 256 float32 values of the uint8 inputs, as NumPy computes them (division, then
        the offset, in float32)."""
        return np.arange(256, dtype=np.float32) / np.float32(self.divide_by) + np.float32(
            self.offset)

    def __call__(self, x):
        """The model's inputs of stored inputs `x` (NumPy or JAX; float32). uint8 inputs are
        looked up in `table`: XLA rewrites a division by a constant as a multiplication by
        its reciprocal, 1 ulp off for 80 % of the pixels, and a run must not depend on where
        its pixels were scaled."""
        if str(x.dtype) == "uint8":
            table = self.table()
            return table[x] if isinstance(x, np.ndarray) else _device_lookup(table, x)
        return x.astype("float32") / np.float32(self.divide_by) + np.float32(self.offset)


def _device_lookup(table: np.ndarray, x):
    import jax.numpy as jnp  # deferred: the data layer loads without JAX

    return jnp.asarray(table)[x.astype("int32")]


# The scaling of uint8 pixels (the reference implementation's): pixel / 127.5 - 1, in [-1, 1].
PIXELS_TO_UNIT_RANGE = InputScaling(127.5, -1.0)


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A named classification data set with train and test splits.

    client_ids: None, or the client id (0, ..., G-1: its writer, speaker, camera trap) of each
    training example, the clients of the partition scheme "natural" (`natural_partition`);
    client_names: None, or the format's name of each id (id g is client_names[g]);
    test_client_ids: None, or the client id of each test example (a format with a per-client
    test split: LEAF, TFF; a client may have none), so that a target client is tested on its
    own examples. input_scaling: None (inputs go to the model as they are stored, float32 or
    int32 tokens), or how the model sees quantised inputs (`InputScaling`).
    coarse_labels: None, or the (K,) coarse class of each class (CIFAR-100's 20 super-classes:
    TFF's "pachinko" partition)."""

    name: str
    train: LabeledSplit
    test: LabeledSplit
    num_classes: int
    source: str  # where the data came from, for logs and result files
    client_ids: np.ndarray | None = None
    client_names: tuple[str, ...] | None = None
    test_client_ids: np.ndarray | None = None
    input_scaling: InputScaling | None = None
    coarse_labels: np.ndarray | None = None

    def __post_init__(self) -> None:
        for key, split in (("client_ids", self.train), ("test_client_ids", self.test)):
            if getattr(self, key) is not None:
                ids = np.array(getattr(self, key))  # a private copy, then frozen
                if ids.shape != (len(split),) or (
                    ids.size and not np.issubdtype(ids.dtype, np.integer)
                ):
                    raise ValueError(f"{key} must be {len(split)} integers, got {ids!r}")
                ids = ids.astype(np.int64)
                ids.flags.writeable = False
                object.__setattr__(self, key, ids)
        if self.test_client_ids is not None and self.client_ids is None:
            raise ValueError("test_client_ids needs client_ids (the training examples' clients)")
        if self.client_names is not None:
            names = tuple(self.client_names)
            num_ids = 0 if self.client_ids is None or not self.client_ids.size else int(
                self.client_ids.max()) + 1
            if len(names) != num_ids or len(set(names)) != len(names) or not all(
                isinstance(n, str) for n in names
            ):
                raise ValueError(
                    f"client_names must be {num_ids} distinct strings, one per client id"
                )
            object.__setattr__(self, "client_names", names)
        if self.test_client_ids is not None and self.test_client_ids.size and (
            self.test_client_ids.min() < 0
            or self.client_ids.size == 0
            or self.test_client_ids.max() > self.client_ids.max()
        ):
            raise ValueError("test_client_ids must be ids of clients with training examples")
        if self.input_scaling is not None and not isinstance(self.input_scaling, InputScaling):
            raise ValueError(f"input_scaling must be an InputScaling, got {self.input_scaling!r}")
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        if self.coarse_labels is not None:
            coarse = np.array(self.coarse_labels)
            if coarse.shape != (self.num_classes,) or not np.issubdtype(coarse.dtype, np.integer) \
                    or coarse.min() < 0:
                raise ValueError(
                    f"coarse_labels must be {self.num_classes} non-negative integers (each "
                    f"class's coarse class), got {coarse!r}"
                )
            coarse = coarse.astype(np.int64)
            coarse.flags.writeable = False
            object.__setattr__(self, "coarse_labels", coarse)
        for split_name, split in (("train", self.train), ("test", self.test)):
            if len(split) and (split.y.min() < 0 or split.y.max() >= self.num_classes):
                raise ValueError(
                    f"{self.name} {split_name} labels must lie in [0, {self.num_classes}), "
                    f"got range [{split.y.min()}, {split.y.max()}]"
                )
        if self.train.x.shape[1:] != self.test.x.shape[1:]:
            raise ValueError(
                f"train and test inputs differ in shape: {self.train.x.shape[1:]} vs "
                f"{self.test.x.shape[1:]}"
            )
        if self.train.x.dtype != self.test.x.dtype and len(self.test):
            raise ValueError(
                f"train and test inputs differ in dtype: {self.train.x.dtype} vs "
                f"{self.test.x.dtype}"
            )

    @property
    def num_client_ids(self) -> int:
        """G, the number of client ids (0 without client ids)."""
        ids = self.client_ids
        return 0 if ids is None or not ids.size else int(ids.max()) + 1

    def model_inputs(self, x: np.ndarray) -> np.ndarray:
        """What the model sees of stored inputs `x` (`input_scaling` applied, float32)."""
        return x if self.input_scaling is None else self.input_scaling(np.asarray(x))


def _aligned_uint8_images(images: np.ndarray) -> np.ndarray:
    """uint8 pixels in a 64-byte aligned copy, so that placing them on a CPU device aliases
    them instead of copying them (`fjp.engine.device_data`): the data set is then held once
    per process, as uint8 (the model sees ``pixel / 127.5 - 1``, `PIXELS_TO_UNIT_RANGE`)."""
    x = aligned_empty(images.shape, np.uint8)
    np.copyto(x, images, casting="unsafe")
    return x


# ---- Fashion-MNIST from idx files ----------------------------------------


def _read_maybe_gzip(path: pathlib.Path) -> bytes:
    raw = path.read_bytes()
    if path.suffix != ".gz":
        return raw
    try:
        # One-shot zlib is ~2x faster than streaming through gzip.open.
        return zlib.decompress(raw, 16 + zlib.MAX_WBITS)
    except zlib.error as e:
        raise ValueError(f"{path} is not a valid gzip file (corrupt or truncated): {e}") from e


def _parse_idx(data: bytes, kind: str, path: pathlib.Path) -> np.ndarray:
    """Parses an idx1/idx3 unsigned-byte file (LeCun's MNIST format)."""
    if len(data) < 8:
        raise ValueError(f"{path} is too short ({len(data)} bytes) to be an idx file")
    magic = int.from_bytes(data[:4], "big")
    if magic != _IDX_MAGIC[kind]:
        raise ValueError(
            f"{path} has idx magic number {magic:#010x}, expected {_IDX_MAGIC[kind]:#010x} "
            f"for {kind}; the file is corrupt or not a Fashion-MNIST {kind} file"
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path} is truncated inside its header")
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(data) != expected:
        raise ValueError(
            f"{path} holds {len(data)} bytes but its header {dims} implies {expected}; "
            "the file is truncated or corrupt"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _idx_file(directory: pathlib.Path, stem: str) -> pathlib.Path | None:
    """The idx file ``stem`` in ``directory``, plain or .gz; None if neither is there."""
    return next((c for c in (directory / stem, directory / f"{stem}.gz") if c.is_file()), None)


def _find_idx_files(directory: pathlib.Path) -> dict[tuple[str, str], pathlib.Path] | None:
    """Returns the four idx files in ``directory`` (plain or .gz), or None if any is missing."""
    found = {key: _idx_file(directory, stem) for key, stem in _FMNIST_FILES.items()}
    return None if None in found.values() else found


def _missing_idx_files(directory: pathlib.Path) -> list[str]:
    """The official idx file names (plain or .gz) that ``directory`` lacks."""
    return [f"{stem}[.gz]" for stem in _FMNIST_FILES.values() if not _idx_file(directory, stem)]


def _explicit_data_dir(data_dir: str | os.PathLike, dataset: str) -> pathlib.Path:
    """An explicit ``data_dir``, which must be an existing directory."""
    path = pathlib.Path(data_dir).expanduser().absolute()
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise DatasetUnavailableError(
            f"data_dir={path} {what}: give the directory that holds {dataset}, or "
            "data_dir=None to search the default places (nothing is downloaded)."
        )
    return path


def _idx_dataset(directory: pathlib.Path) -> Dataset | None:
    """Fashion-MNIST from the idx files in ``directory``; None if any of them is missing."""
    files = _find_idx_files(directory)
    if files is None:
        return None
    splits = {}
    for split in _SPLITS:
        images_path, labels_path = files[(split, "images")], files[(split, "labels")]
        images = _parse_idx(_read_maybe_gzip(images_path), "images", images_path)
        labels = _parse_idx(_read_maybe_gzip(labels_path), "labels", labels_path)
        if images.shape[1:] != (28, 28):
            raise ValueError(f"{images_path}: expected 28x28 images, got {images.shape[1:]}")
        if images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"{images_path} has {images.shape[0]} images but {labels_path} has "
                f"{labels.shape[0]} labels"
            )
        if labels.size and labels.max() >= 10:
            raise ValueError(f"{labels_path} holds label {labels.max()}; Fashion-MNIST has 10")
        splits[split] = LabeledSplit(
            x=_aligned_uint8_images(images[..., None]), y=labels.astype(np.int32)
        )
    return _dataset("fashion_mnist", splits, f"idx files in {directory}")


# ---- TFDS (prepared data only) -------------------------------------------


def _tfds_data_dir() -> pathlib.Path:
    """The directory TFDS reads by default: $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
    return pathlib.Path(os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")).expanduser()


def _tfds_prepared(tfds_dir: pathlib.Path, name: str) -> bool:
    """True if ``tfds_dir/name/[config/]version/dataset_info.json`` exists.

    Checked before touching TFDS at all so that a missing data set costs a couple of ``stat``
    calls instead of any builder logic that might reach for the network.
    """
    root = tfds_dir / name
    if not root.is_dir():
        return False
    return any(root.glob("*/dataset_info.json")) or any(root.glob("*/*/dataset_info.json"))


def _read_tfds_source(source: Sequence[dict], name: str) -> LabeledSplit:
    """Reads every record of a TFDS random-access data source into arrays."""
    n = len(source)
    if n == 0:
        raise DatasetUnavailableError(f"TFDS {name} split is empty")
    getitems = getattr(source, "__getitems__", None)
    records: list[dict] = []
    for start in range(0, n, 4096):
        keys = list(range(start, min(n, start + 4096)))
        try:
            batch = None if getitems is None else getitems(keys)
        except TypeError:
            # Batched reads are an optimisation; some sources (e.g. tfds'
            # own test mocks) only implement __getitem__.
            getitems = batch = None
        records.extend([source[i] for i in keys] if batch is None else batch)
    images = np.stack([np.asarray(r["image"], dtype=np.uint8) for r in records])
    labels = np.asarray([int(r["label"]) for r in records], dtype=np.int32)
    return LabeledSplit(x=_aligned_uint8_images(images), y=labels)


def _import_tfds(needed_for: str):
    try:
        import tensorflow_datasets as tfds  # deferred: ~0.5 s import, optional path
    except ImportError as e:
        raise DatasetUnavailableError(
            f"{needed_for} but tensorflow_datasets is not importable ({e}); "
            "pip install tensorflow-datasets importlib_resources Pillow"
        ) from e
    return tfds


def _load_tfds(name: str, tfds_dir: pathlib.Path) -> Dataset:
    tfds = _import_tfds(f"a prepared TFDS copy of {name} exists in {tfds_dir}")
    # Never download: offline, tfds retries for minutes.
    read = dict(split=list(_SPLITS), data_dir=os.fspath(tfds_dir), download=False, try_gcs=False)
    try:
        sources = tfds.data_source(name, **read)
    except NotImplementedError as e:
        # data_source reads only array_record/parquet; the default TFDS format
        # (tfrecord) needs TensorFlow to read.
        splits = _load_tfds_tfrecord(tfds, name, tfds_dir, read, e)
    except Exception as e:  # e.g. a version TFDS cannot read, a damaged tree
        raise DatasetUnavailableError(
            f"TFDS could not open the prepared {name} in {tfds_dir}: {type(e).__name__}: {e}"
        ) from e
    else:
        splits = {split: _read_tfds_source(src, name) for split, src in zip(_SPLITS, sources)}
    return _dataset(name, splits, f"TFDS {name} prepared in {tfds_dir}")


def _tfrecord_splits(tfds, name: str, tfds_dir: pathlib.Path, read: dict, cause: Exception):
    """The splits of a copy prepared as TFRecord (which `tfds.data_source` cannot read), as
    NumPy dicts through `tfds.load`, which needs TensorFlow (an error saying so without it)."""
    try:
        import tensorflow  # noqa: F401  (only to know whether tfds.load can read tfrecord)
    except ImportError:
        raise DatasetUnavailableError(
            f"{name} in {tfds_dir} is prepared in TFRecord format, which needs TensorFlow "
            "to read; install tensorflow, or re-prepare it with "
            "download_and_prepare(file_format='array_record')"
        ) from cause
    return tfds.as_numpy(tfds.load(name, batch_size=-1, **read))


def _load_tfds_tfrecord(tfds, name: str, tfds_dir: pathlib.Path, read: dict, cause: Exception):
    splits = _tfrecord_splits(tfds, name, tfds_dir, read, cause)
    return {
        split: LabeledSplit(x=_aligned_uint8_images(d["image"]), y=d["label"].astype(np.int32))
        for split, d in zip(_SPLITS, splits)
    }


# ---- Public loaders ------------------------------------------------------


def load_fashion_mnist(
    data_dir: str | os.PathLike | None = None, *, search_debian: bool = True
) -> Dataset:
    """Loads Fashion-MNIST (Xiao et al., 2017): 60k train / 10k test 28x28 grey images.

    With an explicit ``data_dir``, that directory is the only place looked in: the official idx
    files (``train-images-idx3-ubyte[.gz]``, ...) in ``data_dir``, ``data_dir/fashion-mnist`` or
    ``data_dir/fashion_mnist``, or a TFDS copy prepared in ``data_dir``. A ``data_dir`` without
    the data set is an error naming what is missing, never a fallback to another copy.

    With ``data_dir=None``, in order:
      1. ``DEBIAN_FASHION_MNIST_DIR`` (the ``dataset-fashion-mnist`` package),
         unless ``search_debian`` is False;
      2. a TFDS copy prepared in ``$TFDS_DATA_DIR`` (or ``~/tensorflow_datasets``).

    Returns x uint8 (N, 28, 28, 1), seen by the model as ``pixel / 127.5 - 1`` in [-1, 1]
    (`Dataset.input_scaling`), and y int32 in [0, 10).

    Raises:
      DatasetUnavailableError: no source has the data, or ``data_dir`` does not
        hold it (raised immediately; nothing is downloaded). The message names
        what is missing and how to obtain it.
      ValueError: an idx file is present but corrupt or truncated.
    """
    if data_dir is not None:
        return _load_fashion_mnist_from(_explicit_data_dir(data_dir, "Fashion-MNIST"))
    searched: list[str] = []
    if search_debian:
        directory = pathlib.Path(DEBIAN_FASHION_MNIST_DIR)
        if (found := _idx_dataset(directory)) is not None:
            return found
        searched.append(f"idx files in {directory}")
    tfds_dir = _tfds_data_dir()
    if _tfds_prepared(tfds_dir, "fashion_mnist"):
        return _load_tfds("fashion_mnist", tfds_dir)
    searched.append(f"a prepared TFDS fashion_mnist in {tfds_dir}")

    raise DatasetUnavailableError(
        f"Fashion-MNIST is not available locally (nothing is downloaded). Searched: "
        f"{'; '.join(searched)}.\nTo get it, any of:\n  * `apt-get install dataset-fashion-mnist` "
        f"(puts the idx files in {DEBIAN_FASHION_MNIST_DIR});\n"
        "  * put the four official idx files (train-images-idx3-ubyte.gz, "
        "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) "
        "in a directory and pass --data_dir DIR (data_dir=DIR);\n"
        "  * " + _TFDS_HINT.format(name="fashion_mnist") + "."
    )


def _dataset(name: str, splits: dict[str, LabeledSplit], source: str) -> Dataset:
    """A built-in image data set (both have 10 classes, uint8 pixels) from its splits."""
    return Dataset(name, splits["train"], splits["test"], num_classes=10, source=source,
                   input_scaling=PIXELS_TO_UNIT_RANGE)


def _fashion_mnist_dirs(base: pathlib.Path) -> list[pathlib.Path]:
    return [base, base / "fashion-mnist", base / "fashion_mnist"]


def _check_fashion_mnist_dir(base: pathlib.Path) -> None:
    """The data_dir check of Fashion-MNIST (a few stat calls): its idx files or a TFDS copy."""
    dirs = _fashion_mnist_dirs(base)
    if any(map(_find_idx_files, dirs)) or _tfds_prepared(base, "fashion_mnist"):
        return
    raise ValueError(
        f"does not hold Fashion-MNIST: missing the idx file(s) {_missing_idx_files(base)} "
        f"(looked in it and in its fashion-mnist/ and fashion_mnist/ subdirectories) and no "
        f"prepared TFDS copy ({base}/fashion_mnist/<version>/dataset_info.json). Put the four "
        "official idx files there, or leave data_dir unset to use "
        f"{DEBIAN_FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)."
    )


def _load_fashion_mnist_from(base: pathlib.Path) -> Dataset:
    """Fashion-MNIST from an explicit directory only (see `load_fashion_mnist`)."""
    candidates = _fashion_mnist_dirs(base)
    for directory in candidates:
        if (found := _idx_dataset(directory)) is not None:
            return found
    if _tfds_prepared(base, "fashion_mnist"):
        return _load_tfds("fashion_mnist", base)
    # Name the files missing where most of them are (a partial copy), else in data_dir.
    closest = min(candidates, key=lambda d: len(_missing_idx_files(d)))
    raise DatasetUnavailableError(
        f"data_dir={base} does not hold Fashion-MNIST (an explicit data_dir is the only place "
        f"looked in; nothing is downloaded): {closest} lacks the idx file(s) "
        f"{', '.join(_missing_idx_files(closest))} (also looked in its fashion-mnist/ and "
        f"fashion_mnist/ subdirectories), and there is no prepared TFDS copy "
        f"{base}/fashion_mnist/<version>/dataset_info.json.\nPut the four official idx files "
        "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
        "t10k-labels-idx1-ubyte.gz) there, or pass data_dir=None (no --data_dir) to use "
        f"{DEBIAN_FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist) or $TFDS_DATA_DIR."
    )


def load_cifar10(data_dir: str | os.PathLike | None = None, *, download: bool = False) -> Dataset:
    """Loads CIFAR-10 (Krizhevsky, 2009): 50k train / 10k test 32x32 RGB images.

    Read through ``tfds.data_source("cifar10", download=False)`` from a copy already prepared in
    ``data_dir`` (only there when it is given: never a fallback to another copy), else in
    ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``. Returns x uint8 (N, 32, 32, 3), seen by the
    model in [-1, 1] (`Dataset.input_scaling`), and y int32 in [0, 10).

    With ``download=True`` and no prepared copy there, TFDS downloads and prepares
    one first (``download_and_prepare(file_format="array_record")``, about 170 MB,
    internet needed). Off by default: offline, TFDS retries for minutes before failing.

    Raises:
      DatasetUnavailableError: no prepared copy exists where looked and download is off
        (raised immediately), or the download failed. The message names the missing
        file and says how to prepare one.
    """
    if data_dir is not None:
        tfds_dir = _explicit_data_dir(data_dir, "CIFAR-10")
        where = f"data_dir={tfds_dir} does not hold CIFAR-10 (an explicit data_dir is the only "
        where += "place looked in; nothing is downloaded)"
    else:
        tfds_dir = _tfds_data_dir()
        where = "CIFAR-10 is not available locally (nothing is downloaded)"
    if download and not _tfds_prepared(tfds_dir, "cifar10"):
        _download_and_prepare("cifar10", tfds_dir)
    if not _tfds_prepared(tfds_dir, "cifar10"):
        raise DatasetUnavailableError(
            f"{where}: there is no prepared TFDS copy {tfds_dir}/cifar10/<version>/"
            f"dataset_info.json.\nTo get it: {_TFDS_HINT.format(name='cifar10')}."
        )
    return _load_tfds("cifar10", tfds_dir)


def _check_cifar10_dir(base: pathlib.Path) -> None:
    """The data_dir check of CIFAR-10 (a few stat calls): a prepared TFDS copy."""
    if not _tfds_prepared(base, "cifar10"):
        raise ValueError(
            f"does not hold CIFAR-10: no prepared TFDS copy {base}/cifar10/<version>/"
            "dataset_info.json. Prepare it with TensorFlow Datasets (tfds.builder('cifar10', "
            "data_dir=DIR).download_and_prepare(file_format='array_record')) on a machine with "
            "internet, or set config.dataset.download=True there."
        )


def _download_and_prepare(name: str, tfds_dir: pathlib.Path) -> None:
    tfds = _import_tfds(f"downloading {name} was asked for (dataset.download)")
    tfds_dir.mkdir(parents=True, exist_ok=True)
    try:
        tfds.builder(name, data_dir=os.fspath(tfds_dir)).download_and_prepare(
            file_format="array_record"
        )
    except Exception as e:  # network, disk, TFDS: one error that says what was attempted
        raise DatasetUnavailableError(
            f"downloading and preparing {name} into {tfds_dir} failed: {type(e).__name__}: {e}"
        ) from e


# ---- The registry --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DataFacts:
    """What a config is checked against, read cheaply from a data set's files (a registered
    reader's `describe`): the training examples, the client ids G, each example's shape,
    where the files say it without reading every label the classes (None: from the data or
    config.dataset.num_classes), and the clients' names in client-id order (a target group
    of the scheme "natural", partition.target_group, is resolved against them)."""

    num_train: int
    num_client_ids: int
    input_shape: tuple[int, ...]
    num_classes: int | None = None
    client_names: tuple[str, ...] | None = None  # the format's id of each client id, in order

    def __post_init__(self) -> None:
        if self.client_names is not None:
            names = tuple(str(n) for n in self.client_names)
            if len(names) != self.num_client_ids:
                raise ValueError(f"client_names must be {self.num_client_ids} names, got "
                                 f"{len(names)}")
            object.__setattr__(self, "client_names", names)
        object.__setattr__(self, "num_train", _validation.check_integer(
            "num_train", self.num_train, 1))
        object.__setattr__(self, "num_client_ids", _validation.check_integer(
            "num_client_ids", self.num_client_ids, 0))
        object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))
        if self.num_classes is not None:
            object.__setattr__(self, "num_classes", _validation.check_integer(
                "num_classes", self.num_classes, 1))


@dataclasses.dataclass(frozen=True)
class RegisteredDataset:
    """A registered data set: its loader and the facts a config is checked against before
    anything is loaded (see `register_dataset`)."""

    name: str
    load: Callable[..., Any]
    num_classes: int | None  # None: a reader's, from its files (`describe`) or the config
    num_train: int | None  # training examples (its own clients' with num_clients); None: a
    images: bool | None  # reader's, from its files (`describe`)
    label: str | None = None
    check_data_dir: Callable[[pathlib.Path], None] | None = None
    download: bool = False
    hyperparameters: type[declared.Hyperparameters] = declared.NoHyperparameters
    num_clients: int | None = None
    num_client_ids: int | None = None
    # The loaded data set is checked against num_train, num_clients and num_client_ids (a
    # user's loader); the built-in file loaders check their files themselves, and the tests
    # feed them TFDS's smaller mock data.
    check_counts: bool = True
    # A reader of files whose facts depend on them: describe(path, values) -> DataFacts, a few
    # cheap reads (headers, counts, one example), called when the config names the path.
    describe: Callable[[pathlib.Path, Any], DataFacts] | None = None
    # data_dir may name a file (one-file formats: an SQLite or Parquet file), not only a
    # directory.
    reads_file: bool = False
    # The model config.model='auto' picks (None: LeNet for images, else logistic regression).
    model: str | None = None
    # Where a reader looks when config.dataset.data_dir is None (Shakespeare's cache); None:
    # data_dir must be given.
    default_data_dir: Callable[[], pathlib.Path] | None = None
    # The clients' names in client-id order, where the files gave them (`with_facts`).
    client_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _validation.check_registered_name("data set", self.name)
        _validation.check_hook(
            f"data set {self.name!r}", "check_data_dir", self.check_data_dir, "(path) -> None",
            optional=True,
        )
        _validation.check_hook(
            f"data set {self.name!r}", "describe", self.describe, "(path, values) -> DataFacts",
            optional=True,
        )
        if self.describe is not None and self.check_data_dir is None:
            raise ValueError(
                f"data set {self.name!r}: describe reads its files, so it needs check_data_dir "
                "(the data are read from config.dataset.data_dir)."
            )
        needed = () if self.describe is not None else ("num_classes", "num_train")
        for key in ("num_classes", "num_train", "num_clients", "num_client_ids"):
            if getattr(self, key) is not None or key in needed:
                object.__setattr__(self, key, _validation.check_integer(key, getattr(self, key), 1))
        if self.images is None and self.describe is None:
            raise ValueError(f"data set {self.name!r}: images must be True or False.")
        if self.label is not None and (not isinstance(self.label, str) or not self.label.strip()):
            raise ValueError(f"label must be a non-empty string, got {self.label!r}.")
        object.__setattr__(self, "label", self.label or self.name)
        declared.check_declared(f"data set {self.name!r}", self.hyperparameters)
        # The keywords `load_options` passes (the values do not matter to the check).
        keywords = tuple(declared.hyperparameter_defaults(self.hyperparameters))
        keywords += ("data_dir",) * (self.check_data_dir is not None)
        keywords += ("download",) * bool(self.download) + ("seed",) * (self.num_clients is not None)
        _validation.check_hook(f"data set {self.name!r}", "load", self.load, "(...) -> Dataset",
                               keywords=keywords)

    def with_facts(self, facts: DataFacts) -> "RegisteredDataset":
        """The registration with the facts its files gave (`describe`): what the config of a
        run on them is checked against."""
        return dataclasses.replace(
            self, num_train=facts.num_train, num_client_ids=facts.num_client_ids or None,
            num_classes=facts.num_classes or self.num_classes,
            images=len(facts.input_shape) == 3 if self.images is None else self.images,
            client_names=facts.client_names,
        )

    def load_options(self, section: Mapping[str, Any], seed: int) -> tuple[tuple[str, Any], ...]:
        """The keyword arguments of `load` from the resolved config's dataset section."""
        options = {k: section[k] for k in declared.hyperparameter_defaults(self.hyperparameters)}
        if self.check_data_dir is not None:
            options["data_dir"] = section["data_dir"]
        if self.download:
            options["download"] = bool(section["download"])
        if self.num_clients is not None:
            options["seed"] = seed
        return tuple(sorted(options.items()))


_REGISTERED: dict[str, RegisteredDataset] = {}


def register_dataset(
    name: str, load: Callable[..., Any], *, replace: bool = False, **facts: Any
) -> None:
    """Registers a data set under `name` (config.dataset.name = name).

    load() -> Dataset, e.g. `Dataset(name, LabeledSplit(x, y), LabeledSplit(x_test, y_test),
    num_classes, source)` from NumPy arrays, is called once per process when a run needs it
    (cache nothing yourself); the partition schemes split it. The facts, checked by the config
    before anything is loaded: num_classes, num_train (training examples) and images (inputs
    (H, W, C): the 'auto' model is LeNet) are required. label: how tables, figures and sweep
    rows show it ("iWildCam"; default the name). check_data_dir(path): a few stat calls that
    an explicit config.dataset.data_dir holds it (ValueError "does not hold ...: ..."); load is
    then passed data_dir (None: the usual places), and download when `download` is True.
    hyperparameters: a `Hyperparameters` dataclass, config keys dataset.<field> passed to load
    by name. num_clients: its own clients, target included (the synthetic task): load(...,
    seed) returns (Dataset, FederatedPartition), no scheme applies. num_client_ids: G, its
    Dataset's client_ids being 0, ..., G-1 (the scheme "natural").
    """
    if name in _REGISTERED and not replace:
        raise ValueError(f"a data set {name!r} is already registered; pick another name.")
    registered = RegisteredDataset(name, load, **facts)
    owners = {n: d.hyperparameters for n, d in _REGISTERED.items()}
    declared.check_shared_fields(
        "data set", name, registered.hyperparameters, owners, "dataset",
        ("name", "data_dir", "download"),
    )
    _REGISTERED[name] = registered
    extensions.note_registration(
        "dataset", name, (f"dataset.{key}" for key in declared.declared_fields(
            {name: registered.hyperparameters}))
    )


def dataset_label(name: str) -> str:
    """How tables, figure titles and sweep rows show the data set `name` ("Fashion-MNIST", a
    registered one's `label`); an unknown name as it is."""
    return _REGISTERED[name].label if name in _REGISTERED else name


def registered_datasets() -> dict[str, RegisteredDataset]:
    """The registered data sets, the built-in ones first (fashion_mnist, cifar10, synthetic)."""
    return dict(_REGISTERED)


def dataset_fields() -> dict[str, tuple[Any, Callable[[str, Any], Any], tuple[str, ...]]]:
    """{config key under dataset.: (default, check, the data sets that use it)}."""
    return declared.declared_fields({n: d.hyperparameters for n, d in _REGISTERED.items()})


def canonical_dataset_name(name: Any, names) -> str | None:
    """The one of `names` that `name` spells, ignoring case, "-" and "_" ("CIFAR-10")."""
    if not isinstance(name, str):
        return None
    canonical = {key.replace("_", ""): key for key in names}
    return canonical.get(name.strip().lower().replace("-", "").replace("_", ""))


def load_dataset(name: str, data_dir: str | os.PathLike | None = None, **options: Any) -> Dataset:
    """Loads a data set that is read from files by name: ``"fashion_mnist"``, ``"cifar10"``, a
    federated format (``"leaf"``, ``"tff_sqlite"``, ``"fedjax_sqlite"``, ``"parquet"``: the
    path may name the file itself for one-file formats), ``"shakespeare"``, or a registered one
    with a `check_data_dir`. `options`: the data set's own keys (config.dataset.<key>, e.g.
    ``num_classes=62``, ``input_shape=(28, 28, 1)``), the rest at their defaults.

    Names are matched ignoring case, ``-`` and ``_`` (so "CIFAR-10" works). An
    explicit ``data_dir`` is the only place looked in (see the loaders).
    """
    readers = sorted(n for n, d in _REGISTERED.items() if d.check_data_dir is not None)
    key = canonical_dataset_name(name, readers)
    if key is None:
        raise ValueError(f"unknown dataset {name!r}; valid names: {readers}")
    registered = _REGISTERED[key]
    fields = declared.hyperparameter_defaults(registered.hyperparameters)
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(f"data set {key!r} has no option(s) {unknown}; its options: "
                         f"{sorted(fields)}")
    values = registered.hyperparameters(**{**fields, **options})  # checked
    return registered.load(data_dir=data_dir, **dataclasses.asdict(values))


DEFAULT_DATASET = "fashion_mnist"
register_dataset(
    "fashion_mnist", load_fashion_mnist, num_classes=10, num_train=60_000, images=True,
    label="Fashion-MNIST", check_data_dir=_check_fashion_mnist_dir, check_counts=False,
)
register_dataset(
    "cifar10", load_cifar10, num_classes=10, num_train=50_000, images=True, label="CIFAR-10",
    check_data_dir=_check_cifar10_dir, download=True, check_counts=False,
)
