"""The command-line mains: experiments.run (config file + workdir) and experiments.demo."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment.workdir import Workdir
from config_files import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(module, *args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.mark.parametrize("name", ["default", "synthetic"])
def test_the_run_configs_are_valid(name):
    fjp.validate_config(load_config(f"{name}.py"))


def test_the_demo_config_is_a_sweep_of_two_methods_over_two_seeds():
    runs = fjp.expand_sweep(load_config("demo.py"))
    assert sorted(name for name, _ in runs) == [
        "fedavg/seed_0",
        "fedavg/seed_1",
        "fedpals/seed_0",
        "fedpals/seed_1",
    ]
    for _, config in runs:
        resolved = fjp.validate_config(config)
        assert resolved.dataset.name == "fashion_mnist" and resolved.training.rounds == 4
        assert resolved.partition.labels_per_client == 3 and resolved.partition.num_clients == 10


@pytest.mark.integration
def test_the_command_line_runs_a_config_file_with_overrides_and_refuses_another(tmp_path):
    workdir = tmp_path / "run"
    completed = _main(
        "experiments.run",
        "--config=configs/synthetic.py",
        "--config.training.rounds=2",
        "--config.algorithm.name=fedprox",
        "--config.algorithm.weights=fedpals",
        f"--workdir={workdir}",
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "final target accuracy" in completed.stdout
    with open(workdir / "results.json") as f:
        saved = json.load(f)
    assert saved["rounds"][-1] == 2
    assert saved["config"]["algorithm"]["name"] == "fedprox"
    assert saved["config"]["algorithm"]["weights"] == "fedpals"
    assert saved["config"]["algorithm"]["lam"] == 0.0

    again = _main(
        "experiments.run",
        "--config=configs/synthetic.py",
        "--config.training.rounds=3",
        f"--workdir={workdir}",
        "--quiet",
    )
    assert again.returncode == 1
    assert "error: the checkpoint in" in again.stderr and "training.rounds: 2 -> 3" in again.stderr
    assert "Traceback" not in again.stderr


def test_the_command_line_reports_a_bad_value_in_one_line_and_writes_nothing(tmp_path):
    completed = _main(
        "experiments.run",
        "--config=configs/synthetic.py",
        "--config.training.eval_every=50",
        f"--workdir={tmp_path / 'run'}",
        timeout=120,
    )
    assert completed.returncode == 1
    assert "error: config.training.eval_every must be an integer in [1, 30]" in completed.stderr
    assert "Traceback" not in completed.stderr
    assert not (tmp_path / "run").exists()
    # A config the data cannot make (an ESS no lambda reaches here) is one line too.
    completed = _main(
        "experiments.run",
        "--config=configs/synthetic.py",
        "--config.algorithm.ess_fraction=0.5",
        f"--workdir={tmp_path / 'run'}",
        timeout=120,
    )
    assert completed.returncode == 1
    assert "error: synthetic, seed 0: ESS fraction 0.5 is out of range" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_a_second_launch_on_a_busy_workdir_fails_at_once(tmp_path):
    config = load_config("synthetic.py")
    resolved = fjp.validate_config(config)
    with Workdir(tmp_path, fjp.resolve_config(resolved)):
        completed = _main(
            "experiments.run", "--config=configs/synthetic.py", f"--workdir={tmp_path}", timeout=120
        )
    assert completed.returncode == 1
    assert f"error: the workdir {tmp_path} is in use by another run (process {os.getpid()}" in (
        completed.stderr
    )


@pytest.mark.integration
def test_the_demo_falls_back_to_the_synthetic_task_without_fashion_mnist(
    tmp_path, monkeypatch, capsys
):
    from absl import flags

    from experiments import demo

    def unavailable(data_dir=None, search_debian=True):
        raise fjp.DatasetUnavailableError("no files (apt-get install dataset-fashion-mnist)")

    monkeypatch.setattr(fjp, "load_fashion_mnist", unavailable)
    flags.FLAGS(["demo", f"--workdir={tmp_path / 'demo'}", "--quiet"])
    try:
        demo.main(["demo"])
    finally:
        flags.FLAGS.unparse_flags()
    printed = capsys.readouterr().out
    assert re.fullmatch(r"demo: ([\d.]+ s|\d+ min \d+ s) elapsed", printed.splitlines()[-1])
    assert "runs the synthetic task instead" in printed
    assert "apt-get install dataset-fashion-mnist" in printed
    assert "FedPALS" in printed and "FedAvg" in printed
    assert os.path.getsize(tmp_path / "demo" / "comparison.png") > 1000
    # The label-shift picture: the clients' S_i(Y), T, and FedPALS' and FedAvg's weights.
    assert os.path.getsize(tmp_path / "demo" / "label_distributions.png") > 1000
    assert os.path.getsize(tmp_path / "demo" / "label_distributions.pdf") > 1000
    assert "label_distributions.png" in printed
    for method in ("fedavg", "fedpals"):
        with open(tmp_path / "demo" / "runs" / method / "seed_1" / "results.json") as f:
            saved = json.load(f)
        assert saved["config"]["dataset"]["name"] == "synthetic"
        assert saved["rounds"][-1] == 30


def test_the_demo_checks_its_config_before_it_reads_any_data(tmp_path, monkeypatch):
    from absl import flags

    from experiments import demo

    def read(*args, **kwargs):
        raise AssertionError("the demo read Fashion-MNIST before checking its config")

    monkeypatch.setattr(fjp, "load_fashion_mnist", read)
    flags.FLAGS(["demo", f"--workdir={tmp_path / 'demo'}"])
    rounds = demo._CONFIG.value.training.rounds
    try:
        demo._CONFIG.value.training.rounds = 0
        with pytest.raises(SystemExit, match="config.training.rounds must be an integer"):
            demo.main(["demo"])
    finally:
        demo._CONFIG.value.training.rounds = rounds
        flags.FLAGS.unparse_flags()
    assert not (tmp_path / "demo").exists()


def test_the_demo_resumes_a_workdir_of_its_own_config_and_replaces_another_ones(tmp_path):
    from experiments import demo

    config = load_config("demo.py")
    workdir = str(tmp_path / "demo")
    assert not demo.holds_another_config(config, workdir)  # nothing there yet
    name, run_config = fjp.expand_sweep(config)[0]
    results = tmp_path / "demo" / "runs" / name / "results.json"
    results.parent.mkdir(parents=True)
    results.write_text(json.dumps({"config_digest": fjp.config_digest(run_config)}))
    assert not demo.holds_another_config(config, workdir)  # an interrupted demo: resumed
    results.write_text(json.dumps({"config_digest": "another"}))
    assert demo.holds_another_config(config, workdir)  # an earlier demo of other settings
    results.write_text("{")
    assert demo.holds_another_config(config, workdir)  # not a run's results: scratch


def test_the_demo_with_a_data_dir_lacking_the_data_is_an_error_not_a_fallback(tmp_path):
    empty = tmp_path / "no_data"
    empty.mkdir()
    completed = _main(
        "experiments.demo", f"--config.dataset.data_dir={empty}", f"--workdir={tmp_path / 'd'}"
    )
    assert completed.returncode == 1
    assert "error:" in completed.stderr and str(empty) in completed.stderr
    assert "synthetic task instead" not in completed.stdout
    assert not (tmp_path / "d").exists()


@pytest.mark.integration
def test_two_local_processes_give_the_results_of_one(tmp_path):
    args = ["--config=configs/synthetic.py", "--config.training.rounds=3", "--quiet"]
    one = _main("experiments.run", *args, f"--workdir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr[-2000:]
    assert one.stderr == ""  # --quiet: no progress and no log line (absl's INFO included)...
    lines = one.stdout.splitlines()  # ...but the result and what was written
    assert lines[0].startswith("final target accuracy ") and "%; at best val (round " in lines[0]
    assert " s this launch" in lines[0] and lines[1] == "wrote:"
    assert f"  {tmp_path / 'one' / 'results.json'}" in lines
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedjax_pals.launch",
            "--num_processes=2",
            "--",
            sys.executable,
            "-m",
            "experiments.run",
            *args,
            f"--workdir={tmp_path / 'two'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert two.returncode == 0, two.stdout[-3000:]
    # Neither Gloo's connection lines nor JAX's INFO lines, unless --verbosity is raised.
    assert "Gloo" not in two.stdout and "JAX distributed service" not in two.stdout
    assert two.stdout.startswith("[0] final target accuracy"), two.stdout[-3000:]
    with open(tmp_path / "one" / "results.json") as f:
        alone = json.load(f)
    with open(tmp_path / "two" / "results.json") as f:
        together = json.load(f)
    assert together["engine"][0]["processes"] == 2  # both processes joined one program
    assert together["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-5)
    assert together["target_accuracy"] == alone["target_accuracy"]


@contextlib.contextmanager
def _sigint_not_ignored():
    """A child started inside gets SIGINT's default action, even where this process ignores
    SIGINT (started in the background of a script): a handler here is reset by exec."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


