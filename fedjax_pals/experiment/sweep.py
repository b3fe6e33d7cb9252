"""Sweeps: a base config plus `config.sweep` naming its axes, expanded into runs and executed.

A sweep config is a run config (see `fedjax_pals.experiment.config`) with a `sweep` section:

    sweep.row       label of the table row, e.g. "Fashion-MNIST C=3" (default: from the data set
                    and partition)
    sweep.seeds     tuple of seeds, e.g. (0, ..., 7): every grid point runs once per seed
    sweep.methods   tuple of method keys (columns of the table): what config.algorithm.name
                    accepts (an algorithm; "<client-side method>_fedpals", e.g. the paper's
                    FedProx+FedPALS fedprox_fedpals; a variant such as fedpals_adaptive or
                    fedpals_unknown_t_<estimator>, fjp.register_variant; see config.py), or a
                    server optimiser before any of these: "<optimizer>_<method>" sets
                    server.optimizer (fedadam_fedpals: FedPALS' weights, FedAdam's server
                    step), a bare "<optimizer>" is FedAvg with it (fedavgm, fedadam, fedyogi,
                    fedadagrad: Reddi et al.'s methods). Default: the base config's algorithm.
    sweep.grid      nested like the config, tuples at the leaves: hyperparameters to select on
                    the target validation set, e.g. grid.training.learning_rate = (0.1, 0.01).
                    A grid key that a method does not use (validate_config resolves it to None,
                    e.g. prox_mu for FedAvg) is dropped for that method, so each method runs
                    only its own grid. grid.algorithm.lam and grid.algorithm.ess_fraction are
                    the two ways to give FedPALS' lambda and form ONE axis, concatenated, not
                    crossed: lam = (0.0,) with ess_fraction = (0.1, 0.25, 0.5, 0.75) is the
                    paper's grid "lambda -> 0+ and ESS 10/25/50/75 % of N" (App. B.3).
                    Only what is named here is tried, not a method's registered `Method.grid`
                    (see `protocol.ignored_method_grids`: a protocol sweep warns of those).
    sweep.axes      nested like the config, tuples at the leaves: task axes. Each combination is
                    its own table row (e.g. axes.dataset.synthetic_delta, Fig. 9); nothing is
                    selected across rows.
    sweep.zip_axes  False: rows are the cartesian product of the axes; True: the axes are zipped
                    (equal lengths), e.g. local_epochs with rounds = 150 / E (Fig. 8b).
    sweep.protocol  True: after the runs, select per method on the validation set and write the
                    Table-1-shaped report (`protocol.py`): table.md, table.json, comparison.png.
    sweep.selection "mean_over_seeds" (default) or "per_seed" (see `protocol.py`).
    sweep.paper     optional: method -> (mean %, std %) of the paper, shown beside ours
                    (single-row sweeps).
    sweep.figures   extra figures: "curves" (accuracy per round of each selected method, mean
                    +- std over seeds, per row), "weights" (FedPALS' alpha per lambda vs FedAvg,
                    Fig. 4 kind, per row, first seed), "accuracy_vs_distance" (Fig. 9),
                    "accuracy_vs_axis" (each selected method's accuracy against the task axis
                    `sweep.x_axis`, one line per value of the other axes: accuracy vs epsilon,
                    vs E, vs the number of clients), "lambda_trajectories" (lambda per round of
                    the fedpals_adaptive runs, per row).
    sweep.x_axis    the leaf name of the task axis that "accuracy_vs_axis" puts on the x axis
                    (default: the first axis).
    sweep.each_client  False | True: every training client as its own target. A method whose
                    server weights use T (FedPALS' lambda resolves to a value) runs once per
                    training client j with evaluation.client_as_target = j (T = S_j, tested on
                    j's own examples; runs `.../client_<j>/seed_<s>`, on the runs axis in blocks
                    like any grid); the others run once, their global model evaluated on every
                    client. Every run evaluates per client (evaluation.per_client). Instead of
                    the protocol's table (sweep.protocol must be False, its default here), the
                    per-client report (`per_client_report.py`): per_client_table.md / .json and
                    per_client_cdf.png.

Every run's config is validated before any run starts (a bad value fails in well under 2 s,
naming the run and the key). Run r goes to `<workdir>/runs/<name>/`, its name
`[<row axes>/]<method>/[<grid point>/]seed_<s>`. A sweep is resumable: a run whose
results.json has the run's config digest and its last round is skipped; the others are
(re)started and resume from their own checkpoints. A run that raises does not stop the sweep:
"diverged" (TrainingDivergedError) and "unreachable" (an ESS fraction out of reach for that
partition) are outcomes of a grid, that point is just not eligible for selection; anything else
is "failed" and reported (traceback in the run's error.txt). A run whose workdir another
process holds (e.g. an `experiments.run` on it) is "busy": not a failure, and nothing is
written into it.

One sweep at a time per workdir: the sweep holds `<workdir>/.sweep.lease` (a lease that holds on
a shared file system, `locks.Lease`) while it runs, and a second sweep on the same workdir fails
at once, naming the holder's pid and host. To spread one sweep over many jobs and hosts, split
it into shards (`shards.py`: `run_shard`, then `collect_sweep`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import os
import traceback
from typing import Any, Callable, Mapping, Sequence

import ml_collections

from fedjax_pals import extensions
from fedjax_pals.algorithms import registry
from fedjax_pals.data import dataset_label, registered_partitions
from fedjax_pals.experiment import config as config_lib
from fedjax_pals.experiment import train as train_lib
from fedjax_pals.experiment import locks
from fedjax_pals.experiment import protocol as protocol_lib
from fedjax_pals.experiment.interruption import ACTIVITY
from fedjax_pals.experiment.progress import Progress, percent
from fedjax_pals.experiment.workdir import RESULTS_FILE, WorkdirLockedError, write_json
from fedjax_pals.runtime import is_main_process

ConfigError = config_lib.ConfigError

SWEEP_KEYS = (
    "row", "seeds", "methods", "grid", "axes", "zip_axes", "protocol", "selection", "paper",
    "figures", "x_axis", "each_client",
)
FIGURES = ("curves", "weights", "accuracy_vs_distance", "accuracy_vs_axis", "lambda_trajectories")
# How a run that returned no results ended (see `_failure_status`).
FAILURE_STATUSES = ("diverged", "unreachable", "failed", "busy")
# Held while a sweep runs in its workdir.
# (Not ".sweep.lock": workdirs of earlier versions hold an fcntl lock file of that name.)
SWEEP_LOCK_FILE = ".sweep.lease"
# Where a sharded sweep records its split (`shards.py`): an unsharded sweep refuses such a workdir.
SHARDS_DIR = "shards"
SHARD_PLAN = os.path.join(SHARDS_DIR, "plan.json")
# The user's modules that the sweep's runs need (`ExpandedSweep.imports`).
IMPORTS_FILE = "sweep_imports.json"
# The evaluation keys that only personalisation uses (None in a run without it).
PERSONALIZATION_KEYS = ("personalization", "fine_tuning_steps", "fine_tuning_learning_rates",
                        "ditto_lams", "local_steps")
# Keys that are not hyperparameters or task axes of a sweep (nor is the engine).
_NOT_AXES = ("seed", "algorithm.name", "algorithm.weights", "server.optimizer")


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its name, where it sits in the sweep, its config."""

    name: str
    row: str
    method: str
    hparams: tuple  # ((leaf name, value), ...) of the grid point
    seed: int
    config: dict  # the run's config as nested dicts (unresolved; no `sweep` section)
    resolved: dict  # validate_config(config), as nested dicts
    digest: str  # config_digest(config)
    client: int | None = None  # sweep.each_client: the training client that is its target


