r"""The main job: FedPALS vs FedAvg on Fashion-MNIST under sparsity label shift.

  python -m experiments.demo [--workdir=runs/demo] [--config.training.rounds=10]
      [--config.dataset.data_dir=DIR]

Runs configs/demo.py (10 clients, C = 3 labels per client, 4 rounds, seeds 0 and 1), prints
the comparison table and writes <workdir>/table.md, comparison.png, label_distributions.png
(the clients' label distributions, T, and FedPALS' and FedAvg's weights; a PDF of each figure
beside it) and a results.json per run, lists every file it wrote and ends with its elapsed
time. If Fashion-MNIST cannot be had it says how to get it and runs the paper's synthetic task
(App. C.4) instead; an explicit --config.dataset.data_dir without the files is an error.
The same command again skips the finished runs and resumes an interrupted one from its last
checkpoint (a workdir holding another config's demo is replaced); Ctrl-C or SIGTERM stops it
with one line saying where (exit status 130 / 143).
"""

from __future__ import annotations

import time

_STARTED = time.monotonic()  # the demo's elapsed time counts its imports too

import json  # noqa: E402
import os  # noqa: E402

from . import flags as common  # noqa: E402

fjp = common.fjp  # fedjax_pals, imported (with JAX) at its first use: --help prints at once

_DEMO_CONFIG = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "demo.py")
_CONFIG = common.define_config_file("config", _DEMO_CONFIG, "The demo's sweep config.")

# The synthetic task's training settings (the data set has 58 training examples).
SYNTHETIC_FALLBACK = dict(rounds=30, batch_size=8, learning_rate=0.05)

# JAX's monitoring events (jax._src.interpreters.pxla, jax._src.compiler; jax 0.10 and 0.11):
# every program JAX builds passes the backend-compile step (a duration event), whether XLA
# compiles it or it is loaded from the persistent compilation cache, which also records a hit
# and the compile time it saved.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_SAVED_EVENT = "/jax/compilation_cache/compile_time_saved_sec"


