"""CIFAR-100 and EMNIST from prepared TensorFlow Datasets copies (never downloaded).

Like `fedjax_pals.data.datasets.load_cifar10`, these loaders read a copy that TFDS has already
prepared (``DATA_DIR/<name>/<version>/dataset_info.json``): they check for it with a few `stat`
calls and raise `DatasetUnavailableError` at once, saying how to prepare it, when it is not
there; TFDS is then asked only for ``tfds.data_source(..., download=False, try_gcs=False)``
(array_record; a TFRecord copy needs TensorFlow). Images are kept as uint8, seen by the model as
``pixel / 127.5 - 1`` (`PIXELS_TO_UNIT_RANGE`).

* CIFAR-100 (`load_cifar100`, TFDS ``cifar100``): 50k train / 10k test 32x32 RGB, 100 fine
  classes ('label') in 20 coarse classes ('coarse_label'); `Dataset.coarse_labels` (100,) is
  derived from the (label, coarse_label) pairs of the data (checked to be a function), for the
  partition scheme "pachinko" (`fedjax_pals.data.pachinko`).
* EMNIST ByClass (`load_emnist`, TFDS ``emnist/byclass``): 697,932 train / 116,323 test 28x28
  grey, 62 classes (digits, upper- and lower-case letters). TFDS stores the images as the
  original EMNIST files do, transposed (its builder's description: "inverted horizontally and
  rotated 90 anti-clockwise. You can use `tf.transpose` ... to convert the images to a
  human-friendlier format"); the loader swaps the height and width axes, so that images are
  upright as in MNIST and LEAF's FEMNIST.

Both are registered (config.dataset.name = "cifar100" / "emnist").
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import numpy as np

from fedjax_pals._host import aligned_empty
from fedjax_pals.data import datasets as _datasets
from fedjax_pals.data.datasets import (
    PIXELS_TO_UNIT_RANGE,
    Dataset,
    DatasetUnavailableError,
    LabeledSplit,
    register_dataset,
)

CIFAR100_NUM_CLASSES = 100
CIFAR100_NUM_COARSE_CLASSES = 20
EMNIST_NUM_CLASSES = 62
EMNIST_NUM_TRAIN = 697_932

_SPLITS = ("train", "test")
_CHUNK = 4096


def _tfds_dir(data_dir, label: str) -> tuple[pathlib.Path, str]:
    """The TFDS directory read and the start of the message when it lacks the data set."""
    if data_dir is not None:
        path = _datasets._explicit_data_dir(data_dir, label)
        return path, (f"data_dir={path} does not hold {label} (an explicit data_dir is the only "
                      "place looked in; nothing is downloaded)")
    path = _datasets._tfds_data_dir()
    return path, f"{label} is not available locally (nothing is downloaded)"


def _prepared(tfds_dir: pathlib.Path, name: str) -> bool:
    """A prepared copy of TFDS `name` ("cifar100", or "emnist/byclass": a config) in tfds_dir."""
    parent, _, leaf = name.rpartition("/")
    return _datasets._tfds_prepared(tfds_dir / parent if parent else tfds_dir, leaf)


def _unavailable(tfds_dir: pathlib.Path, name: str, where: str) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"{where}: there is no prepared TFDS copy {tfds_dir}/{name}/<version>/dataset_info.json."
        f"\nTo get it: {_datasets._TFDS_HINT.format(name=name)}."
    )


def _check_prepared(name: str, label: str):
    """The data_dir check (a few stat calls) of a registered TFDS data set."""

    def check(base: pathlib.Path) -> None:
        if not _prepared(base, name):
            raise ValueError(
                f"does not hold {label}: no prepared TFDS copy {base}/{name}/<version>/"
                f"dataset_info.json. Prepare it with TensorFlow Datasets (tfds.builder("
                f"'{name}', data_dir=DIR).download_and_prepare(file_format='array_record')) on "
                "a machine with internet (nothing is downloaded here)."
            )

    return check


def _read_source(source: Sequence[dict], name: str, keys: tuple[str, ...], transpose: bool):
    """Every record of a TFDS random-access source: its images (uint8, 64-byte aligned, filled
    chunk by chunk, no list of every record; with `transpose`, height and width swapped) and
    the integer features `keys` (int64)."""
    n = len(source)
    if n == 0:
        raise DatasetUnavailableError(f"TFDS {name} split is empty")
    getitems = getattr(source, "__getitems__", None)
    images = None
    features = {key: np.empty(n, np.int64) for key in keys}
    for start in range(0, n, _CHUNK):
        indices = list(range(start, min(n, start + _CHUNK)))
        try:
            records = None if getitems is None else getitems(indices)
        except TypeError:  # some sources (TFDS's own mocks) only implement __getitem__
            getitems = records = None
        if records is None:
            records = [source[i] for i in indices]
        chunk = np.stack([np.asarray(r["image"], dtype=np.uint8) for r in records])
        if transpose:
            chunk = chunk.swapaxes(1, 2)
        if images is None:
            images = aligned_empty((n, *chunk.shape[1:]), np.uint8)
        images[start : start + len(records)] = chunk
        for key in keys:
            features[key][start : start + len(records)] = [int(r[key]) for r in records]
    return images, features


def _read_tfds(name: str, tfds_dir: pathlib.Path, keys: tuple[str, ...], transpose=False):
    """{split: (uint8 images, {key: int64 features})} of a prepared TFDS copy (with
    `transpose`, each image's height and width swapped)."""
    tfds = _datasets._import_tfds(f"a prepared TFDS copy of {name} exists in {tfds_dir}")
    read = dict(split=list(_SPLITS), data_dir=os.fspath(tfds_dir), download=False, try_gcs=False)
    try:
        sources = tfds.data_source(name, **read)
    except NotImplementedError as e:  # TFRecord: tfds.load, which needs TensorFlow
        loaded = _datasets._tfrecord_splits(tfds, name, tfds_dir, read, e)
        return {
            split: (_datasets._aligned_uint8_images(
                d["image"].swapaxes(1, 2) if transpose else d["image"]),
                    {key: np.asarray(d[key], np.int64) for key in keys})
            for split, d in zip(_SPLITS, loaded)
        }
    except Exception as e:  # a version TFDS cannot read, a damaged tree
        raise DatasetUnavailableError(
            f"TFDS could not open the prepared {name} in {tfds_dir}: {type(e).__name__}: {e}"
        ) from e
    return {split: _read_source(src, name, keys, transpose)
            for split, src in zip(_SPLITS, sources)}


def _check_labels(name: str, split: str, labels: np.ndarray, num: int, what: str) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= num):
        raise ValueError(
            f"TFDS {name} {split} split holds {what} {int(labels.min())}..{int(labels.max())}, "
            f"outside [0, {num})"
        )