# -- the sweep section ------------------------------------------------------------------------


def _nonempty_tuple(key: str, values: Any, what: str) -> tuple:
    """`values` (a tuple or a list) as a non-empty tuple; else a ConfigError naming the key."""
    if isinstance(values, list):
        values = tuple(values)
    if not isinstance(values, tuple) or not values:
        raise ConfigError(
            f"config.sweep.{key} must be a non-empty tuple of {what}, got {values!r}."
        )
    return values


def _axis(where: str, path: str, values: Any, known: set[str]) -> tuple:
    if path not in known:
        close = difflib.get_close_matches(path, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"config.sweep.{where}.{path}: {path!r} is not a config key{hint}.")
    if path.startswith("engine."):
        raise ConfigError(
            f"config.sweep.{where}.{path}: the engine is not part of a run's identity; "
            "set config.engine for the whole sweep."
        )
    if path in _NOT_AXES:
        use = "sweep.seeds" if path == "seed" else "sweep.methods"
        raise ConfigError(f"config.sweep.{where}.{path} cannot be an axis; use config.{use}.")
    return _nonempty_tuple(f"{where}.{path}", values, "values")


def _sweep_section(config: Any) -> dict[str, Any]:
    """The validated `sweep` section, with defaults filled in."""
    raw = config_lib.as_dict(config).get("sweep")
    if raw is None:
        raise ConfigError(
            "config.sweep is missing: a sweep config names its axes in config.sweep (seeds, "
            "methods, grid, axes; see fedjax_pals/experiment/sweep.py)."
        )
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config.sweep must be a section (a mapping), got {raw!r}.")
    for key in raw:
        if key not in SWEEP_KEYS:
            raise ConfigError(
                f"config.sweep.{key} is not a sweep key; the keys are {list(SWEEP_KEYS)}."
            )
    known = set(config_lib.flatten(config_lib.default_config()))
    seeds = raw.get("seeds")
    if seeds is None:
        seeds = (config_lib.as_dict(config).get("seed", 0),)
    seeds = _nonempty_tuple("seeds", seeds, "seeds")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ConfigError(
                f"config.sweep.seeds[...] must be integers in [0, 2**32 - 1], got {seed!r}."
            )
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"config.sweep.seeds has repeated seeds: {seeds}.")
    methods = raw.get("methods")
    if methods is not None:
        methods = _nonempty_tuple("methods", methods, "method keys")
        for method in methods:
            _method_overrides(method)
        if len(set(methods)) != len(methods):
            raise ConfigError(f"config.sweep.methods has repeated methods: {methods}.")
    grid, axes = (
        {p: _axis(where, p, v, known) for p, v in config_lib.flatten(raw.get(where) or {}).items()}
        for where in ("grid", "axes")
    )
    both = sorted(set(grid) & set(axes))
    if both:
        raise ConfigError(f"config.sweep: {both[0]} is both a grid key and a task axis.")
    zip_axes = raw.get("zip_axes", False)
    if not isinstance(zip_axes, bool):
        raise ConfigError(f"config.sweep.zip_axes must be True or False, got {zip_axes!r}.")
    if zip_axes and len({len(v) for v in axes.values()}) > 1:
        lengths = {p: len(v) for p, v in axes.items()}
        raise ConfigError(f"config.sweep.zip_axes=True needs axes of equal length, got {lengths}.")
    each_client = raw.get("each_client", False)
    if not isinstance(each_client, bool):
        raise ConfigError(f"config.sweep.each_client must be True or False, got {each_client!r}.")
    protocol = raw.get("protocol", not each_client)
    if not isinstance(protocol, bool):
        raise ConfigError(f"config.sweep.protocol must be True or False, got {protocol!r}.")
    if protocol and each_client:
        raise ConfigError(
            "config.sweep.each_client=True runs every client as its own target: the protocol "
            "would select among clients as if they were grid points. Set sweep.protocol=False "
            "(the per-client report replaces the table)."
        )
    selection = raw.get("selection") or "mean_over_seeds"
    if selection not in protocol_lib.SELECTIONS:
        raise ConfigError(
            f"config.sweep.selection must be one of {list(protocol_lib.SELECTIONS)}, got "
            f"{selection!r}."
        )
    figures = raw.get("figures") or ()
    if isinstance(figures, str):
        figures = (figures,)
    for figure in figures:
        if figure not in FIGURES:
            raise ConfigError(
                f"config.sweep.figures: {figure!r} is not a figure; choose from {list(FIGURES)}."
            )
    paper = raw.get("paper") or {}
    for method, value in paper.items():
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise ConfigError(
                f"config.sweep.paper.{method} must be (mean %, std %), got {value!r}."
            )
    row = raw.get("row")
    if row is not None and (not isinstance(row, str) or not row.strip()):
        raise ConfigError(f"config.sweep.row must be a non-empty string, got {row!r}.")
    x_axis = raw.get("x_axis")
    leaves = [p.split(".")[-1] for p in axes]
    if "accuracy_vs_axis" in figures and not axes:
        raise ConfigError(
            "config.sweep.figures: 'accuracy_vs_axis' needs task axes (config.sweep.axes)."
        )
    if x_axis is not None and x_axis not in leaves:
        raise ConfigError(
            f"config.sweep.x_axis={x_axis!r} is not a task axis; the axes are {leaves}."
        )
    return dict(
        row=row,
        seeds=tuple(int(s) for s in seeds),
        methods=methods,
        grid=grid,
        axes=axes,
        zip_axes=zip_axes,
        protocol=protocol,
        selection=selection,
        paper=dict(paper),
        figures=tuple(figures),
        x_axis=x_axis if x_axis is not None else (leaves[0] if leaves else None),
        each_client=each_client,
    )


