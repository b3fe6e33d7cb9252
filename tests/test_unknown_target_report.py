"""experiments.unknown_target_report: the three stopping rules, the L1 columns, the unused
re-estimations and the worst seed against FedAvg, from a sweep directory's results.json files."""

import json
import os

import numpy as np
import pytest

from experiments import unknown_target_report as report_lib

ROUNDS = [1, 2, 3, 4, 5]


def _write(root, method, seed, accuracy, val_best, estimated=None, l1=None, used=None,
           algorithm=None, target=None):
    run = os.path.join(root, "runs", method, "lam=0,learning_rate=0.1", f"seed_{seed}")
    os.makedirs(run)
    results = {
        "config": {"seed": seed, "training": {"rounds": ROUNDS[-1]}, "algorithm": algorithm or {}},
        "partition": {"target_label_dist": target},
        "rounds": ROUNDS,
        "target_accuracy": accuracy,
        "final_target_accuracy": accuracy[-1],
        "target_accuracy_at_best_val": accuracy[val_best],
    }
    if estimated is not None:
        results["target_estimation_history"] = [
            {"round": r, "estimated_accuracy": e, "target_l1_error": d}
            for r, e, d in zip(ROUNDS, estimated, l1)
        ]
        results["target_estimation_records"] = [
            {"round": r, "used": u, "estimate_l1_error": d / 2}
            for r, u, d in zip(ROUNDS[:-1], used, l1)
        ]
    with open(os.path.join(run, "results.json"), "w") as f:
        json.dump(results, f)


@pytest.fixture
def sweep(tmp_path):
    root = str(tmp_path / "sweep")
    _write(root, "fedavg", 0, [0.5, 0.6, 0.6, 0.7, 0.7], 3)
    _write(root, "fedavg", 1, [0.4, 0.5, 0.6, 0.6, 0.65], 4)
    _write(root, "fedpals", 0, [0.8, 0.9, 0.9, 0.95, 0.94], 3)
    _write(root, "fedpals", 1, [0.7, 0.8, 0.9, 0.9, 0.92], 4)
    # Estimated accuracy peaks at round 3 for seed 0 and ties at rounds 2 and 4 for seed 1
    # (the later wins).
    _write(root, "unknown_t_x", 0, [0.5, 0.7, 0.9, 0.8, 0.85], 2,
           estimated=[0.5, 0.8, 0.95, 0.9, 0.9], l1=[1.2, 0.4, 0.2, 0.1, 0.05],
           used=[True, False, True, True])
    _write(root, "unknown_t_x", 1, [0.4, 0.6, 0.7, 0.75, 0.55], 3,
           estimated=[0.5, 0.9, 0.8, 0.9, 0.7], l1=[1.0, 0.6, 0.4, 0.3, 0.15],
           used=[False, False, True, True])
    return root