class _Child:
    """A command whose stderr is read line by line as it comes (a thread feeds a queue)."""

    def __init__(self, module, *args):
        import queue
        import threading

        with _sigint_not_ignored():  # as from a terminal, even if pytest was started so
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
        self.lines, self._queue = [], queue.Queue()

        def read():
            for line in self.process.stderr:
                self._queue.put(line.rstrip("\n"))
            self._queue.put(None)

        threading.Thread(target=read, daemon=True).start()

    def wait_for(self, predicate, timeout=300):
        """The first stderr line for which `predicate` holds (waiting on output, no sleeps)."""
        import queue

        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.process.kill()
                raise AssertionError(f"no such line in {timeout} s: {self.lines[-5:]}") from None
            if line is None:
                raise AssertionError(f"ended ({self.process.wait()}) first: {self.lines[-20:]}")
            self.lines.append(line)
            if predicate(line):
                return line

    def stop(self, signum):
        """Sends `signum`; returns the exit status and the stderr lines that followed."""
        self.process.send_signal(signum)
        status = self.process.wait(timeout=120)
        rest = []
        while (line := self._queue.get(timeout=30)) is not None:
            rest.append(line)
        self.process.stdout.close()
        return status, rest


@pytest.mark.integration
def test_ctrl_c_and_sigterm_end_a_run_in_one_line_and_the_same_command_resumes(tmp_path):
    command = [
        "--config=configs/synthetic.py",
        "--config.training.rounds=300",
        "--config.training.eval_every=5",
        f"--workdir={tmp_path / 'run'}",
    ]
    pattern = (
        r"interrupted \((SIGINT|SIGTERM)\) in round (\d+)/300 of .*run; the same command "
        r"resumes from round (\d+) \(the last checkpoint\)\."
    )
    first = _Child("experiments.run", *command)
    evaluation = first.wait_for(lambda line: line.startswith("FedPALS seed 0: round "))
    assert re.fullmatch(
        r"FedPALS seed 0: round 5/300, target acc [\d.]+%, val acc [\d.]+%, .*ETA (\d+:\d\d|\?)",
        evaluation,
    ), evaluation
    status, rest = first.stop(signal.SIGINT)
    assert status == 130, rest
    # Perhaps an evaluation or two more before the signal landed, then the one line.
    assert all(line.startswith("FedPALS seed 0: round ") for line in rest[:-1]), rest
    name, reached, resume = re.fullmatch(pattern, rest[-1]).groups()
    assert name == "SIGINT" and int(resume) % 5 == 0 and int(resume) < int(reached)

    second = _Child("experiments.run", *command)
    header = second.wait_for(lambda line: "rounds, backend" in line)
    assert header.endswith(f", resuming after round {resume}")  # the round the line named
    second.wait_for(lambda line: line.startswith("FedPALS seed 0: round "))
    status, rest = second.stop(signal.SIGTERM)
    assert status == 143, rest
    assert all(line.startswith("FedPALS seed 0: round ") for line in rest[:-1]), rest
    assert re.fullmatch(pattern, rest[-1]).group(1) == "SIGTERM", rest
    assert "Traceback" not in "\n".join(second.lines + rest)


