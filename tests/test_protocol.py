"""The selection protocol on hand-made histories; the table's numbers against NumPy."""

import json

import numpy as np
import pytest

import fedjax_pals as fjp

from fedjax_pals.experiment import protocol
from fedjax_pals.experiment.protocol import RunRecord


def _results(val, test, f1=None, *, distance=0.0):
    rounds = list(range(1, len(val) + 1))
    return {
        "rounds": rounds,
        "val_accuracy": list(val),
        "target_accuracy": list(test),
        "target_macro_f1": list(f1 if f1 is not None else np.asarray(test) / 2),
        "projection_distance": distance,
    }


def _record(method, hparams, seed, val, test, row="FMNIST C=3", **kwargs):
    return RunRecord(row, method, tuple(hparams), seed, _results(val, test, **kwargs))


def test_early_stopping_reads_test_at_the_first_best_validation_round():
    point = protocol.best_val_point(_results([0.2, 0.9, 0.5, 0.9], [0.1, 0.7, 0.99, 0.8]))
    assert point == {
        "round": 2,
        "val_accuracy": 0.9,
        "target_accuracy": 0.7,
        "target_macro_f1": 0.35,
    }


def test_a_best_val_round_that_disagrees_with_the_history_is_refused():
    results = {**_results([0.2, 0.9], [0.1, 0.7]), "best_val_round": 1}
    with pytest.raises(ValueError, match="best_val_round 1 disagrees.*round 2"):
        protocol.best_val_point(results)


def _two_point_grid():
    # lr=0.1 wins on seed 0's validation but loses on the mean over seeds; lr=0.01 has the
    # best mean validation accuracy; lr=0.001 has the best TEST accuracy (must not matter).
    return [
        _record("fedprox", [("learning_rate", 0.1)], 0, [0.5, 0.95], [0.4, 0.60]),
        _record("fedprox", [("learning_rate", 0.1)], 1, [0.3, 0.40], [0.3, 0.35]),
        _record("fedprox", [("learning_rate", 0.01)], 0, [0.9, 0.80], [0.81, 0.5]),
        _record("fedprox", [("learning_rate", 0.01)], 1, [0.7, 0.85], [0.6, 0.77]),
        _record("fedprox", [("learning_rate", 0.001)], 0, [0.1, 0.20], [0.99, 0.99]),
        _record("fedprox", [("learning_rate", 0.001)], 1, [0.1, 0.20], [0.99, 0.99]),
    ]


def test_mean_over_seeds_selects_the_point_with_the_best_mean_validation_accuracy():
    table = protocol.protocol_table(_two_point_grid())
    cell = table["rows"][0]["cells"]["fedprox"]
    assert cell["selected"] == [["learning_rate", 0.01]]
    # Seed 0 stops at round 1 (val 0.9), seed 1 at round 2 (val 0.85).
    assert [p["round"] for p in cell["per_seed"]] == [1, 2]
    tests = np.array([0.81, 0.77])
    assert cell["mean"] == pytest.approx(tests.mean()) and cell["std"] == pytest.approx(tests.std())
    assert cell["target_macro_f1"]["mean"] == pytest.approx((tests / 2).mean())
    assert cell["val_accuracy"]["mean"] == pytest.approx(np.mean([0.9, 0.85]))
    mean_vals = {c["hparams"][0][1]: c["mean_val"] for c in cell["candidates"]}
    assert mean_vals == pytest.approx({0.1: 0.675, 0.01: 0.875, 0.001: 0.2})


def test_per_seed_selection_chooses_for_each_seed_on_its_own_validation():
    table = protocol.protocol_table(_two_point_grid(), selection="per_seed")
    cell = table["rows"][0]["cells"]["fedprox"]
    assert cell["selected"] == [[["learning_rate", 0.1]], [["learning_rate", 0.01]]]
    assert cell["mean"] == pytest.approx(np.mean([0.60, 0.77]))


def test_a_grid_point_missing_a_seed_is_not_eligible():
    records = [
        _record("fedavg", [("learning_rate", 0.1)], 0, [0.99], [0.9]),  # seed 1 failed
        _record("fedavg", [("learning_rate", 0.01)], 0, [0.5], [0.5]),
        _record("fedavg", [("learning_rate", 0.01)], 1, [0.6], [0.4]),
    ]
    cell = protocol.protocol_table(records)["rows"][0]["cells"]["fedavg"]
    assert cell["selected"] == [["learning_rate", 0.01]]
    assert [c["eligible"] for c in cell["candidates"]] == [False, True]