def test_the_report_has_each_stopping_rule_and_the_estimates_errors(sweep):
    text = report_lib.report(sweep)
    row = next(line for line in text.splitlines() if line.startswith("| unknown_t_x"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # validation labels: seeds 0.9 and 0.75; last round: 0.85 and 0.55; estimated accuracy:
    # round 3 (0.9) and round 4 (0.75, the later of the tie).
    expected = [np.mean([0.9, 0.75]), np.mean([0.85, 0.55]), np.mean([0.9, 0.75])]
    stds = [np.std([0.9, 0.75]), np.std([0.85, 0.55]), np.std([0.9, 0.75])]
    for cell, mean, std in zip(cells[2:5], expected, stds):
        assert cell == f"{100 * mean:.1f} ± {100 * std:.1f}"
    assert cells[5] == f"{np.mean([0.1, 0.3]):.3f} ± {np.std([0.1, 0.3]):.3f}"  # round 4
    assert cells[6] == f"{np.mean([0.05, 0.15]):.3f} ± {np.std([0.05, 0.15]):.3f}"  # round 5
    assert cells[7] == "3 / 8"
    assert cells[8] == "-"  # runs written before the identifiability flag
    # Worst seed against FedAvg, stopped by validation labels: seed 1, 0.75 - 0.65.
    assert cells[9] == "+10.0 (seed 1)"
    fedavg = next(line for line in text.splitlines() if line.startswith("| FedAvg"))
    fedavg_cells = [c.strip() for c in fedavg.strip("|").split("|")]
    assert fedavg_cells[4] == "-" and fedavg_cells[9] == "-"  # no T^, no FedAvg to compare
    assert os.path.exists(os.path.join(sweep, "unknown_target.png"))
    assert os.path.exists(os.path.join(sweep, "unknown_target.pdf"))
    with open(os.path.join(sweep, "unknown_target.md")) as f:
        assert f.read() == text
    # Per seed: the labels (which may hold commas) separated as the values are.
    header = next(line for line in text.splitlines() if line.startswith("Per seed"))
    assert header.endswith(": FedAvg / FedPALS / unknown_t_x:")
    assert "- seed 1: 65.0 / 92.0 / 75.0" in text


def test_the_report_measures_each_seed_against_t_known_and_fedavg(sweep):
    # Gaps to T known (validation labels): seed 0: 0.9 - 0.95, seed 1: 0.75 - 0.92; seed 1
    # is 17 points below (more than 5) and above FedAvg's 0.65; seed 0 above FedAvg's 0.7.
    _write(sweep, "unknown_t_z", 0, [0.5, 0.6, 0.6, 0.6, 0.6], 1, estimated=[0.5] * 5,
           l1=[1.0, 0.9, 0.8, 0.7, 0.6], used=[True] * 4)
    text = report_lib.report(sweep)
    table = text[text.index("Against FedPALS with T known"):]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| unknown_t")}
    # The estimate's own L1 from the model after round 4: half the L1 given at index 3.
    assert rows["unknown_t_x"][1:] == ["2", f"{100 * np.mean([-0.05, -0.17]):+.1f}",
                                       "-17.0 (seed 1)", "1", "0", "-",
                                       f"{np.mean([0.05, 0.15]):.3f} ± {np.std([0.05, 0.15]):.3f}"]
    # unknown_t_z, seed 0 only: 0.6 against T known's 0.95 and FedAvg's 0.7.
    assert rows["unknown_t_z"][1:] == ["1", "-35.0", "-35.0 (seed 0)", "1", "1 (seeds 0)", "-",
                                       "0.350 ± 0.000"]
    with open(os.path.join(sweep, "unknown_target_l1.md")) as f:
        l1 = f.read()
    assert "| 1 | 1.000 | 0.600 | 0.400 | 0.300 | 0.150 |" in l1  # unknown_t_x, seed 1
    assert os.path.exists(os.path.join(sweep, "unknown_target_gaps.png"))
    assert os.path.exists(os.path.join(sweep, "unknown_target_gaps.pdf"))


def test_a_yardstick_row_given_a_noisy_t_is_measured_against_t_known_with_that_ts_error(sweep):
    # T known up to App. B.6's noise: no estimation history, but a row of the table against T
    # known, its L1 column the noisy T's error (the same in every round). A baseline with
    # neither (here: a second FedAvg) gets no row.
    target = np.array([0.0, 0.5, 0.0, 0.25, 0.25])
    for seed, accuracy in ((0, [0.8, 0.9, 0.9, 0.93, 0.9]), (1, [0.7, 0.8, 0.9, 0.92, 0.95])):
        _write(sweep, "known_t_noise", seed, accuracy, 3,
               algorithm={"target_perturbation": 0.01}, target=target.tolist())
        _write(sweep, "fedavg_again", seed, [0.5] * 5, 3, algorithm={"target_perturbation": None})

    def noisy(seed):  # App. B.6: normalise(T + delta max(eps, 0)), eps from the seed's stream
        eps = np.random.default_rng([seed, 0x7E57]).standard_normal(target.size)
        t = target + 0.01 * np.maximum(eps, 0.0)
        return t / t.sum()

    text = report_lib.report(sweep)
    table = text[text.index("Against FedPALS with T known"):]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| ")}
    assert "fedavg_again" not in rows
    errors = [np.abs(noisy(s) - target).sum() for s in (0, 1)]
    assert min(errors) > 0
    # Gaps (validation labels): seed 0: 0.93 - 0.95, seed 1: 0.92 - 0.92.
    assert rows["known_t_noise"][1:] == ["2", f"{100 * np.mean([-0.02, 0.0]):+.1f}",
                                         "-2.0 (seed 0)", "0", "0", "-",
                                         f"{np.mean(errors):.3f} ± {np.std(errors):.3f}"]


def test_a_run_that_estimates_once_before_round_1_reports_that_estimates_error(sweep):
    # FedAvg trained first: one estimate, before round 1 (round 0), in use throughout.
    for seed in (0, 1):
        _write(sweep, "unknown_t_once", seed, [0.6, 0.7, 0.8, 0.9, 0.9], 3,
               estimated=[0.9] * 5, l1=[0.2] * 5, used=[True])
        path = os.path.join(sweep, "runs", "unknown_t_once", "lam=0,learning_rate=0.1",
                            f"seed_{seed}", "results.json")
        with open(path) as f:
            results = json.load(f)
        results["target_estimation_records"] = [
            {"round": 0, "used": True, "estimate_l1_error": 0.05 * (seed + 1)}]
        with open(path, "w") as f:
            json.dump(results, f)
    text = report_lib.report(sweep)
    table = text[text.index("Against FedPALS with T known"):]
    row = next(line for line in table.splitlines() if line.startswith("| unknown_t_once"))
    assert row.strip("|").split("|")[-1].strip() == (
        f"{np.mean([0.05, 0.1]):.3f} ± {np.std([0.05, 0.1]):.3f}")


def _mark_unidentified(sweep, method, seed, rounds, *, listed=True, last_identified=None):
    """Records of `rounds` not identified (sigma_min < 1e-4), the others identified; with
    `listed`, results.json's target_estimation_unidentified_rounds as well (a run written
    with the flag); else only the records say (the list is reconstructed from them)."""
    path = os.path.join(sweep, "runs", method, "lam=0,learning_rate=0.1", f"seed_{seed}",
                        "results.json")
    with open(path) as f:
        results = json.load(f)
    for record in results["target_estimation_records"]:
        record["identified"] = record["round"] not in rounds
    if listed:
        results["target_estimation_unidentified_rounds"] = list(rounds)
        results["target_estimate_identified"] = last_identified
    with open(path, "w") as f:
        json.dump(results, f)


def test_the_report_counts_the_re_estimations_not_identified_per_run_and_per_method(sweep):
    # unknown_t_x: seed 0 not identified before rounds 2 and 3 (its last estimate used, of
    # round 4, identified), seed 1 never; unknown_t_w: seed 0 before round 4 only, recorded in
    # the records alone (a run written before the list), seed 1 before round 1, the last used
    # not identified.
    _mark_unidentified(sweep, "unknown_t_x", 0, [2, 3], last_identified=True)
    _mark_unidentified(sweep, "unknown_t_x", 1, [], last_identified=True)
    for seed in (0, 1):
        _write(sweep, "unknown_t_w", seed, [0.5, 0.7, 0.9, 0.8, 0.85], 2,
               estimated=[0.5] * 5, l1=[1.0, 0.8, 0.6, 0.4, 0.2], used=[True] * 4)
    _mark_unidentified(sweep, "unknown_t_w", 0, [4], listed=False)
    _mark_unidentified(sweep, "unknown_t_w", 1, [1], last_identified=False)
    text = report_lib.report(sweep)
    table = text[:text.index("Per seed")]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
             for line in table.splitlines() if line.startswith("| unknown_t")}
    assert table.splitlines()[2].split("|")[9].strip() == (
        "not identified / re-estimations (runs)")
    assert cells["unknown_t_x"][8] == "2 / 8 (1 of 2 runs)"
    assert cells["unknown_t_w"][8] == "2 / 8 (2 of 2 runs)"
    assert ("- unknown_t_x: seed 0: 2 (rounds 2, 3); seed 1: 0") in text
    assert ("- unknown_t_w: seed 0: 1 (rounds 4); seed 1: 1 (rounds 1), last used not "
            "identified") in text
    against = text[text.index("Against FedPALS with T known"):]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in against.splitlines() if line.startswith("| unknown_t")}
    assert rows["unknown_t_x"][6] == "1 (seeds 0)"
    assert rows["unknown_t_w"][6] == "2 (seeds 0, 1)"