def _method_overrides(method: Any) -> dict[str, Any]:
    """Method key -> the config keys it sets (registry.method_overrides)."""
    if not isinstance(method, str):
        raise ConfigError(f"config.sweep.methods: a method must be a string, got {method!r}.")
    if "," in method:  # what `--config.sweep.methods=fedavg,fedpals` gives ml_collections
        raise ConfigError(
            f"config.sweep.methods: {method!r} is one method key with commas in it; on the "
            "command line a tuple is a Python literal: --config.sweep.methods="
            f"\"{tuple(m.strip() for m in method.strip('()').split(','))!r}\"."
        )
    try:
        return registry.method_overrides(method)
    except ValueError as error:
        raise ConfigError(f"config.sweep.methods: {error}") from None


# -- expansion --------------------------------------------------------------------------------


def _set(tree: dict, path: str, value: Any) -> None:
    *sections, leaf = path.split(".")
    for section in sections:
        tree = tree.setdefault(section, {})
    tree[leaf] = value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).replace("/", "_").replace(" ", "_")


def _leaf_names(paths: Sequence[str]) -> dict[str, str]:
    """Short names: the leaf, or the full path where two paths share a leaf."""
    leaves = [p.split(".")[-1] for p in paths]
    return {p: (l if leaves.count(l) == 1 else p) for p, l in zip(paths, leaves)}


def _default_row(base: Mapping[str, Any]) -> str:
    resolved = config_lib.validate_config(base)
    label, p = dataset_label(resolved.dataset.name), resolved.partition
    if p.scheme is None:  # a data set with its own clients (the synthetic task)
        return label
    return f"{label} {registered_partitions()[p.scheme].label(p)}"


def _axis_of(paths) -> dict[str, str]:
    """{path: its axis}: the axis a registration declares (`hyperparameter(..., axis=...)`:
    alternative ways to give one quantity, e.g. FedPALS' lambda), else the path itself."""
    declared = {key: axis for axis, keys in registry.hyperparameter_axes().items()
                for key in keys}
    return {path: declared.get(path, path) for path in paths}


def _grid_axes(grid: Mapping[str, tuple]) -> list[list[tuple[str, Any]]]:
    """The grid's axes, each a list of (path, value); the keys of one declared axis form one
    axis of their values concatenated in the order the registration declares them (lam, then
    ess_fraction), where its first key sits in the grid's order."""
    declared = registry.hyperparameter_axes()
    axes: dict[str, list] = {}
    for path, axis in _axis_of(grid).items():
        if axis not in axes:
            keys = [key for key in declared.get(axis, (path,)) if key in grid]
            axes[axis] = [(key, value) for key in keys for value in grid[key]]
    return list(axes.values())


def _grid_points(grid: Mapping[str, tuple]) -> list[tuple[tuple[str, Any], ...]]:
    """The grid's points as ((path, value), ...), over `_grid_axes`."""
    return [tuple(point) for point in itertools.product(*_grid_axes(grid))]


def _used_grid(
    base: Mapping[str, Any], fixed: Sequence, grid: Mapping[str, tuple], seed: int
) -> dict[str, tuple]:
    """The part of `grid` that the run `base` + `fixed` uses (its resolved value is not None;
    a declared axis where any of its keys resolves to a value)."""
    if not grid:
        return {}
    axis_of = _axis_of(grid)
    tree = copy.deepcopy(base)
    for path, value in fixed:
        _set(tree, path, value)
    for path, value in (axis[0] for axis in _grid_axes(grid)):
        # The grid's first point: one key of each axis set (two, e.g. lam and ess_fraction,
        # would contradict each other).
        _set(tree, path, value)
    tree["seed"] = seed
    try:
        flat = config_lib.flatten(config_lib.validate_config(tree))
    except (ValueError, TypeError):
        return dict(grid)  # the runs' own validation names the problem
    used_axes = {axis for path, axis in axis_of.items() if flat.get(path) is not None}
    return {path: values for path, values in grid.items() if axis_of[path] in used_axes}


def uses_target(resolved: Mapping[str, Any]) -> bool:
    """Whether a resolved run's server weights read T: its method, or the lender of its
    weights, is registered with `reads_target` (FedPALS, FedDisco, ...)."""
    algorithm = resolved["algorithm"]
    return registry.reads_target(algorithm["name"], algorithm.get("weights"))