def test_ties_go_to_the_first_grid_point():
    records = [
        _record("fedavg", [("learning_rate", 0.1)], 0, [0.5], [0.1]),
        _record("fedavg", [("learning_rate", 0.01)], 0, [0.5], [0.9]),
    ]
    cell = protocol.protocol_table(records)["rows"][0]["cells"]["fedavg"]
    assert cell["selected"] == [["learning_rate", 0.1]]


def _table_1_records():
    rng = np.random.default_rng(0)
    records = []
    for row in ("FMNIST C=3", "FMNIST C=2"):
        for method in ("fedpals", "fedavg", "oracle"):
            for seed in range(3):
                test = rng.uniform(0.3, 0.99)
                records.append(_record(method, [], seed, [0.5], [test], row=row))
    return records


def test_the_table_holds_numpy_mean_and_std_and_the_markdown_shows_them():
    records = _table_1_records()
    table = protocol.protocol_table(
        records, paper={"FMNIST C=3": {"fedpals": (92.4, 2.1)}}, title="Table 1"
    )
    assert [r["row"] for r in table["rows"]] == ["FMNIST C=3", "FMNIST C=2"]
    assert table["methods"] == ["fedpals", "fedavg", "oracle"]
    text = protocol.table_markdown(table)
    assert "| data / split | FedPALS | FedAvg | Oracle |" in text
    assert "Macro-F1: the unweighted mean of each class's F1" in text  # defined where shown
    for row in table["rows"]:
        cells = []
        competitors = {}
        for method in ("fedpals", "fedavg", "oracle"):
            values = np.array(
                [
                    r.results["target_accuracy"][0]
                    for r in records
                    if r.row == row["row"] and r.method == method
                ]
            )
            assert row["cells"][method]["mean"] == pytest.approx(values.mean())
            assert row["cells"][method]["std"] == pytest.approx(values.std())
            cells.append(f"{100 * values.mean():.1f} ± {100 * values.std():.1f}")
            if method != "oracle":
                competitors[method] = values.mean()
        best = max(competitors, key=competitors.get)
        index = ["fedpals", "fedavg", "oracle"].index(best)
        cells[index] = f"**{cells[index]}**"  # the best non-oracle method is bold
        assert f"| {row['row']} | " + " | ".join(cells) + " |" in text
    assert "| ↳ paper | 92.4 ± 2.1 |  |  |" in text
    # A row of methods the paper does not have gets no line of empty cells.
    without = protocol.protocol_table(
        [r for r in records if r.method == "fedavg"], paper={"FMNIST C=3": {"fedpals": (92.4, 2.1)}}
    )
    assert "↳ paper" not in protocol.table_markdown(without)
    assert table["rows"][0]["paper"]["fedpals"] == pytest.approx({"mean": 0.924, "std": 0.021})
    assert "best mean-over-seeds validation accuracy" in text


def test_the_report_files_are_written(tmp_path):
    table = protocol.protocol_table(_table_1_records(), title="t")
    paths = protocol.write_protocol_report(str(tmp_path), table)
    assert set(paths) == {"markdown", "json", "comparison"}
    with open(paths["json"]) as f:
        assert json.load(f)["rows"][1]["row"] == "FMNIST C=2"
    assert (tmp_path / "table.md").read_text().startswith("**t**")
    assert (tmp_path / "comparison.png").stat().st_size > 1000


def test_merged_tables_keep_every_row_and_method():
    first = protocol.protocol_table([r for r in _table_1_records() if r.row == "FMNIST C=3"])
    second = protocol.protocol_table(
        [r for r in _table_1_records() if r.row == "FMNIST C=2" and r.method != "oracle"]
    )
    merged = protocol.merge_tables([second, first])
    assert [r["row"] for r in merged["rows"]] == ["FMNIST C=2", "FMNIST C=3"]
    assert merged["methods"] == ["fedpals", "fedavg", "oracle"]
    assert "| FMNIST C=2 |" in protocol.table_markdown(merged)
    with pytest.raises(ValueError, match="different selection rules"):
        protocol.merge_tables([first, {**second, "selection": "per_seed"}])