def test_without_fedavg_runs_the_below_fedavg_column_says_nothing(sweep):
    # A sweep without FedAvg (only T known and the estimated rows): "-", not 0 seeds below it.
    import shutil

    shutil.rmtree(os.path.join(sweep, "runs", "fedavg"))
    text = report_lib.report(sweep)
    against = text[text.index("Against FedPALS with T known"):]
    row = next(line for line in against.splitlines() if line.startswith("| unknown_t_x"))
    assert [c.strip() for c in row.strip("|").split("|")][5] == "-"


def test_a_seed_counts_below_fedavg_only_where_t_known_leads_fedavg_by_more_than_3_points(
        tmp_path):
    root = str(tmp_path / "sweep")
    # Seed 0: T known leads FedAvg by 20 and the estimate ends 10 under FedAvg: counted.
    # Seed 1: T known leads by 2 and the estimate ends 1 under FedAvg: not counted.
    # Seed 2: T known leads by 4 and the estimate ends level with FedAvg: not counted.
    for seed, (fedavg, known, estimated) in enumerate(
            [(0.6, 0.8, 0.5), (0.5, 0.52, 0.49), (0.5, 0.54, 0.5)]):
        _write(root, "fedavg", seed, [0.3, fedavg, 0.3, 0.3, 0.3], 1)
        _write(root, "fedpals", seed, [0.3, known, 0.3, 0.3, 0.3], 1)
        _write(root, "unknown_t_x", seed, [0.3, estimated, 0.3, 0.3, 0.3], 1,
               estimated=[0.5] * 5, l1=[0.5] * 5, used=[True] * 4)
    text = report_lib.report(root)
    against = text[text.index("Against FedPALS with T known"):]
    assert "seeds below FedAvg (where T known leads it by more than 3)" in against
    row = next(line for line in against.splitlines() if line.startswith("| unknown_t_x"))
    assert [c.strip() for c in row.strip("|").split("|")][5] == "1 (seeds 0)"


