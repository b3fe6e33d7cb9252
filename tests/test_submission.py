"""A sweep submitted through submitit: the shards as a job array, the collect after them."""

import functools
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import ml_collections
import pytest

import fedjax_pals as fjp
from fedjax_pals.experiment import shards as shards_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# CI starts a single-node Slurm (scripts/slurm_local.sh) and sets this: the Slurm test must run.
SLURM_REQUIRED = os.environ.get("FEDJAX_PALS_SLURM_TESTS") == "1"


def _sweep_config(rounds=2):
    config = fjp.default_config()
    config.dataset.name = "synthetic"
    config.training.rounds = rounds
    config.training.batch_size = 8
    config.sweep = ml_collections.ConfigDict(
        dict(
            seeds=(0, 1, 2, 3),
            methods=("fedavg", "fedpals"),
            grid=dict(training=dict(learning_rate=(0.05, 0.1))),
        )
    )
    return config


def _config_file(tmp_path, rounds):
    path = tmp_path / "sweep_config.py"
    path.write_text(
        "import ml_collections\nimport fedjax_pals as fjp\n\n\ndef get_config():\n"
        "    config = fjp.default_config()\n"
        "    config.dataset.name = 'synthetic'\n"
        f"    config.training.rounds = {rounds}\n"
        "    config.training.batch_size = 8\n"
        "    config.sweep = ml_collections.ConfigDict(dict(seeds=(0, 1, 2, 3),\n"
        "        methods=('fedavg', 'fedpals'), grid=dict(training=dict(learning_rate=(0.05, 0.1)))))\n"
        "    return config\n"
    )
    return str(path)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(shards=0), "shards must be an integer >= 1"),
        (dict(shards=2, timeout_mn=5), "submitit refused the job parameters: .*timeout_mn"),
        (dict(shards=2, slurm_partitio="gpu"), "Unknown argument 'partitio'"),
        (dict(shards=2, cluster="pbs"), "submitit: AutoExecutor doesn't know any executor named pbs"),
    ],
)
def test_bad_submissions_are_refused_before_anything_is_submitted(tmp_path, kwargs, match):
    with pytest.raises(fjp.ConfigError, match=match):
        fjp.submit_sweep(_sweep_config(), str(tmp_path), cluster=kwargs.pop("cluster", "local"), **kwargs)
    assert not os.path.exists(tmp_path / "shards") and not os.path.exists(tmp_path / "runs")


def test_a_bad_sweep_config_is_refused_before_anything_is_submitted(tmp_path):
    config = _sweep_config()
    config.sweep.methods = ("fedprx",)
    with pytest.raises(fjp.ConfigError, match="fedprx"):
        fjp.submit_sweep(config, str(tmp_path), shards=2, cluster="local")
    assert not os.path.exists(tmp_path / "submitit")


def test_the_submit_command_refuses_bad_flags_in_one_line(tmp_path):
    for args, match in [
        (["--shards=0"], "--shards=0"),
        (["--shards=2", "--slurm=account"], "is not key=value"),
        (["--shards=2", "--cluster=local", "--slurm_partition=gpu"], "need --cluster=slurm"),
        (["--shards=2", "--cluster=local", "--timeout_mn=3"], "timeout_mn"),
    ]:
        done = subprocess.run(
            [
                sys.executable, "-m", "experiments.submit",
                f"--config={os.path.join(ROOT, 'configs', 'demo.py')}", f"--workdir={tmp_path}",
                *args,
            ],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr[-2000:]
        assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], lines
    assert not os.path.exists(tmp_path / "runs")


# The integration tests' sweep: 16 synthetic runs of this many rounds (enough to stop one
# mid-run), and the table of its unsharded run_sweep, computed once for the module.
ROUNDS = 4