def _target_clients(sweep: Mapping[str, Any], resolved: Mapping[str, Any]) -> list:
    """The training clients a grid point runs for as targets (sweep.each_client), or [None]."""
    if not sweep["each_client"] or not uses_target(resolved):
        return [None]
    return list(range(resolved["partition"]["num_clients"] - 1))


def _runs(config: Any) -> tuple[list[SweepRun], dict[str, Any]]:
    sweep = _sweep_section(config)
    base = config_lib.as_dict(config)
    base.pop("sweep", None)
    for keys in registry.hyperparameter_axes().values():
        if "algorithm" in base and any(path in sweep["grid"] for path in keys):
            # A base value of one key of an axis (lam) would collide with the grid's axis.
            for path in keys:
                base["algorithm"][path.split(".")[1]] = None
    try:
        base_label = sweep["row"] or _default_row(base)
    except ConfigError as error:
        raise ConfigError(f"sweep base config: {error}") from None
    axis_paths = list(sweep["axes"])
    axis_names = _leaf_names(axis_paths)
    combine = zip if sweep["zip_axes"] and axis_paths else itertools.product
    row_points = list(combine(*sweep["axes"].values()))
    grid_names = _leaf_names(list(sweep["grid"]))
    methods = sweep["methods"] or (None,)
    runs: list[SweepRun] = []
    names: set[str] = set()
    digests: set[str] = set()
    sweep["row_axes"] = {}
    # method key -> (its registered method, the algorithm values its runs use), and what the
    # method keys set: for the warning about a declared grid the sweep leaves out.
    declared: dict[str, tuple[str, dict]] = {}
    method_paths: set[str] = set()
    for row_values in row_points:
        row_overrides = list(zip(axis_paths, row_values))
        labels = [f"{axis_names[p]}={_fmt(v)}" for p, v in row_overrides]
        row_part = ",".join(labels)
        row = base_label + (f" ({', '.join(labels)})" if labels else "")
        sweep["row_axes"][row] = {p.split(".")[-1]: v for p, v in row_overrides}
        for method in methods:
            method_overrides = _method_overrides(method) if method is not None else {}
            method_key = method or base.get("algorithm", {}).get("name", "run")
            fixed = [*row_overrides, *method_overrides.items()]
            # Only the grid keys this method uses span its grid (the others would resolve to
            # None and repeat the same run): a probe config tells which.
            grid = _used_grid(base, fixed, sweep["grid"], sweep["seeds"][0])
            for point in _grid_points(grid):
                tree = copy.deepcopy(base)
                for path, value in [*fixed, *point]:
                    _set(tree, path, value)
                if sweep["each_client"]:
                    _set(tree, "evaluation.per_client", True)
                hparams = tuple((grid_names[p], v) for p, v in point)
                grid_part = ",".join(f"{name}={_fmt(v)}" for name, v in hparams)
                where = "/".join(x for x in (row_part, method_key, grid_part) if x)
                # The seed enters validation only as itself (checked with sweep.seeds), so one
                # validation per grid point covers its seeds.
                tree["seed"] = sweep["seeds"][0]
                try:
                    resolved = config_lib.as_dict(config_lib.validate_config(tree))
                except (ValueError, TypeError) as error:
                    raise type(error)(f"sweep run {where}/seed_{tree['seed']}: {error}") from None
                algorithm = resolved["algorithm"]
                declared.setdefault(method_key, (algorithm["name"], algorithm))
                method_paths.update(method_overrides)
                for client in _target_clients(sweep, resolved):
                    for seed in sweep["seeds"]:
                        name = f"{where}/seed_{seed}"
                        run_tree, run_resolved = {**tree, "seed": seed}, {**resolved, "seed": seed}
                        if client is not None:
                            width = len(str(resolved["partition"]["num_clients"] - 2))
                            name = f"{where}/client_{client:0{width}d}/seed_{seed}"
                            # Client j's own model is the run: no personalisation of it.
                            run_tree["evaluation"] = {
                                **run_tree.get("evaluation", {}), "client_as_target": client,
                                "personalization": None}
                            run_resolved["evaluation"] = {
                                **run_resolved["evaluation"], "client_as_target": client,
                                **dict.fromkeys(PERSONALIZATION_KEYS)}
                        digest = config_lib.resolved_config_digest(run_resolved)
                        if name in names or digest in digests:
                            continue  # the same run reached twice (e.g. a method listed twice)
                        names.add(name)
                        digests.add(digest)
                        runs.append(
                            SweepRun(
                                name, row, method_key, hparams, seed, run_tree, run_resolved,
                                digest, client,
                            )
                        )
    sweep["row_label"] = base_label
    if sweep["protocol"]:  # a method's declared grid that the selection will not see
        protocol_lib.warn_ignored_grids(declared, {*sweep["grid"], *sweep["axes"], *method_paths})
    return runs, sweep


@dataclasses.dataclass(frozen=True)
class ExpandedSweep:
    """A sweep config expanded: what the sweep, its shards, `submit_sweep` and `collect_sweep`
    all read (`expand`).

    config: the sweep config as nested dicts (with its `sweep` section).
    runs: its runs, in sweep order, each validated.
    settings: the validated `sweep` section, defaults filled in (plus `row_label` and
      `row_axes`, the rows' task-axis values).
    imports: the user's modules that its runs need (they registered its methods, features,
      data set, ...; `fedjax_pals.extensions`), recorded in `<workdir>/sweep_imports.json`
      so that a process that reads only the workdir (a shard job on another node, a collect)
      imports them first.
    """

    config: dict
    runs: tuple[SweepRun, ...]
    settings: dict
    imports: tuple[extensions.ExtensionModule, ...]

    def record_imports(self, workdir: str) -> None:
        """Writes `imports` to `<workdir>/sweep_imports.json` (process 0); a sweep of the
        package's own methods only writes none (and removes an earlier sweep's)."""
        if not is_main_process():
            return
        path = os.path.join(workdir, IMPORTS_FILE)
        if self.imports:
            write_json(path, extensions.imports_record(self.imports))
        elif os.path.exists(path):
            os.remove(path)