def test_tables_of_one_row_merge_into_one_row_with_the_methods_of_both():
    records = [r for r in _table_1_records() if r.row == "FMNIST C=3"]
    grid = protocol.protocol_table([r for r in records if r.method != "oracle"])
    extra = protocol.protocol_table([r for r in records if r.method == "oracle"])
    merged = protocol.merge_tables([grid, extra])
    assert [r["row"] for r in merged["rows"]] == ["FMNIST C=3"]
    alone = protocol.protocol_table(records)
    assert merged["rows"][0]["cells"] == alone["rows"][0]["cells"]
    with pytest.raises(
        ValueError, match=r"methods \['fedavg', 'fedpals'\] appear in more than one"
    ):
        protocol.merge_tables([grid, grid])
    other_seeds = protocol.protocol_table([r for r in records if r.method == "oracle" and r.seed])
    with pytest.raises(ValueError, match="different seeds"):
        protocol.merge_tables([grid, other_seeds])


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="selection must be one of"):
        protocol.protocol_table(_two_point_grid(), selection="best")
    duplicate = _two_point_grid()[:1] * 2
    with pytest.raises(ValueError, match="two runs for row 'FMNIST C=3', method 'fedprox'"):
        protocol.protocol_table(duplicate)
    with pytest.raises(ValueError, match="no finite validation accuracy"):
        protocol.best_val_point(_results([float("nan")], [0.5]))


def test_a_table1_row_is_sparsity_or_dirichlet_and_carries_the_papers_numbers():
    config = fjp.table1_config("fashion_mnist", labels_per_client=2)
    assert config.sweep.row == "Fashion-MNIST C=2" and config.partition.scheme == "sparsity"
    assert config.sweep.paper.to_dict() == dict(fjp.experiment.protocol.PAPER_TABLE_1["Fashion-MNIST C=2"])
    assert fjp.table1_config("cifar10", dirichlet_beta=0.1).sweep.row == "CIFAR-10 beta=0.1"
    with pytest.raises(ValueError, match="give labels_per_client .* or dirichlet_beta, not both"):
        fjp.table1_config("cifar10", labels_per_client=3, dirichlet_beta=0.1)


# -- a method's declared grid and the sweep ----------------------------------------------------


def _grid_sweep(grid, methods=("fedavg", "fedprox", "fedprox_fedpals"), **sweep):
    return {
        "dataset": {"name": "synthetic"},
        "sweep": {"seeds": (0,), "methods": methods, "grid": grid, **sweep},
    }


def _grid_warnings(caplog):
    messages = [r.getMessage() for r in caplog.records]
    return [m for m in messages if "without the grid its method" in m]


def test_a_protocol_sweep_without_a_methods_declared_grid_warns_once_per_method_how_to_add_it(
    caplog, monkeypatch
):
    monkeypatch.setattr(protocol, "_WARNED_GRIDS", set())
    config = _grid_sweep({"training": {"learning_rate": (0.1, 0.01)}})
    with caplog.at_level("WARNING"):
        names = [name for name, _ in fjp.expand_sweep(config)]
        fjp.expand_sweep(config)  # expanded again (listing, shards): no second warning
    # The declared grid is not tried: only the sweep's own grid spans the runs.
    assert not any("prox_mu" in name for name in names)
    fedprox, combined = _grid_warnings(caplog)
    declared = fjp.get_method("fedprox").grid["prox_mu"]
    assert fedprox.startswith("the sweep selects fedprox without") and "fedprox_fedpals" in combined
    for line in (fedprox, combined):
        assert f"prox_mu={declared}" in line and "runs use prox_mu=0.01 only" in line
        assert f"config.sweep.grid.algorithm.prox_mu = {declared}" in line
        assert "fjp.protocol_grid()" in line and "\n" not in line


@pytest.mark.parametrize(
    "grid, extra",
    [
        ({"algorithm": {"prox_mu": (0.01, 1.0)}}, {}),  # the sweep names the key
        ({"training": {"learning_rate": (0.1,)}}, {"protocol": False}),  # nothing is selected
        ("protocol_grid", {}),  # every registered method's grid
    ],
)
def test_no_grid_warning_when_the_sweep_names_the_key_selects_nothing_or_uses_the_protocol_grid(
    caplog, monkeypatch, grid, extra
):
    monkeypatch.setattr(protocol, "_WARNED_GRIDS", set())
    if grid == "protocol_grid":
        grid = fjp.protocol_grid().to_dict()
    with caplog.at_level("WARNING"):
        methods = ("fedprox", "fedprox_fedpals", "fedavg")
        fjp.expand_sweep(_grid_sweep(grid, methods=methods, **extra))
    assert _grid_warnings(caplog) == []


def test_ignored_method_grids_names_each_left_out_key_with_the_value_the_runs_use():
    methods = {
        "fedprox": ("fedprox", {"prox_mu": 0.1}),
        "scaffold": ("scaffold", {"server_lr": 1.0}),
        "fedavg": ("fedavg", {}),
        "mine": ("not_registered", {}),
    }
    named = {"algorithm.server_lr", "training.learning_rate"}
    declared = fjp.get_method("fedprox").grid["prox_mu"]
    assert protocol.ignored_method_grids(methods, named) == {"fedprox": {"prox_mu": (declared, 0.1)}}


