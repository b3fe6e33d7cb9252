"""fedjax_pals.data.natural: clients assembled from a format's reader, as stored; the natural
scheme's target by id, by name or group, tested on its own examples."""

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals import extensions
from fedjax_pals.data import natural
from fedjax_pals.data.natural import ClientExamples, DataFileError, assemble_clients
from fedjax_pals.data.partitions import natural_partition, target_group_ids


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"random inputs drawn with seed {seed}")
    return np.random.default_rng(seed)


def _block(client, split, n, *, k=4, width=3, where="f.json", rng=None, floats=True):
    rng = rng or np.random.default_rng(abs(hash((client, split))) % 2**32)
    pixels = rng.integers(0, 256, size=(n, width))
    x = pixels / 255.0 if floats else pixels.astype(np.int64)
    return ClientExamples(client, split, x, rng.integers(0, k, size=n), where)


@pytest.mark.parametrize("declared", [True, False])
def test_clients_are_assembled_in_order_of_appearance_with_their_own_test_examples(declared):
    blocks = [_block("w2", "train", 3), _block("w1", "train", 2), _block("w2", "test", 1),
              _block("w1", "test", 2)]
    counts = {"train": 5, "test": 3} if declared else None
    d = assemble_clients("t", blocks, source="s", num_classes=4, counts=counts)
    assert d.client_names == ("w2", "w1")
    np.testing.assert_array_equal(d.client_ids, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(d.test_client_ids, [0, 1, 1])
    # k / 255 floats are held as the uint8 k, and the model sees the file's values.
    assert d.train.x.dtype == np.uint8 and d.input_scaling == fjp.InputScaling(255.0)
    expected = np.concatenate([b.x for b in blocks[:2]])
    np.testing.assert_array_equal(np.rint(expected * 255), d.train.x)
    np.testing.assert_allclose(d.model_inputs(d.train.x), expected, rtol=1e-7, atol=0)
    np.testing.assert_array_equal(d.test.y, np.concatenate([b.y for b in blocks[2:]]))


def test_floats_that_are_not_all_k_over_255_are_float32_from_every_client():
    blocks = [_block("a", "train", 3), ClientExamples("b", "train", np.full((2, 3), 0.3),
                                                       np.zeros(2, int), "g.json")]
    for counts in ({"train": 5}, None):
        d = assemble_clients("t", blocks, source="s", counts=counts)
        assert d.train.x.dtype == np.float32 and d.input_scaling is None
        np.testing.assert_allclose(d.train.x[:3], blocks[0].x, rtol=1e-7)
        np.testing.assert_allclose(d.train.x[3:], 0.3, rtol=1e-7)


def test_integer_inputs_are_int32_tokens_and_input_shape_reshapes():
    blocks = [_block("a", "train", 2, width=6, floats=False)]
    d = assemble_clients("t", blocks, source="s")
    assert d.train.x.dtype == np.int32 and d.input_scaling is None
    assert d.num_classes == int(blocks[0].y.max()) + 1  # K from the data
    d = assemble_clients("t", [_block("a", "train", 2, width=6)], source="s",
                         input_shape=(2, 3, 1))
    assert d.train.x.shape == (2, 2, 3, 1)


@pytest.mark.parametrize("bad, message", [
    (ClientExamples("b", "train", np.zeros((0, 3)), np.zeros(0, int), "bad.json"),
     r"bad\.json: client 'b' has no train examples"),
    (ClientExamples("a", "train", np.zeros((1, 3)), np.zeros(1, int), "bad.json"),
     r"bad\.json: client id 'a' appears twice in the train split"),
    (ClientExamples("b", "train", np.zeros((1, 3)), np.array([7]), "bad.json"),
     r"bad\.json: client 'b' has train label 7, outside \[0, 4\)"),
    (ClientExamples("b", "train", np.zeros((1, 4)), np.array([1]), "bad.json"),
     r"bad\.json: client 'b'.s train inputs have shape \(4,\) per example, but the first"),
    (ClientExamples("b", "train", np.zeros((1, 3)), np.array([0.5]), "bad.json"),
     r"bad\.json: client 'b'.s train labels are not class indices"),
    (ClientExamples("c", "test", np.zeros((1, 3)), np.array([0]), "bad.json"),
     r"bad\.json: client 'c' has test examples but no training examples"),
    (ClientExamples("b", "train", np.zeros((1, 3), np.int64), np.array([0]), "bad.json"),
     r"bad\.json: client 'b'.s train inputs are int64, but the first client's are stored as "
     "uint8"),
])
def test_each_bad_client_is_one_error_naming_the_file_and_the_client(bad, message):
    with pytest.raises(DataFileError, match=message) as raised:
        assemble_clients("t", [_block("a", "train", 2), bad], source="s", num_classes=4)
    assert "\n" not in str(raised.value)


def test_counts_that_disagree_with_the_data_are_an_error():
    blocks = [_block("a", "train", 2), _block("b", "train", 2)]
    with pytest.raises(DataFileError, match="holds 4 examples, but the file declares 5"):
        assemble_clients("t", blocks, source="s", counts={"train": 5})
    with pytest.raises(DataFileError, match="more than the 3 the file declares"):
        assemble_clients("t", blocks, source="s", counts={"train": 3})


def _federation(rng, num_ids=6, k=5):
    sizes = rng.integers(20, 40, size=num_ids)
    ids = np.repeat(np.arange(num_ids), sizes)
    labels = rng.integers(0, k, size=ids.size)
    test_sizes = rng.integers(31, 45, size=num_ids)
    test_ids = np.repeat(np.arange(num_ids), test_sizes)
    return ids, labels, test_ids, rng.integers(0, k, size=test_ids.size)


def test_a_target_group_trains_nobody_in_it_and_is_tested_on_its_own_examples(rng):
    ids, labels, test_ids, test_labels = _federation(rng)
    p = natural_partition(labels, test_labels, ids, target_client=[1, 4], seed=3,
                          num_classes=5, test_client_ids=test_ids)
    assert p.num_clients == 4
    own = np.flatnonzero(np.isin(test_ids, [1, 4]))
    np.testing.assert_array_equal(np.sort(p.target_test_indices), own)
    np.testing.assert_array_equal(np.sort(p.target_val_indices),
                                  np.flatnonzero(np.isin(ids, [1, 4])))
    target_counts = np.bincount(labels[np.isin(ids, [1, 4])], minlength=5)
    np.testing.assert_allclose(p.target_label_dist, target_counts / target_counts.sum())
    for i, g in enumerate([0, 2, 3, 5]):  # the others train, in id order
        np.testing.assert_array_equal(np.sort(p.client_example_indices(i)),
                                      np.flatnonzero(ids == g))
    assert "tested on its own" in p.description


def test_a_target_with_too_few_own_test_examples_is_refused(rng):
    ids, labels, test_ids, test_labels = _federation(rng)
    test_ids = test_ids.copy()
    test_ids[test_ids == 2] = 3
    with pytest.raises(ValueError, match=r"has 0 test examples of its own.*target_group"):
        natural_partition(labels, test_labels, ids, target_client=2, seed=0, num_classes=5,
                          test_client_ids=test_ids)


def test_target_group_patterns_match_names_and_an_unmatched_one_is_named():
    names = ["HAMLET/HAMLET", "HAMLET/OPHELIA", "KING_LEAR/KENT", "KING_LEAR/LEAR"]
    assert target_group_ids("HAMLET/*", names) == [0, 1]
    assert target_group_ids("KING_LEAR/KENT, HAMLET/OPHELIA", names) == [1, 2]
    with pytest.raises(ValueError, match=r"'MACBETH/\*' matches none of the 4 clients"):
        target_group_ids("MACBETH/*", names)


def test_a_reader_registration_resolves_the_natural_scheme_from_its_files(tmp_path, rng):
    ids, labels, test_ids, test_labels = _federation(rng)
    names = tuple(f"play{g // 2}/c{g}" for g in range(6))

    def load(data_dir, num_classes, input_shape):
        blocks = []
        for split, owners, ys in (("train", ids, labels), ("test", test_ids, test_labels)):
            for g in range(6):
                n = int(np.sum(owners == g))
                blocks.append(ClientExamples(names[g], split, np.full((n, 2), g / 255.0),
                                             ys[owners == g], str(data_dir)))
        return assemble_clients("toy_reader", blocks, source=str(data_dir), num_classes=5)

    def describe(path, values):
        return fjp.DataFacts(len(ids), 6, (2,), 5, client_names=names)

    fjp.register_reader("toy_reader", load, describe, lambda path: natural.check_path(path, "toy"),
                        label="Toy")
    try:
        config = {"dataset": {"name": "toy_reader", "data_dir": str(tmp_path)},
                  "partition": {"scheme": "natural", "target_group": "play1/*"}}
        resolved = fjp.validate_config(config)
        assert resolved.partition.num_clients == 5  # 4 train + the group of 2
        assert resolved.model == "logistic_regression"
        from fedjax_pals.experiment.task import load_data
        dataset, partition = load_data(resolved)
        assert dataset.train.x.dtype == np.uint8
        np.testing.assert_array_equal(
            np.sort(partition.target_test_indices), np.flatnonzero(np.isin(test_ids, [2, 3])))
        with pytest.raises(fjp.ConfigError, match=r"target_group 'play9/\*' matches none"):
            fjp.validate_config(
                {**config, "partition": {"scheme": "natural", "target_group": "play9/*"}})
        with pytest.raises(fjp.ConfigError, match="data_dir is None.*read from files"):
            fjp.validate_config({**config, "dataset": {"name": "toy_reader"}})
    finally:
        from fedjax_pals.data import datasets
        datasets._REGISTERED.pop("toy_reader", None)
        extensions.forget_registration("dataset", "toy_reader")


def test_float32_pixels_k_over_255_are_held_as_uint8_and_wide_integers_are_refused():
    pixels = np.arange(256)
    for x in ((pixels / 255).astype(np.float32), pixels.astype(np.float32) / np.float32(255)):
        d = assemble_clients("t", [ClientExamples("a", "train", x[:, None], pixels % 3, "f")],
                             source="s")
        assert d.train.x.dtype == np.uint8
        np.testing.assert_array_equal(d.train.x[:, 0], pixels)
    wide = ClientExamples("b", "train", np.array([[2**40]]), np.array([0]), "wide.sqlite")
    with pytest.raises(DataFileError, match=r"wide\.sqlite: client 'b'.s train inputs hold "
                                            r"1099511627776, outside int32"):
        assemble_clients("t", [wide], source="s")


def test_a_users_integer_inputs_without_a_scaling_still_train_as_floats_and_warn(rng):
    """Before, every split was float32: a user's loader of uint8 arrays and no input_scaling
    trained on their float values. It still does (the model sees x / 1.0), with a warning."""
    from fedjax_pals import deprecation
    from fedjax_pals.experiment.task import build_task

    x = rng.integers(0, 256, size=(400, 4)).astype(np.uint8)
    y = (x[:, 0] > 127).astype(np.int32)

    def load():
        split = fjp.LabeledSplit(x, y)
        return fjp.Dataset("uint8_blobs", split, split, num_classes=2, source="test")

    fjp.register_dataset("uint8_blobs", load, num_classes=2, num_train=400, images=False)
    try:
        with pytest.warns(deprecation.FedjaxPalsDeprecationWarning, match="InputScaling"):
            task = build_task({"dataset": {"name": "uint8_blobs"},
                               "partition": {"scheme": "dirichlet", "num_clients": 3}})
        seen = task.model.apply(task.model.init(__import__("jax").random.PRNGKey(0)), x[:3])
        assert task.model.input_dtype == "uint8" and seen.shape == (3, 2)
    finally:
        from fedjax_pals.data import datasets
        datasets._REGISTERED.pop("uint8_blobs", None)
        extensions.forget_registration("dataset", "uint8_blobs")


def test_uint8_is_scaled_as_pixels_only_for_images_and_bools_stay_zero_or_one():
    images = ClientExamples("a", "train", np.full((2, 4, 4), 255, np.uint8), np.zeros(2), "f")
    d = assemble_clients("t", [images], source="s")
    assert d.input_scaling == fjp.InputScaling(127.5, -1.0)
    flags = ClientExamples("a", "train", np.array([[True, False]]), np.zeros(1), "f")
    d = assemble_clients("t", [flags], source="s")
    assert d.train.x.dtype == np.uint8 and d.input_scaling == fjp.InputScaling(1.0)
    np.testing.assert_array_equal(d.model_inputs(d.train.x), [[1.0, 0.0]])
    codes = ClientExamples("a", "train", np.array([[1, 2, 3]], np.uint8), np.zeros(1), "f")
    d = assemble_clients("t", [codes], source="s")  # flat uint8 vectors: their values
    np.testing.assert_array_equal(d.model_inputs(d.train.x), [[1.0, 2.0, 3.0]])


def test_a_token_model_refuses_an_input_scaling():
    with pytest.raises(ValueError, match="takes int32 inputs, not the float32 an input scaling"):
        fjp.make_model("lstm_leaf", (3,), 80, input_scaling=fjp.InputScaling(127.5, -1.0))


@pytest.mark.parametrize("later, message", [
    (np.array([[3, 4, 5]], np.uint8), r"inputs are uint8, but the first client's are floats"),
    (np.array([[0.5, 0.2, 0.1]]), None),  # floats again: fine (dequantised)
])
def test_integers_after_quantised_floats_are_refused(later, message):
    blocks = [_block("a", "train", 2), ClientExamples("b", "train", later, np.zeros(1), "g")]
    if message is None:
        assert assemble_clients("t", blocks, source="s").train.x.dtype == np.float32
    else:
        with pytest.raises(DataFileError, match=message):
            assemble_clients("t", blocks, source="s")


def test_labels_beyond_int32_are_refused_not_wrapped():
    block = ClientExamples("a", "train", np.zeros((1, 3)), np.array([2**32 + 1]), "big.json")
    with pytest.raises(DataFileError, match=r"big\.json: client 'a' has train label 4294967297"):
        assemble_clients("t", [block], source="s")


def test_client_order_numbers_the_clients_as_the_header_lists_them():
    blocks = [_block("b", "train", 2), _block("a", "train", 3)]
    d = assemble_clients("t", blocks, source="s", client_order=("a", "b"))
    assert d.client_names == ("a", "b")
    np.testing.assert_array_equal(d.client_ids, [1, 1, 0, 0, 0])
    with pytest.raises(DataFileError, match="client 'c' is listed but has no training"):
        assemble_clients("t", blocks, source="s", client_order=("a", "b", "c"))


def test_a_data_set_without_a_test_split_is_refused_by_the_natural_scheme(rng):
    d = assemble_clients("t", [_block("a", "train", 40), _block("b", "train", 40)], source="s")
    assert d.test_client_ids is None and len(d.test) == 0
    with pytest.raises(ValueError, match="the data have no test split"):
        natural_partition(d.train.y, d.test.y, d.client_ids, target_client=0, seed=0,
                          num_classes=4, test_client_ids=d.test_client_ids)


def test_a_readers_recorded_config_digests_without_its_files(tmp_path):
    config = {"dataset": {"name": "leaf", "data_dir": str(tmp_path / "gone")},
              "partition": {"scheme": "natural", "num_clients": 7}}
    assert len(fjp.config_digest(config)) == 16
