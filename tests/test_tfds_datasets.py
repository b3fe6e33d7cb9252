"""Tests for fedjax_pals.data.tfds_datasets: CIFAR-100 and EMNIST from prepared TFDS copies,
on `tfds.testing.mock_data` (never TFDS's download/retry loop)."""

import pathlib

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.data import datasets as datasets_lib
from fedjax_pals.data import pachinko  # noqa: F401  (registers the scheme "pachinko")
from fedjax_pals.data import tfds_datasets
from fedjax_pals.data.datasets import PIXELS_TO_UNIT_RANGE, DatasetUnavailableError
from fedjax_pals.data.tfds_datasets import coarse_labels_of, load_cifar100, load_emnist
from fedjax_pals.experiment import task as task_lib

# A fine -> coarse map other than k // 5, so that the loader must read it from the data.
COARSE_OF = np.random.default_rng(0).permutation(np.arange(100) // 5)


def _fake_prepared(base: pathlib.Path, name: str, version: str) -> None:
    version_dir = base / name / version
    version_dir.mkdir(parents=True)
    (version_dir / "dataset_info.json").write_text("{}")


@pytest.fixture
def no_tfds(monkeypatch):
    """Fails the test if TFDS is touched: a missing copy is found by `stat` calls alone."""

    def touched(*args, **kwargs):
        raise AssertionError("TFDS was called")

    monkeypatch.setattr(tfds_datasets, "_read_tfds", touched)
    monkeypatch.setattr(datasets_lib, "_import_tfds", touched)


def _source_fn(records):
    """An `as_data_source_fn` for `tfds.testing.mock_data`: the given records per split."""

    def as_data_source(self, split, decoders=None, deserialize_method=None, **kwargs):
        return [records[s] for s in split] if isinstance(split, (list, tuple)) else records[split]

    return as_data_source


def _cifar100_records(per_class, rng, coarse_of=COARSE_OF):
    fine = np.tile(np.arange(100), per_class)
    rng.shuffle(fine)
    images = rng.integers(0, 256, size=(len(fine), 32, 32, 3), dtype=np.uint8)
    return [dict(image=images[i], label=np.int64(k), coarse_label=np.int64(coarse_of[k]),
                 id=f"train_{i}") for i, k in enumerate(fine)]


def _mock_cifar100(tmp_path, rng, train_per_class=3, test_per_class=2, coarse_of=COARSE_OF):
    tfds = pytest.importorskip("tensorflow_datasets")
    _fake_prepared(tmp_path, "cifar100", "3.0.2")
    records = {"train": _cifar100_records(train_per_class, rng, coarse_of),
               "test": _cifar100_records(test_per_class, rng, coarse_of)}
    return tfds.testing.mock_data(as_data_source_fn=_source_fn(records)), records


def test_mock_cifar100_fine_labels_uint8_images_and_coarse_labels_from_the_pairs(tmp_path):
    rng = np.random.default_rng(1)
    mock, records = _mock_cifar100(tmp_path, rng)
    with mock:
        ds = load_cifar100(tmp_path)
    assert ds.name == "cifar100" and ds.num_classes == 100
    assert ds.input_scaling == PIXELS_TO_UNIT_RANGE
    for split, n in (("train", 300), ("test", 200)):
        s = getattr(ds, split)
        assert s.x.shape == (n, 32, 32, 3) and s.x.dtype == np.uint8
        assert s.y.dtype == np.int32
        np.testing.assert_array_equal(s.x, np.stack([r["image"] for r in records[split]]))
        np.testing.assert_array_equal(s.y, [r["label"] for r in records[split]])
    np.testing.assert_array_equal(ds.coarse_labels, COARSE_OF)
    assert "TFDS cifar100" in ds.source and str(tmp_path) in ds.source


def test_default_mock_cifar100_reads_through_tfds_data_source(tmp_path):
    """TFDS's own random mock (random, unrelated label and coarse_label): read as it comes,
    then refused because its coarse label is not a function of its fine label."""
    tfds = pytest.importorskip("tensorflow_datasets")
    _fake_prepared(tmp_path, "cifar100", "3.0.2")
    with tfds.testing.mock_data(num_examples=23):
        images, features = tfds_datasets._read_tfds("cifar100", tmp_path,
                                                    ("label", "coarse_label"))["train"]
        assert images.shape == (23, 32, 32, 3) and images.dtype == np.uint8
        assert images.std() > 10 and features["label"].max() < 100
        with pytest.raises(ValueError, match="TFDS cifar100 prepared in .*(not a function|have "
                           "no example)"):
            load_cifar100(tmp_path)


def test_a_coarse_label_that_is_not_a_function_of_the_fine_label_is_refused(tmp_path):
    rng = np.random.default_rng(2)
    mock, records = _mock_cifar100(tmp_path, rng)
    moved = next(r for r in records["test"] if r["label"] == 17)
    moved["coarse_label"] = np.int64((COARSE_OF[17] + 1) % 20)
    with mock, pytest.raises(ValueError, match=r"not a function of the fine label: fine class 17 "
                             r"has coarse classes \[\d+, \d+\]"):
        load_cifar100(tmp_path)


def test_coarse_labels_of_names_a_fine_class_without_examples():
    with pytest.raises(ValueError, match=r"fine class\(es\) \[2\] have no example"):
        coarse_labels_of(np.array([0, 1, 1]), np.array([1, 0, 0]), 3)
    np.testing.assert_array_equal(coarse_labels_of([2, 0, 1, 2], [5, 3, 4, 5], 3), [3, 4, 5])


def test_mock_emnist_is_transposed_upright(tmp_path):
    """TFDS's EMNIST is stored transposed: a stroke in stored row 2, columns 5..20 (a
    horizontal bar) must come out as column 2, rows 5..20 (a vertical one)."""
    tfds = pytest.importorskip("tensorflow_datasets")
    _fake_prepared(tmp_path, "emnist/byclass", "3.1.0")
    stored = np.zeros((28, 28, 1), np.uint8)
    stored[2, 5:21, 0] = 255
    records = {split: [dict(image=stored, label=np.int64(k)) for k in range(n)]
               for split, n in (("train", 62), ("test", 5))}
    with tfds.testing.mock_data(as_data_source_fn=_source_fn(records)):
        ds = load_emnist(tmp_path)
    assert ds.name == "emnist" and ds.num_classes == 62
    assert ds.input_scaling == PIXELS_TO_UNIT_RANGE
    assert ds.train.x.shape == (62, 28, 28, 1) and ds.train.x.dtype == np.uint8
    expected = np.zeros((28, 28, 1), np.uint8)
    expected[5:21, 2, 0] = 255
    np.testing.assert_array_equal(ds.train.x, np.broadcast_to(expected, (62, 28, 28, 1)))
    np.testing.assert_array_equal(ds.train.y, np.arange(62))
    assert ds.test.x.shape == (5, 28, 28, 1) and ds.coarse_labels is None


def test_default_mock_emnist_reads_through_tfds_data_source(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    _fake_prepared(tmp_path, "emnist/byclass", "3.1.0")
    with tfds.testing.mock_data(num_examples=9):
        ds = load_emnist(tmp_path)
    assert ds.train.x.shape == (9, 28, 28, 1) and ds.train.y.max() < 62


@pytest.mark.parametrize(
    "load, name, label",
    [(load_cifar100, "cifar100", "CIFAR-100"), (load_emnist, "emnist/byclass", "EMNIST ByClass")],
)
def test_a_missing_copy_is_an_immediate_error_saying_how_to_prepare_it(
    load, name, label, tmp_path, monkeypatch, no_tfds
):
    with pytest.raises(DatasetUnavailableError) as error:
        load(tmp_path)
    message = str(error.value)
    assert f"data_dir={tmp_path} does not hold {label}" in message
    assert f"{tmp_path}/{name}/<version>/dataset_info.json" in message
    assert f"tfds.builder('{name}'" in message and "download_and_prepare" in message
    # data_dir=None: $TFDS_DATA_DIR, the other data set's copy is no substitute.
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "default"))
    _fake_prepared(tmp_path / "default", "cifar10", "3.0.2")
    _fake_prepared(tmp_path / "default", "emnist/mnist", "3.1.0")
    with pytest.raises(DatasetUnavailableError, match=f"{label} is not available locally"):
        load()
    with pytest.raises(DatasetUnavailableError, match="does not exist"):
        load(tmp_path / "nowhere")


