"""Tests for fedjax_pals.data.datasets: idx parsing, source order, TFDS, offline errors."""

import gzip
import os
import pathlib

import numpy as np
import pytest

from fedjax_pals.data import datasets
from fedjax_pals.data.datasets import (
    DEBIAN_FASHION_MNIST_DIR,
    Dataset,
    DatasetUnavailableError,
    LabeledSplit,
    load_cifar10,
    load_dataset,
    load_fashion_mnist,
)

_HAVE_DEBIAN_FMNIST = all(
    os.path.exists(os.path.join(DEBIAN_FASHION_MNIST_DIR, f"{stem}.gz"))
    for stem in datasets._FMNIST_FILES.values()
)


def _idx_bytes(array: np.ndarray) -> bytes:
    magic = (0x0800 | array.ndim).to_bytes(4, "big")
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return magic + dims + array.astype(np.uint8).tobytes()


def _write_fmnist(directory: pathlib.Path, rng, n_train=7, n_test=5, compress=True):
    """Writes four tiny idx files; returns the uint8 images and labels written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        images.flat[0], images.flat[1] = 0, 255  # make both ends of the range appear
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        for kind, arr in (("images", images), ("labels", labels)):
            stem = datasets._FMNIST_FILES[(split, kind)]
            data = _idx_bytes(arr)
            if compress:
                (directory / f"{stem}.gz").write_bytes(gzip.compress(data))
            else:
                (directory / stem).write_bytes(data)
        written[split] = (images, labels)
    return written


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"random inputs drawn with seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def no_default_sources(monkeypatch, tmp_path):
    """Hides the Debian directory and points the default TFDS dir at an empty folder."""
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "no-debian"))
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "empty-tfds"))


@pytest.fixture
def no_tfds(monkeypatch):
    """Fails the test if TFDS is asked for anything: a missing data set is found by `stat`
    calls alone, before TFDS (whose downloads retry for minutes offline) is touched."""

    def load_tfds(*args, **kwargs):
        raise AssertionError("TFDS was called")

    monkeypatch.setattr(datasets, "_load_tfds", load_tfds)


@pytest.fixture
def other_copies(monkeypatch, tmp_path, rng):
    """A valid Fashion-MNIST in the (fake) Debian directory and prepared-looking TFDS trees of
    both data sets in $TFDS_DATA_DIR: copies an explicit data_dir must never fall back to."""
    debian = tmp_path / "debian-fashion-mnist"
    _write_fmnist(debian, rng)
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST_DIR", str(debian))
    tfds_dir = tmp_path / "default-tfds"
    _fake_prepared(tfds_dir, "fashion_mnist", "3.0.1")
    _fake_prepared(tfds_dir, "cifar10", "3.0.2")
    monkeypatch.setenv("TFDS_DATA_DIR", str(tfds_dir))
    return debian


# ---------------------------------------------------------------- containers


def test_labeled_split_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="disagree"):
        LabeledSplit(x=np.zeros((3, 2), np.float32), y=np.zeros(4, np.int32))


def test_labeled_split_rejects_non_integer_labels():
    with pytest.raises(ValueError, match="integer"):
        LabeledSplit(x=np.zeros((3, 2), np.float32), y=np.array([0.0, 1.5, 2.0]))


def test_labeled_split_stores_float32_int32_read_only_without_freezing_caller_array():
    x = np.zeros((3, 2), np.float32)
    split = LabeledSplit(x=x, y=np.array([0, 1, 2], np.int64))
    assert split.x.dtype == np.float32 and split.y.dtype == np.int32 and len(split) == 3
    assert not split.x.flags.writeable
    x[0, 0] = 1.0  # the caller's own array stays writable
    with pytest.raises(ValueError, match="read-only"):
        split.y[0] = 5


def test_dataset_rejects_labels_outside_num_classes():
    split = LabeledSplit(x=np.zeros((2, 1), np.float32), y=np.array([0, 3]))
    with pytest.raises(ValueError, match="labels must lie"):
        Dataset(name="d", train=split, test=split, num_classes=3, source="test")


# ------------------------------------------------------------ idx files


@pytest.mark.parametrize("compress", [True, False])
def test_idx_files_in_data_dir_are_parsed_and_scaled_exactly(tmp_path, rng, compress):
    written = _write_fmnist(tmp_path, rng, compress=compress)
    ds = load_fashion_mnist(tmp_path, search_debian=False)
    for split_name, split in (("train", ds.train), ("test", ds.test)):
        images, labels = written[split_name]
        assert split.x.shape == (len(labels), 28, 28, 1) and split.x.dtype == np.uint8
        np.testing.assert_array_equal(split.x[..., 0], images)  # held as stored
        np.testing.assert_array_equal(
            ds.model_inputs(split.x)[..., 0], images.astype(np.float32) / 127.5 - 1.0)
        np.testing.assert_array_equal(split.y, labels)
        assert split.y.dtype == np.int32
    assert ds.model_inputs(ds.train.x).min() == -1.0 and ds.model_inputs(ds.train.x).max() == 1.0
    assert ds.name == "fashion_mnist" and ds.num_classes == 10
    assert str(tmp_path) in ds.source


def test_data_dir_subfolder_fashion_mnist_is_searched(tmp_path, rng):
    _write_fmnist(tmp_path / "fashion-mnist", rng)
    ds = load_fashion_mnist(tmp_path, search_debian=False)
    assert len(ds.train) == 7 and str(tmp_path / "fashion-mnist") in ds.source


def test_data_dir_takes_precedence_over_debian_directory(tmp_path, rng):
    _write_fmnist(tmp_path, rng, n_train=4, n_test=3)
    ds = load_fashion_mnist(tmp_path)  # Debian search left on
    assert (len(ds.train), len(ds.test)) == (4, 3)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[:-10], "truncated or corrupt"),
        (lambda b: b"\x00\x00\x09\x03" + b[4:], "magic number"),
        (lambda b: b[:6], "too short"),
    ],
)
def test_corrupt_idx_file_raises_value_error_naming_the_file(tmp_path, rng, damage, message):
    _write_fmnist(tmp_path, rng, compress=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=message) as info:
        load_fashion_mnist(tmp_path, search_debian=False)
    assert "train-images-idx3-ubyte" in str(info.value)


def test_truncated_gzip_raises_value_error(tmp_path, rng):
    _write_fmnist(tmp_path, rng, compress=True)
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.gz"):
        load_fashion_mnist(tmp_path, search_debian=False)


def test_mismatched_image_and_label_counts_raise(tmp_path, rng):
    _write_fmnist(tmp_path, rng, compress=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(_idx_bytes(np.zeros(3, np.uint8)))
    with pytest.raises(ValueError, match="labels"):
        load_fashion_mnist(tmp_path, search_debian=False)


# ------------------------------------------------------ offline / unavailable


def test_missing_fashion_mnist_names_every_remedy(no_default_sources, no_tfds, tmp_path):
    with pytest.raises(DatasetUnavailableError, match="Fashion-MNIST is not available") as info:
        load_fashion_mnist()
    message = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in message
    assert "--data_dir" in message and "data_dir" in message
    assert "TensorFlow" in message and "tfds" in message
    assert str(tmp_path / "no-debian") in message  # says where it looked
    assert str(tmp_path / "empty-tfds") in message


def test_load_dataset_without_any_source_raises_before_tfds(no_default_sources, no_tfds):
    with pytest.raises(DatasetUnavailableError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist")


def test_missing_cifar10_names_the_missing_tree_and_how_to_prepare_it(tmp_path, no_tfds):
    with pytest.raises(DatasetUnavailableError, match="does not hold CIFAR-10") as info:
        load_cifar10(tmp_path)
    message = str(info.value)
    assert f"{tmp_path}/cifar10/<version>/dataset_info.json" in message
    assert "download_and_prepare" in message and "--data_dir" in message


def test_explicit_data_dir_without_fashion_mnist_is_an_error_not_a_fallback(
    other_copies, no_tfds, tmp_path
):
    # Today's copies elsewhere (Debian, $TFDS_DATA_DIR) load fine without data_dir ...
    assert str(other_copies) in load_fashion_mnist().source
    empty = tmp_path / "empty"
    empty.mkdir()
    for load in (load_fashion_mnist, lambda d: load_dataset("Fashion-MNIST", d)):
        # ... but a data_dir that lacks the data set is an error naming what is missing.
        with pytest.raises(DatasetUnavailableError, match="does not hold Fashion-MNIST") as info:
            load(empty)
        message = str(info.value)
        assert f"data_dir={empty}" in message
        for stem in datasets._FMNIST_FILES.values():
            assert f"{stem}[.gz]" in message
        assert f"{empty}/fashion_mnist/<version>/dataset_info.json" in message


def test_partial_copy_in_data_dir_is_an_error_naming_the_missing_file(other_copies, tmp_path, rng):
    copy = tmp_path / "data" / "fashion-mnist"
    _write_fmnist(copy, rng)
    (copy / "t10k-images-idx3-ubyte.gz").unlink()
    with pytest.raises(DatasetUnavailableError, match="does not hold Fashion-MNIST") as info:
        load_fashion_mnist(tmp_path / "data")
    message = str(info.value)
    assert f"{copy} lacks the idx file(s) t10k-images-idx3-ubyte[.gz] (" in message


@pytest.mark.parametrize("kind", ["does not exist", "is not a directory"])
@pytest.mark.parametrize("name", ["fashion_mnist", "cifar10"])
def test_data_dir_that_is_not_a_directory_is_an_error(other_copies, no_tfds, tmp_path, kind, name):
    path = tmp_path / "nowhere"
    if kind == "is not a directory":
        path.write_text("")
    with pytest.raises(DatasetUnavailableError, match=f"data_dir={path} {kind}"):
        load_dataset(name, path)


def test_explicit_data_dir_without_cifar10_is_an_error_not_a_fallback(
    other_copies, no_tfds, tmp_path
):
    empty = tmp_path / "empty"
    empty.mkdir()
    for load in (load_cifar10, lambda d: load_dataset("CIFAR-10", d)):
        with pytest.raises(DatasetUnavailableError, match="does not hold CIFAR-10") as info:
            load(empty)
        assert f"{empty}/cifar10/<version>/dataset_info.json" in str(info.value)


def test_partial_idx_directory_is_not_used(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "nothing"))
    _write_fmnist(tmp_path, rng)
    (tmp_path / "t10k-images-idx3-ubyte.gz").unlink()
    with pytest.raises(DatasetUnavailableError, match=r"t10k-images-idx3-ubyte\[\.gz\]"):
        load_fashion_mnist(tmp_path, search_debian=False)


def test_unknown_dataset_name_lists_valid_names():
    with pytest.raises(ValueError, match="cifar10.*fashion_mnist"):
        load_dataset("mnist")


# ------------------------------------------------------------------- TFDS


def _fake_prepared(tmp_path: pathlib.Path, name: str, version: str) -> None:
    """What a prepared TFDS tree looks like to the loaders' on-disk check."""
    version_dir = tmp_path / name / version
    version_dir.mkdir(parents=True)
    (version_dir / "dataset_info.json").write_text("{}")