def coarse_labels_of(fine: np.ndarray, coarse: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_classes,) the coarse class of each fine class, from the (fine, coarse) pairs of the
    examples. Raises ValueError if a fine class has two coarse classes (not a function) or
    none (no example)."""
    fine, coarse = np.asarray(fine, np.int64), np.asarray(coarse, np.int64)
    pairs = np.unique(np.stack([fine, coarse], axis=1), axis=0)
    classes, counts = np.unique(pairs[:, 0], return_counts=True)
    if np.any(counts > 1):
        k = int(classes[counts > 1][0])
        raise ValueError(
            f"the coarse label is not a function of the fine label: fine class {k} has coarse "
            f"classes {pairs[pairs[:, 0] == k, 1].tolist()}"
        )
    missing = sorted(set(range(num_classes)) - set(classes.tolist()))
    if missing:
        raise ValueError(
            f"fine class(es) {missing[:10]}{' ...' if len(missing) > 10 else ''} have no "
            "example, so their coarse class is unknown"
        )
    out = np.empty(num_classes, np.int64)
    out[pairs[:, 0]] = pairs[:, 1]
    return out


# ---- CIFAR-100 -------------------------------------------------------------


def load_cifar100(data_dir: str | os.PathLike | None = None) -> Dataset:
    """Loads CIFAR-100 (Krizhevsky, 2009): 50k train / 10k test 32x32 RGB images, 100 classes.

    Read through ``tfds.data_source("cifar100", download=False)`` from a copy already prepared in
    ``data_dir`` (only there when it is given: never a fallback to another copy), else in
    ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``. Returns x uint8 (N, 32, 32, 3), seen by the
    model in [-1, 1] (`Dataset.input_scaling`), y int32 the fine label in [0, 100), and
    `Dataset.coarse_labels` (100,): the super-class in [0, 20) of each class, derived from the
    (label, coarse_label) pairs of both splits.

    Raises:
      DatasetUnavailableError: no prepared copy where looked (raised at once, naming the
        missing file and how to prepare one; nothing is downloaded).
      ValueError: the copy's labels are out of range, or its coarse label is not a function
        of its fine label.
    """
    tfds_dir, where = _tfds_dir(data_dir, "CIFAR-100")
    if not _prepared(tfds_dir, "cifar100"):
        raise _unavailable(tfds_dir, "cifar100", where)
    read = _read_tfds("cifar100", tfds_dir, ("label", "coarse_label"))
    for split, (_, f) in read.items():
        _check_labels("cifar100", split, f["label"], CIFAR100_NUM_CLASSES, "labels")
        _check_labels("cifar100", split, f["coarse_label"], CIFAR100_NUM_COARSE_CLASSES,
                      "coarse labels")
    fine = np.concatenate([f["label"] for _, f in read.values()])
    coarse = np.concatenate([f["coarse_label"] for _, f in read.values()])
    try:
        coarse_of = coarse_labels_of(fine, coarse, CIFAR100_NUM_CLASSES)
    except ValueError as e:
        raise ValueError(f"TFDS cifar100 prepared in {tfds_dir}: {e}") from None
    splits = {split: LabeledSplit(x, f["label"].astype(np.int32)) for split, (x, f) in
              read.items()}
    return Dataset("cifar100", splits["train"], splits["test"], CIFAR100_NUM_CLASSES,
                   f"TFDS cifar100 prepared in {tfds_dir}", input_scaling=PIXELS_TO_UNIT_RANGE,
                   coarse_labels=coarse_of)


# ---- EMNIST ----------------------------------------------------------------


def load_emnist(data_dir: str | os.PathLike | None = None) -> Dataset:
    """Loads EMNIST ByClass (Cohen et al., 2017): 697,932 train / 116,323 test 28x28 grey
    images of 62 classes (10 digits, 26 upper-case, 26 lower-case letters).

    Read through ``tfds.data_source("emnist/byclass", download=False)`` from a copy already
    prepared in ``data_dir`` (only there when it is given), else in ``$TFDS_DATA_DIR`` or
    ``~/tensorflow_datasets``. TFDS keeps EMNIST's stored orientation, the image transposed
    (its description says so and suggests `tf.transpose`); the loader transposes it back
    (x[n, i, j] = stored[n, j, i]), so characters are upright. Returns x uint8 (N, 28, 28, 1),
    seen by the model in [-1, 1] (`Dataset.input_scaling`), and y int32 in [0, 62).

    Raises:
      DatasetUnavailableError: no prepared copy where looked (raised at once; nothing is
        downloaded).
      ValueError: the copy's images are not 28x28x1 or its labels out of range.
    """
    tfds_dir, where = _tfds_dir(data_dir, "EMNIST ByClass")
    if not _prepared(tfds_dir, "emnist/byclass"):
        raise _unavailable(tfds_dir, "emnist/byclass", where)
    # Stored transposed (x[n, j, i]): swapped back chunk by chunk as it is read.
    read = _read_tfds("emnist/byclass", tfds_dir, ("label",), transpose=True)
    splits = {}
    for split, (x, f) in read.items():
        if x.shape[1:] != (28, 28, 1):
            raise ValueError(f"TFDS emnist/byclass {split} images are {x.shape[1:]}, not "
                             "(28, 28, 1)")
        _check_labels("emnist/byclass", split, f["label"], EMNIST_NUM_CLASSES, "labels")
        splits[split] = LabeledSplit(x, f["label"].astype(np.int32))
    return Dataset("emnist", splits["train"], splits["test"], EMNIST_NUM_CLASSES,
                   f"TFDS emnist/byclass prepared in {tfds_dir} (images transposed upright)",
                   input_scaling=PIXELS_TO_UNIT_RANGE)


register_dataset(
    "cifar100", load_cifar100, num_classes=CIFAR100_NUM_CLASSES, num_train=50_000, images=True,
    label="CIFAR-100", check_data_dir=_check_prepared("cifar100", "CIFAR-100"),
    check_counts=False,
)
register_dataset(
    "emnist", load_emnist, num_classes=EMNIST_NUM_CLASSES, num_train=EMNIST_NUM_TRAIN,
    images=True, label="EMNIST", check_data_dir=_check_prepared("emnist/byclass", "EMNIST ByClass"),
    check_counts=False,
)