def test_registered_with_their_facts_and_their_data_dir_checked(tmp_path):
    registered = fjp.data.registered_datasets()
    cifar, emnist = registered["cifar100"], registered["emnist"]
    assert (cifar.num_classes, cifar.num_train, cifar.images, cifar.label) == (
        100, 50_000, True, "CIFAR-100")
    assert (emnist.num_classes, emnist.num_train, emnist.images, emnist.label) == (
        62, 697_932, True, "EMNIST")
    assert not cifar.download and not emnist.download
    with pytest.raises(fjp.ConfigError, match=r"does not hold CIFAR-100: no prepared TFDS copy"):
        fjp.validate_config({"dataset": {"name": "CIFAR-100", "data_dir": str(tmp_path)}})
    with pytest.raises(fjp.ConfigError, match=r"does not hold EMNIST ByClass"):
        fjp.validate_config({"dataset": {"name": "emnist", "data_dir": str(tmp_path)}})
    _fake_prepared(tmp_path, "emnist/byclass", "3.1.0")
    assert fjp.validate_config({"dataset": {"name": "emnist", "data_dir": str(tmp_path)}}
                               ).dataset.name == "emnist"
    with pytest.raises(fjp.ConfigError, match="has no coarse labels"):
        fjp.validate_config({"dataset": {"name": "emnist", "data_dir": str(tmp_path)},
                             "partition": {"scheme": "pachinko", "num_clients": 3}})