def test_the_weights_command_draws_fedpals_weights_without_training(tmp_path):
    completed = _main(
        "experiments.weights",
        f"--config={os.path.join(ROOT, 'configs', 'synthetic.py')}",
        f"--workdir={tmp_path}",
        "--ess_fractions=0.9,0.05",
    )
    assert completed.returncode == 0, completed.stderr
    record = json.loads((tmp_path / "weights.json").read_text())
    assert record["unreachable_fractions"] == [0.05]  # below ESS(alpha^0+) / N
    lam0, ess90 = record["weights"]
    assert lam0["lam"] == 0.0
    total = sum(record["client_sizes"])
    assert abs(ess90["ess"] / total - 0.9) < 1e-3
    assert (tmp_path / "weights.png").stat().st_size > 1000
    assert not (tmp_path / "checkpoints").exists()


def test_restricted_evaluation_scales_only_the_classes_the_target_lacks():
    from experiments.restricted_eval import restricted_accuracies

    # Target holds classes 0 and 1. Example 0: class 2 (absent) leads, 0 is second at 3.0.
    # Example 1: class 1 leads outright. Example 2: absent class 3 leads at 10, class 0 at 4.
    logits = np.array([[3.0, 1.0, 4.0, 0.0], [0.0, 5.0, 2.0, 1.0], [4.0, 0.0, 0.0, 10.0]])
    labels = np.array([0, 1, 0])
    target = np.array([0.5, 0.5, 0.0, 0.0])
    got = restricted_accuracies(logits, labels, target, (1.0, 0.8, 0.5, 0.0))
    # alpha 1: plain (1 of 3); 0.8: 4 -> 3.2 > 3 still wins, 10 -> 8 wins; 0.5: 2.0 < 3 fixes
    # example 0 but 5.0 > 4 keeps example 2 wrong; 0: only classes 0 and 1 can be predicted.
    assert got == {
        1.0: pytest.approx(1 / 3),
        0.8: pytest.approx(1 / 3),
        0.5: pytest.approx(2 / 3),
        0.0: pytest.approx(1.0),
    }


@pytest.mark.integration
def test_the_restricted_eval_command_restores_each_run_and_reproduces_its_accuracy(tmp_path):
    import ml_collections

    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = 2
    config.training.batch_size = 8
    config.sweep = ml_collections.ConfigDict(dict(seeds=(0,), methods=("fedrs", "fedavg")))
    summary = fjp.run_sweep(config, str(tmp_path / "sweep"), quiet=True)
    assert set(summary["runs"].values()) == {"done"}
    completed = _main(
        "experiments.restricted_eval",
        f"--sweeps={tmp_path / 'sweep'}",
        f"--workdir={tmp_path}",
        "--methods=fedrs,fedavg",
        "--alphas=0.5,0",
        "--cpu_devices=1",
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    record = json.loads((tmp_path / "restricted_eval.json").read_text())
    assert len(record["runs"]) == 2
    for run in record["runs"].values():
        # The restored final state gives the accuracy the run recorded at its last round.
        assert run["plain"] == pytest.approx(run["recorded_final"], abs=1e-9)
        assert set(run["restricted"]) == {"0.5", "0"}
    assert "| sweep/fedrs |" in (tmp_path / "restricted_eval.md").read_text()