def test_mock_cifar10_through_tfds_data_source(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    _fake_prepared(tmp_path, "cifar10", "3.0.2")
    with tfds.testing.mock_data(num_examples=23):
        ds = load_dataset("CIFAR-10", tmp_path)
    assert ds.name == "cifar10" and ds.num_classes == 10
    for split in (ds.train, ds.test):
        assert split.x.shape == (23, 32, 32, 3) and split.x.dtype == np.uint8
        assert split.y.shape == (23,) and split.y.dtype == np.int32
        seen = ds.model_inputs(split.x)
        assert -1.0 <= seen.min() and seen.max() <= 1.0
        assert seen.std() > 0.1  # real (fake) pixels, not a constant fill
        assert 0 <= split.y.min() and split.y.max() < 10
    assert "TFDS" in ds.source and str(tmp_path) in ds.source


def test_download_is_asked_for_only_with_download_true_and_then_loads(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    calls = []

    class FakeBuilder:  # what download_and_prepare leaves on disk, without the network
        def __init__(self, name, data_dir):
            calls.append((name, data_dir))
            self.data_dir = data_dir

        def download_and_prepare(self, file_format):
            calls.append(file_format)
            _fake_prepared(pathlib.Path(self.data_dir), "cifar10", "3.0.2")

    monkeypatch.setattr(tfds, "builder", FakeBuilder)
    with pytest.raises(DatasetUnavailableError, match="does not hold CIFAR-10"):
        load_cifar10(tmp_path)
    assert calls == []  # off by default: an offline machine fails at once
    with tfds.testing.mock_data(num_examples=7):
        ds = load_cifar10(tmp_path, download=True)
        assert calls == [("cifar10", str(tmp_path)), "array_record"]
        assert ds.train.x.shape == (7, 32, 32, 3)
        load_cifar10(tmp_path, download=True)  # prepared now: not downloaded again
    assert len(calls) == 2


def test_a_failed_download_is_one_error_naming_what_was_attempted(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")

    def offline(name, data_dir):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(tfds, "builder", offline)
    with pytest.raises(DatasetUnavailableError, match=r"downloading and preparing cifar10 into .*"
                       r"failed: ConnectionError: no route to host"):
        load_cifar10(tmp_path, download=True)


def test_mock_fashion_mnist_falls_back_to_prepared_tfds(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "no-debian"))
    _fake_prepared(tmp_path, "fashion_mnist", "3.0.1")
    with tfds.testing.mock_data(num_examples=11):
        ds = load_fashion_mnist(tmp_path)
    assert ds.train.x.shape == (11, 28, 28, 1) and ds.test.y.shape == (11,)
    assert "TFDS" in ds.source


# --------------------------------------------------------- real Fashion-MNIST


@pytest.mark.skipif(not _HAVE_DEBIAN_FMNIST, reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist_shapes_range_and_balanced_classes():
    ds = load_fashion_mnist()
    assert ds.train.x.shape == (60000, 28, 28, 1) and ds.test.x.shape == (10000, 28, 28, 1)
    assert ds.train.x.dtype == np.uint8 and ds.train.y.dtype == np.int32
    assert ds.train.x.min() == 0 and ds.train.x.max() == 255
    assert ds.input_scaling == datasets.InputScaling(127.5, -1.0)
    np.testing.assert_array_equal(np.bincount(ds.train.y, minlength=10), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(ds.test.y, minlength=10), np.full(10, 1000))
    assert DEBIAN_FASHION_MNIST_DIR in ds.source