@pytest.mark.parametrize("seed", [0, 1])
def test_paired_differences_are_scipys_paired_t_test_on_the_selected_runs(seed, tmp_path):
    from scipy import stats

    rng = np.random.default_rng(seed)
    seeds = list(range(6))
    test = {m: rng.uniform(0.3, 0.95, size=(2, len(seeds))) for m in ("fedpals", "fedavg", "x")}
    records = []
    for method, by_point in test.items():
        for point, lr in enumerate((0.1, 0.01)):
            for s in seeds:
                # Validation favours the second point for "x" only: its cell is that point's.
                val = 0.5 + 0.1 * (point if method == "x" else -point)
                records.append(_record(method, [("learning_rate", lr)], s, [val],
                                       [by_point[point, s]]))
    # fedavg's first point lacks seed 5, so it is not eligible: its second point is selected.
    records = [r for r in records if not (r.method == "fedavg" and r.seed == 5
                                          and r.hparams == (("learning_rate", 0.1),))]
    table = protocol.protocol_table(records)
    pairs = {p["method"]: p for p in protocol.paired_differences(table, "fedpals")}
    assert set(pairs) == {"fedavg", "x"}
    expected_point = {"fedpals": 0, "fedavg": 1, "x": 1}
    reference = test["fedpals"][expected_point["fedpals"]]
    for method, pair in pairs.items():
        d = 100 * (test[method][expected_point[method]] - reference)  # float64, by seed
        assert pair["seeds"] == seeds
        np.testing.assert_allclose(pair["differences"], d, rtol=1e-12)
        assert pair["mean"] == pytest.approx(d.mean(), rel=1e-12)
        assert pair["std"] == pytest.approx(d.std(ddof=1), rel=1e-12)
        assert (pair["ahead"], pair["behind"]) == ((d > 0).sum(), (d < 0).sum())
        reference_p = stats.ttest_rel(100 * test[method][expected_point[method]],
                                      100 * reference).pvalue
        assert pair["p"] == pytest.approx(reference_p, rel=1e-9)
    text = protocol.write_paired_report(str(tmp_path), table, "fedpals")
    assert (tmp_path / "paired.md").read_text() == text + "\n"
    assert json.loads((tmp_path / "paired.json").read_text())[0]["method"] == "fedavg"
    line = next(line for line in text.splitlines() if "| x |" in line)
    assert f"{pairs['x']['mean']:+.1f}" in line and f"{pairs['x']['p']:.2g}" in line


def test_paired_differences_name_a_missing_reference_and_say_nothing_of_equal_differences():
    records = [_record(m, [], s, [0.5], [acc]) for m, accs in
               (("fedpals", (0.5, 0.6)), ("fedavg", (0.4, 0.5))) for s, acc in enumerate(accs)]
    table = protocol.protocol_table(records)
    with pytest.raises(ValueError, match="'oracle' is not in the table"):
        protocol.paired_differences(table, "oracle")
    (pair,) = protocol.paired_differences(table, "fedpals")
    assert pair["differences"] == pytest.approx([-10.0, -10.0])
    assert pair["std"] == pytest.approx(0.0, abs=1e-12) and pair["p"] is None
    (single,) = protocol.paired_differences(
        protocol.protocol_table([r for r in records if r.seed == 0]), "fedpals")
    assert single["std"] is None and single["p"] is None


def test_paired_markdown_says_so_where_two_cells_share_no_seed():
    # protocol_table selects only cells holding all of their row's seeds; a table built by
    # hand (paired_differences takes any) need not.
    def cell(seeds, accuracy):
        return {"selected": {}, "per_seed": [{"seed": s, "target_accuracy": accuracy}
                                             for s in seeds]}

    table = {"methods": ["fedpals", "fedavg"], "labels": {"fedavg": "FedAvg"},
             "rows": [{"row": "r", "cells": {"fedpals": cell((0, 1), 0.6),
                                             "fedavg": cell((2, 3), 0.4)}}]}
    (pair,) = protocol.paired_differences(table, "fedpals")
    assert pair["seeds"] == [] and pair["mean"] is None and pair["p"] is None
    line = protocol.paired_markdown([pair], "FedPALS").splitlines()[-1]
    assert line.endswith("| - | - | 0 / 0 | - | no seed in common |"), line