@pytest.fixture(scope="module")
def unsharded_table(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("whole")
    whole = fjp.run_sweep(_sweep_config(ROUNDS), str(workdir), quiet=True)
    assert set(whole["runs"].values()) == {"done"}
    with open(workdir / "table.json") as f:
        return json.load(f)


@pytest.mark.integration
def test_submit_on_the_local_executor_with_a_shard_preempted_collects_the_unsharded_table(
    tmp_path, unsharded_table
):
    workdir = str(tmp_path / "submitted")
    submit = subprocess.Popen(
        [
            sys.executable, "-m", "experiments.submit", f"--config={_config_file(tmp_path, ROUNDS)}",
            f"--workdir={workdir}", "--shards=2", "--cluster=local", "--timeout_min=30",
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        # Preempt shard 0 (submitit's signal, as Slurm sends it to the task; the shard's record
        # names the task's pid) once one of its runs has a checkpoint.
        record_file = os.path.join(workdir, "shards", "shard-0-of-2.json")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if os.path.exists(record_file) and os.path.exists(shards_lib.plan_path(workdir)):
                names = [
                    e["name"] for e in shards_lib.read_plan(workdir)["runs"] if e["shard"] == 0
                ]
                if any(
                    os.path.isdir(os.path.join(workdir, "runs", n, "checkpoints"))
                    and os.listdir(os.path.join(workdir, "runs", n, "checkpoints"))
                    for n in names
                ):
                    break
            assert submit.poll() is None, submit.communicate()[0][-3000:]
            time.sleep(0.05)
        record = json.loads(open(record_file).read())
        assert record["state"] == "running"
        os.kill(record["pid"], signal.SIGUSR2)
        output, _ = submit.communicate(timeout=900)
    finally:
        if submit.poll() is None:
            submit.kill()
    assert submit.returncode == 0, output[-3000:]
    assert "submitted 2 shard(s)" in output and "Target test accuracy" in output
    # A line per shard as it ends (the wait is hours on a real sweep), no job-array wording for
    # local processes, no folder named by submitit's "%j" pattern.
    assert "as local processes" in output and "as array" not in output
    assert all(f"shard {i}/2: ended (" in output for i in range(2)), output[-3000:]
    assert os.listdir(os.path.join(workdir, "submitit")) == ["local"]
    logs = "".join(
        open(path).read()
        for path in glob.glob(os.path.join(workdir, "submitit", "*", "*_log.err"))
    )
    assert "this job is preempted" in logs and "Requeued job" in logs, logs[-3000:]
    again = json.loads(open(record_file).read())
    assert again["state"] == "finished" and again["pid"] != record["pid"]
    with open(os.path.join(workdir, "table.json")) as f:
        assert json.load(f) == unsharded_table


# Node states of a node that takes jobs: busy ones too (another test's jobs may hold every
# CPU of CI's single node for a while; a job submitted then waits its turn in the queue).
_UP_STATES = {"idle", "mixed", "allocated", "completing", "planned"}


@functools.cache  # once per process: without a controller, sinfo waits 9 s before it fails
def _slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    states = {line.strip().rstrip("*~#!%$@^-") for line in done.stdout.splitlines()}
    return done.returncode == 0 and bool(states & _UP_STATES)


def _require_slurm() -> None:
    if not _slurm_up():
        if SLURM_REQUIRED:
            pytest.fail("FEDJAX_PALS_SLURM_TESTS=1 but no Slurm node up (scripts/slurm_local.sh)")
        pytest.skip("no Slurm here: bash scripts/slurm_local.sh start (as root) to run this test")


def _wait_for_job(job_id: str, timeout: float = 1200) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%i %T"], capture_output=True, text=True
        )
        if queued.returncode == 0 and not queued.stdout.strip():
            return
        time.sleep(1.0)
    pytest.fail(f"Slurm job {job_id} still queued or running after {timeout} s")


def _sbatch(output_dir, *args: str) -> str:
    done = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={output_dir}/slurm-%j.out", *args],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


@pytest.mark.integration
def test_a_real_slurm_runs_the_array_the_dependent_collect_and_a_cancelled_shard_resubmitted(
    tmp_path, unsharded_table
):
    _require_slurm()
    workdir = str(tmp_path / "slurm")
    config_file = _config_file(tmp_path, rounds=ROUNDS)
    done = subprocess.run(
        [
            sys.executable, "-m", "experiments.submit", f"--config={config_file}",
            f"--workdir={workdir}", "--shards=3", "--timeout_min=20",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    words = done.stdout.split()
    array = words[words.index("array") + 1]
    collect = words[words.index("collect:") + 2]
    # Cancel shard 1 while it runs (sbatch --array: task ids are the shard indices).
    record = os.path.join(workdir, "shards", "shard-1-of-3.json")
    deadline = time.monotonic() + 600
    while not os.path.exists(record) and time.monotonic() < deadline:
        time.sleep(0.2)
    subprocess.run(["scancel", f"{array}_1"], check=True)
    _wait_for_job(collect)
    log = open(os.path.join(workdir, "submitit", collect, f"{collect}_0_log.err")).read()
    assert "SweepIncompleteError" in log and "(shard 1/3:" in log, log[-3000:]
    assert not os.path.exists(os.path.join(workdir, "table.json"))
    # The plain recipe: resubmit that one shard, then a collect after it.
    python = f"{sys.executable} -m experiments.sweep --config={config_file} --workdir={workdir}"
    shard = _sbatch(tmp_path, "--array=1", f"--wrap={python} --shard=1/3 --quiet")
    again = _sbatch(tmp_path, f"--dependency=afterok:{shard}", f"--wrap={python} --collect --quiet")
    _wait_for_job(shard)
    _wait_for_job(again)
    with open(os.path.join(workdir, "table.json")) as f:
        table = json.load(f)
    assert table == unsharded_table
    for index in range(3):
        record = json.loads(open(os.path.join(workdir, "shards", f"shard-{index}-of-3.json")).read())
        assert record["state"] == "finished" and set(record["runs"].values()) <= {"done", "skipped"}


@pytest.mark.integration
def test_the_example_sbatch_scripts_run_shards_with_auto_and_a_dependent_collect(
    tmp_path, unsharded_table
):
    _require_slurm()
    workdir = str(tmp_path / "sbatch")
    config_file = _config_file(tmp_path, rounds=ROUNDS)
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    submit = lambda *args: subprocess.run(  # noqa: E731
        ["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={tmp_path}/%x-%A_%a.out", *args],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.strip()
    # --array=1-2: task ids 1 and 2 are shards 0 and 1 of 2 (--shard=auto subtracts the min).
    array = submit("--array=1-2", "examples/slurm/shard.sbatch", config_file, workdir)
    collect = submit(f"--dependency=afterany:{array}", "examples/slurm/collect.sbatch", workdir)
    _wait_for_job(array)
    _wait_for_job(collect)
    for index in range(2):
        record = json.loads(open(os.path.join(workdir, "shards", f"shard-{index}-of-2.json")).read())
        assert record["state"] == "finished", record
    with open(os.path.join(workdir, "table.json")) as f:
        assert json.load(f) == unsharded_table


@pytest.mark.integration
def test_a_submission_that_sbatch_refuses_is_one_error_line(tmp_path):
    _require_slurm()
    done = subprocess.run(
        [
            sys.executable, "-m", "experiments.submit",
            f"--config={os.path.join(ROOT, 'configs', 'demo.py')}", f"--workdir={tmp_path}",
            "--shards=2", "--slurm_partition=no_such_partition",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: the scheduler refused"), lines
    assert "partition" in lines[0].lower()
    assert not os.path.exists(tmp_path / "runs")