def expand(config: Any) -> ExpandedSweep:
    """The sweep config `config` expanded and validated (ConfigError naming the first bad
    value; no data is read)."""
    runs, settings = _runs(config)
    imports = extensions.modules_for(
        [config_lib.flatten(run.config) for run in runs], [run.method for run in runs],
        resolved=[config_lib.flatten(run.resolved) for run in runs],
    )
    return ExpandedSweep(config_lib.as_dict(config), tuple(runs), settings, imports)


def import_recorded_modules(workdir: str) -> tuple[extensions.ExtensionModule, ...]:
    """Imports the user's modules that the sweep in `workdir` recorded (`ExpandedSweep.imports`)
    and returns them; ExtensionImportError (one line) if one cannot be imported."""
    modules = extensions.read_imports(os.path.join(workdir, IMPORTS_FILE))
    extensions.import_modules(modules)
    return modules


def expand_sweep(config: Any) -> list[tuple[str, ml_collections.ConfigDict]]:
    """The runs of a sweep config, as (name, run config), each config validated.

    Raises ConfigError (a ValueError) naming the sweep key, or the run and the config key, of
    the first bad value; no data is read.
    """
    runs, _ = _runs(config)
    return [(run.name, ml_collections.ConfigDict(run.config)) for run in runs]


# -- execution --------------------------------------------------------------------------------


def is_finished(run: SweepRun, results: Mapping[str, Any] | None) -> bool:
    """The run's results.json is of its config and holds its last round (and, under
    evaluation.personalization, every mode's record: a run killed while personalising is
    finished by its next launch)."""
    wanted = (run.resolved.get("evaluation") or {}).get("personalization") or ()
    return (
        results is not None
        and results.get("config_digest") == run.digest
        and bool(results.get("rounds"))
        and results["rounds"][-1] == run.resolved["training"]["rounds"]
        and all(mode in (results.get("personalization") or {}) for mode in wanted)
    )


def execute_runs(
    configs: Sequence[Mapping[str, Any]],
    workdirs: Sequence[str],
    *,
    quiet: bool = False,
    overwrite: bool = False,
    names: Sequence[str] | None = None,
    mlflow_tracking_uri: str | None = None,
    mlflow_experiment: str | None = None,
    on_done: Callable[[int, dict | BaseException], None] | None = None,
    skipped: int = 0,
) -> list[dict | BaseException]:
    """Runs `configs[i]` in `workdirs[i]`; the one place a sweep executes its runs.

    Through `train_and_evaluate_many`: runs that share their structure go through the
    engine's runs axis together (one compiled program), each run quiet; one progress bar
    over the runs and one line per run as it ends (`[k/N] <name>: target acc ...`). A failed
    run does not stop the others: its exception is returned in its place (and its traceback
    written to `<workdir>/error.txt`). KeyboardInterrupt stops the sweep (the runs' locks are
    released; `interruption.interruption_message` says where it stopped).

    Args:
      configs: run configs (ConfigDicts or nested mappings, without a `sweep` section, or
        `ResolvedConfig`s).
      workdirs: one directory per run.
      quiet: no progress bar.
      overwrite: passed to `train_and_evaluate` (replace a run of another config).
      names: labels of the runs for the progress bar and names of their MLflow runs
        (default: the workdirs' names).
      mlflow_tracking_uri: also log params and scalars to this MLflow tracking store
        (`pip install "fedjax_pals[mlflow]"`; one MLflow run per workdir). None:
        `$MLFLOW_TRACKING_URI` where set, else no MLflow.
      mlflow_experiment: the MLflow experiment of those runs (None: `$MLFLOW_EXPERIMENT_NAME`
        where set, else `fedjax_pals`).
      on_done: called with (index, outcome) as each run ends (after its error.txt is written).
      skipped: runs of the same sweep already finished, not among `configs`: said in one line
        at the start, and counted in the progress ([k/N] of all the sweep's runs).

    Returns:
      Per run, its results dict or the exception it raised.
    """
    if len(configs) != len(workdirs):
        raise ValueError(f"{len(configs)} configs but {len(workdirs)} workdirs.")
    names = list(names) if names is not None else [os.path.basename(w) for w in workdirs]
    total = skipped + len(configs)
    ACTIVITY.reset()
    ACTIVITY.sweep_started(total, skipped)
    # Keyed as the runs are (Workdir.path): absolute, ~ expanded.
    ACTIVITY.name_runs({os.path.abspath(os.path.expanduser(w)): n for w, n in zip(workdirs, names)})
    with Progress(
        total,
        desc="sweep",
        unit="run",
        initial=skipped,
        quiet=quiet or not is_main_process(),
        line_every=None,  # a line per run instead
    ) as bar:
        if skipped:
            bar.write(
                f"sweep: skipping {skipped} finished run{'s' * (skipped != 1)} of {total}"
                + ("; nothing to train" if not configs else "")
            )

        def report(index: int, outcome) -> None:
            workdir, name = workdirs[index], names[index]
            if isinstance(outcome, BaseException):
                if is_main_process() and not isinstance(outcome, WorkdirLockedError):
                    os.makedirs(workdir, exist_ok=True)
                    with open(os.path.join(workdir, "error.txt"), "w") as f:
                        f.write("".join(traceback.format_exception(outcome)))
                bar.update(1)
                bar.write(
                    f"[{bar.n}/{total}] {name}: {_failure_status(outcome)}: "
                    f"{type(outcome).__name__}: {outcome}"
                )
            else:
                stale = os.path.join(workdir, "error.txt")
                if is_main_process() and os.path.exists(stale):
                    os.remove(stale)  # an earlier attempt's failure, now resolved
                ACTIVITY.sweep_run_finished()
                bar.update(1)
                accuracy = outcome.get("target_accuracy_at_best_val", float("nan"))
                bar.write(
                    f"[{bar.n}/{total}] {name}: target acc {percent(accuracy)} at best val "
                    f"(round {outcome.get('best_val_round')})"
                    # Once per group of runs that ended together: after its last report.
                    + (f", sweep ETA {bar.eta()}"
                       if bar.n < total and not ACTIVITY.ended_unreported else "")
                )
            if on_done is not None:
                on_done(index, outcome)

        return train_lib.train_and_evaluate_many(
            configs,
            workdirs,
            overwrite=overwrite,
            quiet=True,
            round_progress=not quiet,
            on_done=report,
            mlflow_tracking_uri=mlflow_tracking_uri,
            mlflow_experiment=mlflow_experiment,
            run_names=names,
        )