def test_a_run_still_training_is_left_out(sweep):
    _write(sweep, "unknown_t_y", 0, [0.5, 0.6], 1, estimated=[0.5, 0.6], l1=[1.0, 0.5],
           used=[True])
    path = os.path.join(sweep, "runs", "unknown_t_y", "lam=0,learning_rate=0.1", "seed_0",
                        "results.json")
    with open(path) as f:
        results = json.load(f)
    results["rounds"] = ROUNDS[:2]  # two evaluations of five so far
    with open(path, "w") as f:
        json.dump(results, f)
    assert "unknown_t_y" not in report_lib.report(sweep)


def test_an_empty_sweep_directory_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no finished run"):
        report_lib.report(str(tmp_path))


def _split_by_seed(sweep, tmp_path):
    """The fixture's sweep as two sweeps of one seed each (chunks/s0, chunks/s1), each with the
    sweep.json of the row."""
    import shutil

    chunks = tmp_path / "chunks"
    for seed in (0, 1):
        shutil.copytree(sweep, chunks / f"s{seed}")
        for run in (chunks / f"s{seed}").glob(f"runs/*/*/seed_{1 - seed}"):
            shutil.rmtree(run)
        (chunks / f"s{seed}" / "sweep.json").write_text(
            json.dumps({"sweep": {"row": "Fashion-MNIST C=2"}}))
    return chunks


def test_a_pattern_of_sweeps_over_different_seeds_reports_as_one_sweep(sweep, tmp_path):
    chunks = _split_by_seed(sweep, tmp_path)
    with open(os.path.join(sweep, "sweep.json"), "w") as f:
        json.dump({"sweep": {"row": "Fashion-MNIST C=2"}}, f)
    whole = report_lib.report(sweep)
    pattern = str(chunks / "s*")
    assert report_lib.sweep_dirs(pattern) == [str(chunks / "s0"), str(chunks / "s1")]
    out = report_lib.output_dir(pattern, str(tmp_path / "report"))
    assert out == str(tmp_path / "report" / "s")
    merged = report_lib.report(pattern, out)
    assert merged == whole.replace(f"({sweep})", f"({pattern})")
    for name in ("unknown_target.md", "unknown_target_l1.md", "unknown_target.png",
                 "unknown_target_gaps.png"):
        assert os.path.exists(os.path.join(out, name)), name
    assert not os.path.exists(chunks / "s0" / "unknown_target.md")  # the chunks stay as run
    assert report_lib.output_dir(sweep, str(tmp_path / "report")) == sweep
    with pytest.raises(ValueError, match="needs an out_dir"):
        report_lib.report(pattern)


def test_a_pattern_refuses_overlapping_seeds_other_rows_and_no_match(sweep, tmp_path):
    import shutil

    chunks = _split_by_seed(sweep, tmp_path)
    with pytest.raises(SystemExit, match="matches no directory"):
        report_lib.report(str(tmp_path / "nothing_*"), str(tmp_path / "out"))
    (chunks / "s1" / "sweep.json").write_text(json.dumps({"sweep": {"row": "Fashion-MNIST C=3"}}))
    with pytest.raises(SystemExit, match="different rows"):
        report_lib.report(str(chunks / "s*"), str(tmp_path / "out"))
    shutil.rmtree(chunks / "s1")
    shutil.copytree(sweep, chunks / "s1")  # seed 0 again, beside s0's
    with pytest.raises(SystemExit, match="fedavg, seed 0: finished in both"):
        report_lib.report(str(chunks / "s*"), str(tmp_path / "out"))