class CompilationCount:
    """How many programs this process compiled and how many it loaded from the persistent
    compilation cache, counted from JAX's monitoring events while in a `with` block."""

    def __init__(self):
        self.programs = 0  # built: compiled or loaded
        self.loaded = 0
        self.saved_seconds = 0.0

    @property
    def compiled(self) -> int:
        return max(self.programs - self.loaded, 0)

    def on_event(self, event: str, **kwargs) -> None:
        if event == CACHE_HIT_EVENT:
            self.loaded += 1

    def on_duration(self, event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            self.programs += 1
        elif event == CACHE_SAVED_EVENT:
            self.saved_seconds += max(duration, 0.0)

    def __enter__(self) -> "CompilationCount":
        import jax.monitoring

        jax.monitoring.register_event_listener(self.on_event)
        jax.monitoring.register_event_duration_secs_listener(self.on_duration)
        return self

    def __exit__(self, *exc_info) -> None:
        import jax.monitoring

        jax.monitoring.unregister_event_listener(self.on_event)
        jax.monitoring.unregister_event_duration_listener(self.on_duration)

    def summary(self, cache_dir: str | None) -> str:
        """'compiled 3 programs, loaded 99 from the compilation cache in DIR (about 41 s of
        compiling saved)'; without a cache, says so."""
        compiled = f"compiled {self.compiled} program{'s' * (self.compiled != 1)}"
        if not cache_dir:
            return f"{compiled} (no persistent compilation cache: --compilation_cache=none)"
        home = os.path.expanduser("~")
        where = cache_dir
        if home not in ("", "/") and (where + os.sep).startswith(home + os.sep):
            where = "~" + where[len(home):]
        if not self.programs:  # every run had finished: nothing was built
            return f"no program compiled or loaded (the compilation cache is {where})"
        if not self.loaded:
            return (f"{compiled}, loaded none from the compilation cache in {where} (kept "
                    "there: the next launch loads them)")
        saved = (f" (about {elapsed(self.saved_seconds)} of compiling saved)"
                 if self.saved_seconds >= 0.05 else "")
        return f"{compiled}, loaded {self.loaded} from the compilation cache in {where}{saved}"


def label_distribution_figure(workdir: str) -> str | None:
    """<workdir>/label_distributions.png of the lowest seed that FedPALS and FedAvg both ran:
    the clients' S_i(Y), T and each method's weights alpha (from the runs' results.json)."""
    results = {}
    for method in ("fedpals", "fedavg"):
        directory = os.path.join(workdir, "runs", method)
        seeds = sorted(
            int(name[len("seed_") :])
            for name in (os.listdir(directory) if os.path.isdir(directory) else [])
            if name.startswith("seed_") and name[len("seed_") :].isdigit()
        )
        results[method] = {}
        for seed in seeds:
            path = os.path.join(directory, f"seed_{seed}", "results.json")
            if os.path.exists(path):
                with open(path) as f:
                    results[method][seed] = json.load(f)
    common_seeds = sorted(set(results["fedpals"]) & set(results["fedavg"]))
    if not common_seeds:
        return None
    seed = common_seeds[0]
    partition = results["fedpals"][seed]["partition"]
    path = os.path.join(os.path.abspath(workdir), "label_distributions.png")
    fjp.experiment.plots.plot_label_distributions(
        path,
        partition["client_label_dists"],
        partition["target_label_dist"],
        {fjp.method_label(m): results[m][seed]["alpha"] for m in ("fedpals", "fedavg")},
        dataset=results["fedpals"][seed]["config"]["dataset"]["name"],
        title=partition["description"]
        + ("" if "seed" in partition["description"] else f", seed {seed}")
        + ": label distributions and server weights",
    )
    return path


def main(argv):
    del argv  # a stray argument is refused by common.run
    config = _CONFIG.value
    with common.user_errors():
        fjp.expand_sweep(config)  # every run's config checked before any data is read
    cache_dir = (common.configure_runtime() or {}).get("compilation_cache")
    with CompilationCount() as compilations:
        _run(config, cache_dir, compilations)


def _run(config, cache_dir: str | None, compilations: CompilationCount) -> None:
    if config.dataset.name == "fashion_mnist":
        data_dir = config.dataset.data_dir
        try:
            # An explicit data_dir is the only place looked in (no fallback to another copy).
            fjp.load_fashion_mnist(data_dir, search_debian=data_dir is None)
        except fjp.DatasetUnavailableError as error:
            if data_dir is not None:  # asked for this copy: its absence is the user's to fix
                raise SystemExit(f"error: {error}")
            print(
                "Fashion-MNIST is not available, so the demo runs the synthetic task instead."
                f"\n{error}"
            )
            config.dataset.name = "synthetic"
            config.training.update(SYNTHETIC_FALLBACK)
    workdir = common.WORKDIR.value or "runs/demo"
    started = time.time()
    with common.user_errors():
        # The demo's workdir is scratch: a previous demo of another config is replaced; one of
        # this config is resumed (its finished runs skipped, an interrupted one continued).
        summary = fjp.run_sweep(
            config,
            workdir,
            quiet=common.QUIET.value,
            overwrite=holds_another_config(config, workdir),
        )
    failed = {name: status for name, status in summary["runs"].items() if status == "failed"}
    if failed:
        for name, message in summary["errors"].items():
            print(f"{name}: {message}")
        raise SystemExit(f"error: {len(failed)} demo run(s) failed; see {workdir}/runs/*/error.txt")
    print(f"\nFedPALS vs FedAvg on {fjp.data.dataset_label(config.dataset.name)}, "
          f"{config.training.rounds} rounds\n")
    print(summary["markdown"])
    label_distribution_figure(workdir)
    print()
    common.print_written(workdir, started)
    # A second demo says what it reused: its programs are loaded, not compiled again.
    print(compilations.summary(cache_dir))
    print(f"demo: {elapsed(time.monotonic() - _STARTED)} elapsed")


def elapsed(seconds: float) -> str:
    """42.3 s, or 1 min 25 s."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest} s"


def holds_another_config(config, workdir: str) -> bool:
    """Whether a run of `workdir` holds the results of another config than this sweep's run
    of its name (an earlier demo of other settings, or the synthetic fallback's)."""
    for name, run_config in fjp.expand_sweep(config):
        path = os.path.join(workdir, "runs", name, "results.json")
        try:
            with open(path) as f:
                digest = json.load(f).get("config_digest")
        except FileNotFoundError:
            continue  # not started, or killed before its first evaluation
        except (OSError, ValueError, AttributeError):
            return True  # not a run's results: scratch, replaced
        if digest != fjp.config_digest(fjp.validate_config(run_config)):
            return True
    return False


def entry() -> None:
    """The `fedjax-pals-demo` command (`python -m experiments.demo`)."""
    common.run(main, takes=common.WRITES + common.RUNTIME)


if __name__ == "__main__":
    entry()