def sweep_workdir(workdir: str | os.PathLike) -> str:
    """The workdir as a sweep uses it: `~` expanded, `..` and `.` resolved by name (as a run's
    workdir is), so that `x/nope/../w` makes no `x/nope`."""
    return os.path.normpath(os.path.expanduser(os.fspath(workdir)))


def check_workdir(workdir: str) -> None:
    """Creates `<workdir>/runs` and checks that the workdir can be written (ConfigError)."""
    try:
        os.makedirs(os.path.join(workdir, "runs"), exist_ok=True)
        probe = os.path.join(workdir, f".write_probe.{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as error:
        raise ConfigError(f"the sweep workdir {workdir!r} cannot be written: {error}.") from None


def previous_results(
    runs: Sequence[SweepRun], workdir: str, *, overwrite: bool = False
) -> list[Mapping[str, Any] | None]:
    """Each run's results.json so far (or None); a run directory holding another config is
    refused (ConfigError naming it) unless `overwrite`."""
    previous = [run_results(workdir, run) for run in runs]
    if not overwrite:
        foreign = [
            (run, results)
            for run, results in zip(runs, previous)
            if results is not None and results.get("config_digest") not in (None, run.digest)
        ]
        if foreign:
            run, results = foreign[0]
            differences = config_lib.config_differences(results.get("config", {}), run.resolved)
            raise ConfigError(
                f"{len(foreign)} run(s) in {workdir}/runs hold another configuration, e.g. "
                f"{run.name}: {'; '.join(differences[:5]) or 'different digest'}. Use another "
                "workdir, or overwrite=True (--overwrite) to replace them."
            )
    return previous


def run_dir(workdir: str, run: SweepRun) -> str:
    """Where a sweep's run writes: `<workdir>/runs/<name>/`."""
    return os.path.join(workdir, "runs", run.name)


def run_results(workdir: str, run: SweepRun) -> Mapping[str, Any] | None:
    """The run's results.json so far, or None if there is none it can read."""
    return train_lib._read_results(os.path.join(run_dir(workdir, run), RESULTS_FILE))


def execute_sweep_runs(
    runs: Sequence[SweepRun],
    previous: Sequence[Mapping[str, Any] | None],
    workdir: str,
    *,
    quiet: bool = False,
    overwrite: bool = False,
    mlflow_tracking_uri: str | None = None,
    mlflow_experiment: str | None = None,
    on_status: Callable[[str, str, str | None], None] | None = None,
) -> tuple[dict[str, str], dict[str, str], dict[int, Mapping[str, Any]]]:
    """Runs each of `runs` not finished yet (`previous[i]`: its results.json so far).

    `on_status(name, status, error)` is called as each run ends (and for each skipped run).

    Returns:
      (status {name: "done" | "skipped" | one of FAILURE_STATUSES}, errors {name: message},
       results {i: results dict} of the runs that finished, skipped ones included).
    """
    status: dict[str, str] = {}
    errors: dict[str, str] = {}
    results_by_run: dict[int, Mapping[str, Any]] = {}
    on_status = on_status or (lambda name, status, error: None)
    todo = []
    for i in range(len(runs)):
        if is_finished(runs[i], previous[i]):
            status[runs[i].name] = "skipped"
            results_by_run[i] = previous[i]
            on_status(runs[i].name, "skipped", None)
        else:
            todo.append(i)

    def record(position: int, outcome) -> None:
        i = todo[position]
        name = runs[i].name
        if name in status:
            return
        if isinstance(outcome, BaseException):
            status[name] = _failure_status(outcome)
            errors[name] = f"{type(outcome).__name__}: {outcome}"
        else:
            status[name] = "done"
            results_by_run[i] = outcome
        on_status(name, status[name], errors.get(name))

    outcomes = execute_runs(
        # Resolved when the sweep was expanded: each run's config is not validated again.
        [config_lib.resolved_config_of(runs[i].resolved, runs[i].method) for i in todo],
        [run_dir(workdir, runs[i]) for i in todo],
        quiet=quiet,
        overwrite=overwrite,
        names=[runs[i].name for i in todo],
        mlflow_tracking_uri=mlflow_tracking_uri,
        mlflow_experiment=mlflow_experiment,
        on_done=record,
        skipped=len(runs) - len(todo),
    )
    for position, outcome in enumerate(outcomes):
        record(position, outcome)
    return status, errors, results_by_run


def write_report(
    workdir: str,
    runs: Sequence[SweepRun],
    sweep: Mapping[str, Any],
    status: Mapping[str, str],
    results_by_run: Mapping[int, Mapping[str, Any]],
    *,
    missing: Sequence[str] = (),
) -> dict[str, Any]:
    """The protocol's report of the finished runs: table.md, table.json, comparison.png and the
    figures of `sweep.figures` in `workdir`.

    `missing` names runs that have not ended (a partial collect, `shards.collect_sweep`): the
    table then says it is partial and lists them.

    Returns:
      {"table": the protocol table, "markdown": its text, "files": {name: path}}; None, None
      and {} (nothing written) without `sweep.protocol` or a finished run, or outside process 0.
    """
    if results_by_run and is_main_process() and any(
        (run.resolved.get("evaluation") or {}).get("per_client") for run in runs
    ):
        from fedjax_pals.experiment import per_client_report

        per_client = per_client_report.write_per_client_report(
            workdir, runs, results_by_run, title=_per_client_title(runs, sweep), missing=missing)
    else:
        per_client = {"files": {}}
    if not sweep["protocol"] or not results_by_run or not is_main_process():
        return {"table": None, "markdown": None, "files": per_client["files"],
                "per_client": per_client.get("table")}
    records = [
        protocol_lib.RunRecord(run.row, run.method, run.hparams, run.seed, results_by_run[i])
        for i, run in enumerate(runs)
        if i in results_by_run
    ]
    paper = {sweep["row_label"]: sweep["paper"]} if sweep["paper"] else None
    if paper and len({run.row for run in runs}) == 1:
        paper = {runs[0].row: sweep["paper"]}
    title = _title(runs, sweep)
    if missing:
        title = f"PARTIAL ({len(missing)} of {len(runs)} runs missing): {title}"
    table = protocol_lib.protocol_table(
        records,
        methods=list(dict.fromkeys(run.method for run in runs)),
        selection=sweep["selection"],
        paper=paper,
        title=title,
    )
    table["runs"] = {
        "total": len(runs),
        "not_finished": {n: s for n, s in status.items() if s in FAILURE_STATUSES},
    }
    if missing:
        table["runs"].update(partial=True, missing=list(missing))
    files = protocol_lib.write_protocol_report(workdir, table)
    files.update(_figures(workdir, sweep, table, records))
    files.update(per_client["files"])
    return {"table": table, "markdown": protocol_lib.table_markdown(table), "files": files,
            "per_client": per_client.get("table")}


def run_sweep(
    config: Any,
    workdir: str,
    *,
    quiet: bool = False,
    overwrite: bool = False,
    mlflow_tracking_uri: str | None = None,
    mlflow_experiment: str | None = None,
    reshard: bool = False,
) -> dict[str, Any]:
    """Runs every run of the sweep `config` in `<workdir>/runs/<name>/`, then the protocol.

    Every run's config is validated first (nothing runs if one is bad); then a run already
    finished with the same config is skipped, and one holding another config is refused
    before anything runs (pass overwrite=True to replace them). With `sweep.protocol`, the
    report (`write_report`) goes to `<workdir>/`. `mlflow_tracking_uri`, `mlflow_experiment`:
    as in `execute_runs` (one MLflow run per run workdir, named by its run key).

    A workdir whose sweep was split into shards (`fjp.run_shard`) is refused, naming the split,
    unless `reshard` (its record is then dropped: run it so only once none of its shards runs).

    Returns:
      {"runs": {name: "done" | "skipped" | "diverged" | "unreachable" | "failed" | "busy"},
        "errors": {name: message},
        "table": the protocol table (or None), "markdown": its text (or None), "files": {...}}.
    """
    workdir = sweep_workdir(workdir)
    expanded = expand(config)
    runs, sweep = list(expanded.runs), expanded.settings
    check_workdir(workdir)
    lease = None
    if is_main_process():
        lease = locks.Lease(
            os.path.join(workdir, SWEEP_LOCK_FILE), f"the sweep workdir {os.path.abspath(workdir)}"
        ).acquire()
    try:
        plan = os.path.join(workdir, SHARD_PLAN)
        if os.path.exists(plan):
            if not reshard:
                raise ConfigError(
                    f"the sweep in {workdir} is split into shards ({plan}): run its shards "
                    "(--shard=i/N) and then --collect, or pass reshard=True (--reshard) to run "
                    "it whole here, once none of its shards runs."
                )
            if is_main_process():
                os.remove(plan)
        previous = previous_results(runs, workdir, overwrite=overwrite)
        if is_main_process():
            write_json(os.path.join(workdir, "sweep.json"), expanded.config)
        expanded.record_imports(workdir)
        status, errors, results_by_run = execute_sweep_runs(
            runs,
            previous,
            workdir,
            quiet=quiet,
            overwrite=overwrite,
            mlflow_tracking_uri=mlflow_tracking_uri,
            mlflow_experiment=mlflow_experiment,
        )
        summary = {"runs": {run.name: status[run.name] for run in runs}, "errors": errors}
        return {**summary, **write_report(workdir, runs, sweep, status, results_by_run)}
    finally:
        if lease is not None:
            lease.release()


def _failure_status(error: BaseException) -> str:
    """How a run ended that returned no results (see the module docstring): "unreachable" is
    an ESS fraction below ESS(alpha^{0+}) / N for this partition (`lambda_for_ess`)."""
    if isinstance(error, WorkdirLockedError):
        return "busy"  # another process holds the run: neither it nor this sweep failed
    if isinstance(error, FloatingPointError):
        return "diverged"
    text = str(error)
    if isinstance(error, ValueError) and "ESS fraction" in text and "out of range" in text:
        return "unreachable"
    return "failed"


def _per_client_title(runs: Sequence[SweepRun], sweep: Mapping[str, Any]) -> str:
    """The per-client report's title: the training clients it evaluates (the scheme's target
    client, when the scheme has one, is not among them)."""
    clients = "/".join(str(c) for c in dict.fromkeys(
        run.resolved["partition"]["num_clients"] - 1 for run in runs))
    rounds = "/".join(str(r) for r in dict.fromkeys(
        run.resolved["training"]["rounds"] for run in runs))
    return (f"{sweep['row_label']}: {clients} training clients, {rounds} rounds, "
            f"{len(sweep['seeds'])} seed{'s' * (len(sweep['seeds']) != 1)}")


def _title(runs: Sequence[SweepRun], sweep: Mapping[str, Any]) -> str:
    def values(section: str, key: str) -> str:
        found = dict.fromkeys(run.resolved[section][key] for run in runs)
        return "/".join(str(v) for v in found)

    return (
        f"{sweep['row_label']}: {values('partition', 'num_clients')} clients (incl. target), "
        f"{values('training', 'rounds')} rounds, E={values('training', 'local_epochs')}, "
        f"{len(sweep['seeds'])} seed{'s' * (len(sweep['seeds']) != 1)}"
    )


def _figures(
    workdir: str,
    sweep: Mapping[str, Any],
    table: Mapping[str, Any],
    records: Sequence[protocol_lib.RunRecord],
) -> dict[str, str]:
    from fedjax_pals.experiment import plots

    files: dict[str, str] = {}
    rows = list(dict.fromkeys(r.row for r in records))
    stems = plots.file_stems([_fmt(row) for row in rows])
    slug = {row: stems[_fmt(row)] for row in rows}
    by_key = {(r.row, r.method, tuple(r.hparams), r.seed): r for r in records}
    if "curves" in sweep["figures"]:
        os.makedirs(os.path.join(workdir, "curves"), exist_ok=True)
        for row in table["rows"]:
            curves = {}
            for method, cell in row["cells"].items():
                if cell.get("selected") is None:
                    continue
                per_seed = [
                    by_key[(row["row"], method, tuple(tuple(kv) for kv in p["hparams"]), p["seed"])]
                    for p in cell["per_seed"]
                ]
                if len({len(r.results["rounds"]) for r in per_seed}) != 1:
                    continue
                curves[table["labels"].get(method, method)] = {
                    "rounds": per_seed[0].results["rounds"],
                    "target_accuracy": [r.results["target_accuracy"] for r in per_seed],
                    "val_accuracy": [r.results["val_accuracy"] for r in per_seed],
                }
            if curves:
                path = os.path.join(workdir, "curves", f"{slug[row['row']]}.png")
                plots.plot_curves(path, curves, f"{row['row']}: selected configurations")
                files[f"curves:{row['row']}"] = path
    if "weights" in sweep["figures"]:
        os.makedirs(os.path.join(workdir, "weights"), exist_ok=True)
        # One curve per value of a declared axis (FedPALS' lambda: `lam`, `ess_fraction`).
        axis_keys = {path.split(".", 1)[1]
                     for keys in registry.hyperparameter_axes().values() for path in keys}
        for row in rows:
            # The runs whose method reports its weights (`alpha`: FedPALS' monitor), by method.
            by_method: dict[str, list] = {}
            for r in records:
                if r.row == row and "alpha" in r.results:
                    by_method.setdefault(r.method, []).append(r)
            for index, (method, reporting) in enumerate(by_method.items()):
                seed = min(r.seed for r in reporting)
                alphas = {}
                first = None
                for r in reporting:
                    if r.seed != seed:
                        continue
                    axis_part = [kv for kv in r.hparams if kv[0] in axis_keys]
                    other = [kv for kv in r.hparams if kv[0] not in axis_keys]
                    first = other if first is None else first
                    if other != first:
                        continue  # one curve per axis value: the first point of the others
                    ess = r.results.get("ess")
                    total = r.results.get("total_examples")
                    label = protocol_lib.hparams_label(axis_part) or method
                    if ess is not None and total:
                        label += f" (ESS {100 * ess / total:.0f} %)"
                    alphas[label] = r.results["alpha"]
                sizes = reporting[0].results.get("partition", {}).get("client_sizes")
                if alphas and sizes:
                    # The first method's figure keeps the name it always had.
                    name = slug[row] if index == 0 else f"{slug[row]}_{method}"
                    path = os.path.join(workdir, "weights", f"{name}.png")
                    method_label = table["labels"].get(method, method)
                    plots.plot_weights_vs_ess(
                        path, sizes, alphas,
                        title=f"{row}, seed {seed}: {method_label} weights vs FedAvg",
                    )
                    files[f"weights:{row}" + ("" if index == 0 else f":{method}")] = path
    # The selected cells of the protocol table: (row, method's label, the seeds' accuracies).
    selected = [
        (row, table["labels"].get(method, method), [p["target_accuracy"] for p in cell["per_seed"]])
        for row in table["rows"]
        for method, cell in row["cells"].items()
        if cell.get("selected") is not None
    ]
    if "accuracy_vs_distance" in sweep["figures"]:
        points: dict[str, list] = {}
        for row, label, accuracy in selected:
            if row["projection_distance"] is not None:
                points.setdefault(label, []).append(
                    {"projection_distance": row["projection_distance"], "target_accuracy": accuracy}
                )
        if points:
            path = os.path.join(workdir, "accuracy_vs_distance.png")
            plots.plot_accuracy_vs_distance(
                path, points, f"{sweep['row_label']}: target accuracy vs d(T, S)"
            )
            files["accuracy_vs_distance"] = path
    if "accuracy_vs_axis" in sweep["figures"]:
        x_axis = sweep["x_axis"]
        series: dict[str, list] = {}
        for row, label, accuracy in selected:
            values = sweep["row_axes"].get(row["row"], {})
            if x_axis not in values:
                continue
            # Zipped axes move together with x: only crossed axes tell lines apart.
            others = ", ".join(
                f"{k}={_fmt(v)}" for k, v in values.items() if k != x_axis and not sweep["zip_axes"]
            )
            label += f" ({others})" if others else ""
            series.setdefault(label, []).append({"x": values[x_axis], "target_accuracy": accuracy})
        # An axis reduced to its None value (e.g. epsilon=(None,) in a smoke run) has no curve.
        if any(p["x"] is not None for points in series.values() for p in points):
            path = os.path.join(workdir, f"accuracy_vs_{_fmt(x_axis)}.png")
            plots.plot_accuracy_vs_axis(
                path, series, x_axis, f"{sweep['row_label']}: target accuracy vs {x_axis}"
            )
            files["accuracy_vs_axis"] = path
    if "lambda_trajectories" in sweep["figures"]:
        os.makedirs(os.path.join(workdir, "lambda"), exist_ok=True)
        for row in rows:
            trajectories = {
                f"seed {r.seed}": r.results["lam_per_round"]
                for r in records
                if r.row == row and r.results.get("lam_per_round")
            }
            if trajectories:
                path = os.path.join(workdir, "lambda", f"{slug[row]}.png")
                plots.plot_lambda_trajectories(path, trajectories, f"{row}: adaptive lambda")
                files[f"lambda:{row}"] = path
    return files