def test_the_pachinko_partition_of_mock_cifar100_end_to_end(tmp_path):
    rng = np.random.default_rng(3)
    mock, records = _mock_cifar100(tmp_path, rng, train_per_class=20, test_per_class=30)
    resolved = fjp.validate_config({
        "seed": 4,
        "dataset": {"name": "cifar100", "data_dir": str(tmp_path)},
        "partition": {"scheme": "pachinko", "num_clients": 5,
                      "pachinko_examples_per_client": 300},
    })
    assert resolved.partition.pachinko_coarse_alpha == 0.1
    with mock:
        dataset, partition = task_lib.load_data(resolved)
    assert dataset.name == "cifar100" and dataset.train.x.dtype == np.uint8
    np.testing.assert_array_equal(dataset.coarse_labels, COARSE_OF)
    assert partition.num_clients == 4 and partition.client_sizes.tolist() == [300] * 4
    assert len(partition.target_val_indices) == 300
    assert len(partition.target_test_indices) >= 30
    assert fjp.data.partitions.partition_problem(partition, dataset.train.y,
                                                 dataset.test.y) is None
    expected = pachinko.pachinko_partition(
        dataset.train.y, dataset.test.y, COARSE_OF, num_clients=5, seed=4,
        examples_per_client=300)
    np.testing.assert_array_equal(partition.client_label_counts, expected.client_label_counts)
    # Concentrated on a few coarse classes (alpha = 0.1): most clients' largest coarse share.
    coarse_shares = np.stack([np.bincount(COARSE_OF, weights=c, minlength=20)
                              for c in partition.client_label_dists])
    assert np.median(coarse_shares.max(axis=1)) > 0.3
