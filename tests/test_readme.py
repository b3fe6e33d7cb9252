"""README.md and the docs pages as a test: every command of their shell blocks runs,
shortened, and must succeed.

The pages are README.md, then those of mkdocs.yml's nav in its order (their blocks share one
user directory in that order, as a reader going through them would).

A shell block is a fenced block tagged ```bash (or sh, shell, console). Each one runs as one
bash script (so `cd` and `source` carry from line to line, as in a terminal), from the
repository root with the set-up's venv activated, each command shortened by the generic rules
of `shorten`: training commands get `--config.training.rounds=1` (and one seed for sweeps),
every `--workdir` / `--output` / `file://$PWD/` path is moved into a temporary directory shared
by the whole file (so blocks that share a workdir in the pages share it here, as for a user),
long commands get their short form. A command that is not shortened or skipped below runs as
written: a new command in a page is run by default. Commands that cannot run here are listed in
SKIPPED with the reason, and an entry that no longer matches any command fails the test.

An untagged block that looks like commands (starts with `python`, `bash`, ...) fails: tag it
```bash so that it is run. Every ```python block runs too (`test_the_python_blocks_run`): a
block whose first line is `# <name>.py` is a module of the reader's (written under that name
beside the others, imported in page order; a config module's `get_config()` is called and a
single run's config trained for one round); any other block is a script, run with its
`rounds=N` shortened to one round.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import FAST_COMPILE_XLA_FLAGS

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")


def _doc_pages() -> list[str]:
    """README.md and the pages of mkdocs.yml's nav, in order, relative to the repository."""
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        nav = f.read().split("\nnav:", 1)[1]
    return ["README.md"] + [
        os.path.join("docs", page)
        for page in re.findall(r"(?:^\s*-|:)\s*(\S+\.md)\s*$", nav, re.M)
    ]


DOC_PAGES = _doc_pages()
VENV = os.path.join(ROOT, ".venv")
SHELL_TAGS = ("bash", "sh", "shell", "console")
# What a command line looks like (for untagged blocks, which must not hold any).
COMMAND_LINE = re.compile(
    r"^\s*(\$ )?([A-Z_][A-Z0-9_]*=\S*\s+)*"
    r"(python3?|\.venv/bin/\S+|\S*/\.venv/bin/\S+|bash|sh|sbatch|pip|source|cd|tensorboard)\s"
)

# Commands that cannot run here, by a pattern on the (joined, comment-free) command, and why.
# Everything else runs.
SKIPPED = {
    r"^bash scripts/test\.sh\b": "the test suite itself (CI runs it: .ci/run)",
    r"--coordinator_address=host0": "needs 4 hosts named host0...; the same code path on one "
    "machine is `python -m fedjax_pals.launch` (tests/test_mesh.py, test_experiments.py)",
    # Left out for time (the README test is about 4 of the suite's minutes): each is the same code
    # path as a command that runs.
    r"^python -m experiments\.run --config=configs/default\.py --workdir=runs/a$": "the same "
    "config and program as the ESS run of 'Launching experiments' (FedPALS on configs/default.py;"
    " only lambda differs), which runs",
    r"--workdir=runs/fedprox_fedpals\b": "the README test's costliest command (FedProx on "
    "Fashion-MNIST's Dirichlet clients); tests/test_experiments.py::test_the_command_line_runs_"
    "a_config_file_with_overrides_and_refuses_another runs FedProx+FedPALS through "
    "experiments.run, and the ESS run above the same Fashion-MNIST program",
    r"^python -m fedjax_pals\.launch --num_processes=2 -- python -m experiments\.run": "two "
    "processes of experiments.run under the launcher: tests/test_experiments.py::"
    "test_two_local_processes_give_the_results_of_one runs this command on configs/synthetic.py",
    r"configs/beyond_natural_shakespeare\.py:run\b": "LEAF's LSTM on the real plays: "
    "tests/test_shakespeare.py::test_two_rounds_of_the_experiments_config_train_on_a_slice_of_"
    "the_real_plays runs this config for 2 rounds, and tests/test_sweep.py its sweep",
    r"configs/beyond_per_client_fmnist\.py\b": "101 runs a seed (FedPALS once per client of 100) and "
    "minutes of personalisation even at 1 round; tests/test_per_client.py runs the same "
    "each_client sweep, blocks, report and figure on the synthetic task",
    r"\bsbatch\b": "needs a Slurm cluster and Table 1's 960-run sweep; tests/test_submission.py "
    "submits to CI's real Slurm (scripts/slurm_local.sh)",
    r"experiments\.submit\b.*--slurm_partition=gpu": "needs a Slurm partition 'gpu' with GPUs; "
    "tests/test_submission.py covers experiments.submit on CI's Slurm and --cluster=local",
    r"experiments\.sweep\b.*--collect": "needs every shard of the sweep finished (the shard "
    "commands above run with --list only); tests/test_shards.py runs 4 shards, then --collect",
}

TRAINERS = re.compile(r"experiments\.(run|sweep|demo)\b|scripts/demo\.sh\b")
# Commands that train LeNet on Fashion-MNIST spend their time running it, not compiling it:
# they run at XLA's defaults, as a user has them (the suite's fast-compile flags make LeNet
# train about twice as slowly: docs/decisions/0089-legacy-emitters-for-test-programs.md).
# Every other command compiles more than it runs and keeps the suite's flags, as the suite's
# own child processes do.
FASHION_MNIST = re.compile(r"configs/(default|demo)\.py\b|scripts/demo\.sh\b|experiments\.demo\b")
SWEEPS = re.compile(r"experiments\.(sweep|demo)\b|scripts/demo\.sh\b")


@dataclasses.dataclass(frozen=True)
class Command:
    line: int  # of its page, 1-based: where the command starts
    text: str  # continuation lines joined, comments removed
    page: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclasses.dataclass(frozen=True)
class Block:
    line: int  # of the opening fence
    tag: str
    body: str
    page: str = "README.md"  # relative to the repository

    def commands(self) -> list[Command]:
        commands, pending, start = [], "", None
        for offset, raw in enumerate(self.body.splitlines()):
            line = raw.strip()
            if not pending and (not line or line.startswith("#")):
                continue
            if start is None:
                start = self.line + 1 + offset
            if line.endswith("\\"):
                pending += line[:-1].strip() + " "
                continue
            text = _strip_comment(pending + line)
            pending = ""
            if text:
                commands.append(Command(start, text, self.page))
            start = None
        return commands


def _strip_comment(text: str) -> str:
    """`cmd   # comment` -> `cmd` (a # that starts a word, outside quotes, as in bash)."""
    quote = None
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip()
    return text.strip()


def readme_blocks(text: str | None = None, page: str = "README.md") -> list[Block]:
    """The fenced blocks of `text` (default: the file `page`)."""
    if text is None:
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
    blocks = []
    for match in re.finditer(r"^```([\w+-]*)[^\n]*\n(.*?)^```", text, re.M | re.S):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(line, match.group(1).lower(), match.group(2), page))
    return blocks


def doc_blocks() -> list[Block]:
    """The fenced blocks of README.md and every docs page, in `DOC_PAGES` order."""
    return [block for page in DOC_PAGES for block in readme_blocks(page=page)]


def shell_blocks(text: str | None = None) -> list[Block]:
    blocks = readme_blocks(text) if text is not None else doc_blocks()
    return [b for b in blocks if b.tag in SHELL_TAGS]


def skip_reason(command: str) -> str | None:
    for pattern, reason in SKIPPED.items():
        if re.search(pattern, command):
            return reason
    return None


def shorten(command: str, tmp: str) -> str:
    """The README command as the test runs it: short, writing only under `tmp`."""

    def into_tmp(match):
        return f"{match.group(1)}{os.path.join(tmp, match.group(2).lstrip('/'))}"

    command = re.sub(r"(--workdir=)(\S+)", into_tmp, command)
    command = re.sub(r"(--output=)(\S+)", into_tmp, command)
    command = command.replace("file://$PWD/", f"file://{tmp}/")
    extra = []
    if re.search(r"experiments\.sweep\b.*--shard=", command):
        # A shard of Table 1's sweep is 120 runs of 150 rounds: list them (and check the
        # config, the split and the shard's flags) without training.
        extra.append("--list")
        if "--shard=auto" in command:  # as in a Slurm array job's task 3 of 8
            slurm = "SLURM_ARRAY_JOB_ID=1 SLURM_ARRAY_TASK_ID=3 SLURM_ARRAY_TASK_COUNT=8"
            command = f"{slurm} {command}"
    elif TRAINERS.search(command):
        extra.append("--config.training.rounds=1")
        if SWEEPS.search(command):
            extra.append("'--config.sweep.seeds=(0,)'")
        if "--mlflow_tracking_uri=" in command:  # one run is enough to show it is logged
            extra.append("'--config.sweep.methods=(\"fedavg\",)'")
        if "--workdir=" not in command:  # the demo's default workdir is in the repository
            extra.append(f"--workdir={os.path.join(tmp, 'runs', 'demo')}")
    elif re.search(r"experiments\.benchmarks\.round\b", command):
        # The full benchmark is 36 cases (minutes each at M = 1000): one small case.
        extra += [
            "--models=logistic_regression", "--num_clients=10", "--backends=auto",
            "--nobaseline", "--noceiling", "--rounds=1", "--min_timed_seconds=0",
        ]
    return " ".join([command, *extra])


def block_script(block: Block, tmp: str) -> tuple[str, list[str]]:
    """The bash script the test runs for `block`, and the skipped commands with reasons."""
    lines, skipped = ["set -e"], []
    for command in block.commands():
        reason = skip_reason(command.text)
        if reason:
            skipped.append(f"{command.where}: {command.text}\n    skipped: {reason}")
            continue
        lines.append(f"echo {shlex.quote(f'+ {command.where}: {command.text}')}")
        line = shorten(command.text, tmp)
        if TRAINERS.search(command.text) and FASHION_MNIST.search(command.text):
            line = f"XLA_FLAGS={shlex.quote(_user_xla_flags())} {line}"
        lines.append(line)
    return "\n".join(lines) + "\n", skipped


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):  # the commands are a user's, not this pytest's
        if key.startswith(("PYTEST_", "COV_")):
            env.pop(key)
    # "The commands below run ... in the venv the set-up made": activated.
    env["VIRTUAL_ENV"] = VENV
    env["PATH"] = os.path.join(VENV, "bin") + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONHOME", None)
    return env


def _user_xla_flags() -> str:
    """XLA_FLAGS without the suite's fast-compile flags (scripts/test.sh, tests/conftest.py)."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    return " ".join(f for f in flags if f not in FAST_COMPILE_XLA_FLAGS)


def _needs(block: Block):
    if not os.path.exists(os.path.join(VENV, "bin", "python")):
        pytest.skip("README's commands use the set-up's .venv: run bash scripts/test.sh")
    if "--mlflow_tracking_uri" in block.body and not os.environ.get("FEDJAX_PALS_MLFLOW_TESTS"):
        # CI installs the mlflow extra and sets FEDJAX_PALS_MLFLOW_TESTS: there it must run.
        pytest.importorskip("mlflow")


def _mlflow_runs(command: str) -> list[str]:
    match = re.search(r"--mlflow_tracking_uri=file://(\S+)", command)
    if not match:
        return []
    return glob.glob(os.path.join(match.group(1), "*", "*", "meta.yaml"))


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """One directory for every block, in the pages' order (a user's runs/, shared by blocks)."""
    return str(tmp_path_factory.mktemp("readme"))


BLOCKS = shell_blocks()


# Pages that record what was run at a commit (decisions, measurements): a ```text block there
# may hold the command lines of the record, with their output; it is not an instruction to run.
RECORD_PAGES = ("docs/decisions/", "docs/measurements/")


def test_the_docs_have_shell_blocks_and_no_untagged_commands():
    assert len(DOC_PAGES) >= 8 and "docs/guide/running.md" in DOC_PAGES
    assert len(BLOCKS) >= 4, "the ```bash blocks of README.md and docs/ were not found"
    for block in doc_blocks():
        if block.tag in SHELL_TAGS or block.tag == "python":
            continue
        if block.tag == "text" and block.page.startswith(RECORD_PAGES):
            continue
        for offset, line in enumerate(block.body.splitlines()):
            assert not COMMAND_LINE.match(line), (
                f"{block.page}:{block.line + 1 + offset} looks like a command in a block tagged "
                f"{block.tag or 'nothing'}: tag the block ```bash so that this test runs it"
            )


def test_every_skipped_command_is_still_in_the_docs():
    commands = [c.text for b in BLOCKS for c in b.commands()]
    for pattern in SKIPPED:
        assert any(re.search(pattern, c) for c in commands), (
            f"SKIPPED[{pattern!r}] matches no command of README.md or docs/ any more: remove it"
        )


def test_commands_are_parsed_and_shortened_as_intended(tmp_path, monkeypatch):
    block = readme_blocks(
        "```bash\n"
        "# a comment\n"
        "python -m experiments.run --config=configs/default.py --workdir=runs/x \\\n"
        "    --config.algorithm.ess_fraction=0.5   # trailing comment\n"
        "MLFLOW_ALLOW_FILE_STORE=true python -m experiments.sweep --config=configs/demo.py \\\n"
        "    --workdir=/shared/d --mlflow_tracking_uri=file://$PWD/mlruns\n"
        "sbatch --array=3 --wrap \"python -m experiments.sweep --workdir=/s --shard=3/8\"\n"
        "```\n"
    )[0]
    run, sweep, sbatch = block.commands()
    assert run.line == 3 and run.text == (
        "python -m experiments.run --config=configs/default.py --workdir=runs/x "
        "--config.algorithm.ess_fraction=0.5"
    )
    short = shorten(run.text, str(tmp_path))
    assert f"--workdir={tmp_path}/runs/x" in short and short.endswith("--config.training.rounds=1")
    short = shorten(sweep.text, str(tmp_path))
    assert f"--workdir={tmp_path}/shared/d" in short and f"file://{tmp_path}/mlruns" in short
    assert "'--config.sweep.seeds=(0,)'" in short
    assert skip_reason(sbatch.text) and not skip_reason(run.text)
    script, skipped = block_script(block, str(tmp_path))
    assert "sbatch" not in script and len(skipped) == 1
    # The Fashion-MNIST trainers run without the suite's fast-compile flags; the rest keep them.
    monkeypatch.setenv("XLA_FLAGS", " ".join(["--xla_dump_to=/d", *FAST_COMPILE_XLA_FLAGS]))
    synthetic = "python -m experiments.run --config=configs/synthetic.py --workdir=runs/s"
    plain, *_ = readme_blocks(f"```bash\n{synthetic}\n```\n")
    lines = block_script(block, "/t")[0].splitlines()
    trained = [line for line in lines if "experiments." in line and not line.startswith("echo")]
    assert len(trained) == 2
    assert all(line.startswith("XLA_FLAGS=--xla_dump_to=/d ") for line in trained)
    assert block_script(plain, "/t")[0].splitlines()[-1].startswith("python -m experiments.run")
    assert "--shard=3/8 --list" in shorten(
        "python -m experiments.sweep --config=c.py --workdir=/s --shard=3/8", "/t"
    )
    bench = shorten("python -m experiments.benchmarks.round --output=results/b.json", "/t")
    assert "--output=/t/results/b.json" in bench and "--num_clients=10" in bench


PYTHON_BLOCKS = [b for b in doc_blocks() if b.tag == "python"]
MODULE_HEADER = re.compile(r"^# (\w+)\.py\b")


def python_script(blocks: list[Block], tmp: str) -> str:
    """One Python script that runs `blocks` as the test does (see the module docstring):
    modules are written into `tmp` and imported; scripts run, their rounds shortened."""
    lines = ["import importlib, os, sys", f"sys.path.insert(0, {tmp!r})", f"os.chdir({tmp!r})",
             "import fedjax_pals as fjp"]
    for block in blocks:
        where = f"{block.page}:{block.line}"
        header = MODULE_HEADER.match(block.body)
        lines.append(f"print({('+ ' + where)!r}, flush=True)")
        if header:
            name = header.group(1)
            with open(os.path.join(tmp, f"{name}.py"), "w") as f:
                f.write(block.body)
            lines += [
                f"module = importlib.import_module({name!r})",
                "if hasattr(module, 'get_config'):",
                "    config = module.get_config()",
                "    if 'sweep' not in config:",
                "        config.training.rounds = 1",
                f"        fjp.train_and_evaluate(config, os.path.join({tmp!r}, 'runs', {name!r}),"
                " quiet=True)",
            ]
        else:
            body = re.sub(r"\brounds(\s*=\s*)\d+", r"rounds\g<1>1", block.body)
            lines.append(f"exec(compile({body!r}, {where!r}, 'exec'), {{}})")
    return "\n".join(lines) + "\n"


def test_the_python_blocks_are_found_and_shortened(tmp_path):
    pages = {b.page for b in PYTHON_BLOCKS}
    assert {"docs/library.md", "docs/extending.md"} <= pages
    modules = [MODULE_HEADER.match(b.body).group(1) for b in PYTHON_BLOCKS
               if MODULE_HEADER.match(b.body)]
    assert modules[:3] == ["my_extension", "my_config", "my_sweep"], modules
    script = python_script(
        readme_blocks("```python\nrun(rounds=10)\nconfig.training.rounds = 40\n```\n"),
        str(tmp_path))
    assert "run(rounds=1)" in script and "config.training.rounds = 1" in script
    assert "rounds=10" not in script and "= 40" not in script


# The commands of a page whose output its python blocks read, run first (a reader runs the
# page's commands before its code): natural_data.md's FEMNIST-shaped copy in /tmp. Without
# them the python blocks would depend on whether the commands' test ran before on this machine.
PYTHON_BLOCK_INPUTS = ("python -m experiments.benchmarks.femnist_copy ",)


def python_block_inputs() -> list[Command]:
    """The commands of the pages with python blocks that write what those blocks read."""
    pages = {b.page for b in PYTHON_BLOCKS}
    return [command for block in doc_blocks() if block.tag == "bash" and block.page in pages
            for command in block.commands() if command.text.startswith(PYTHON_BLOCK_INPUTS)]


def test_the_python_blocks_run(tmp_path):
    """Every ```python block of the docs, in page order, in one process (as a reader pasting
    them into one session and saving the modules would), after the commands whose output they
    read (`PYTHON_BLOCK_INPUTS`)."""
    inputs = python_block_inputs()
    assert inputs, "natural_data.md's python block reads the copy its femnist_copy command writes"
    for command in inputs:
        made = subprocess.run(
            [sys.executable, *command.text.split()[1:]], capture_output=True, text=True,
            timeout=600, cwd=ROOT,
            env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
        )
        assert made.returncode == 0, f"{command.page}:{command.line}: {made.stderr[-2000:]}"
    script = python_script(PYTHON_BLOCKS, str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=900,
        cwd=tmp_path, env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert os.path.exists(tmp_path / "runs" / "my_config" / "results.json")
    assert os.path.exists(tmp_path / "runs" / "fmnist_c3_ess50" / "results.json")


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.page}:{b.line}" for b in BLOCKS])
def test_the_docs_block_runs(block, user_dir):
    _needs(block)
    script, skipped = block_script(block, user_dir)
    if script.strip() == "set -e":
        pytest.skip("every command of the block is skipped:\n" + "\n".join(skipped))
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=_environment(), capture_output=True, text=True,
        timeout=900,
    )
    output = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"{block.page}:{block.line}: exit status {done.returncode}\n{output}"
    for command in block.commands():
        if "--mlflow_tracking_uri=file://" in command.text and not skip_reason(command.text):
            runs = _mlflow_runs(shorten(command.text, user_dir))
            assert runs, (
                f"{command.where} logged no MLflow run (a workdir of finished runs "
                f"logs nothing):\n{output}"
            )
    if skipped:
        print("\n".join(skipped))


def test_scripts_test_sh_succeeds_when_one_pass_selects_nothing_and_fails_when_both_do():
    """`bash scripts/test.sh -k name` whose tests are all integration tests (or all quick: the
    README's `-k fedprox -n 0`) succeeds; a selection of no test at all fails (pytest's 5)."""
    if not os.path.exists(os.path.join(VENV, "bin", "python")):
        pytest.skip("scripts/test.sh uses the set-up's .venv: run bash scripts/test.sh")

    def test_sh(name):
        # This file's parsing test: an integration test (the module is marked) that imports
        # no JAX, so that each of the two pytest passes takes a second.
        return subprocess.run(
            ["bash", "scripts/test.sh", os.path.relpath(__file__, ROOT), "-k", name, "-n", "0",
             "-p", "no:cacheprovider"],
            cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
            capture_output=True, text=True, timeout=600,
        )

    one_pass = test_sh("test_commands_are_parsed_and_shortened_as_intended")
    assert one_pass.returncode == 0, (one_pass.stdout + one_pass.stderr)[-3000:]
    assert "1 passed" in one_pass.stdout
    nothing = test_sh("no_test_has_this_name")
    assert nothing.returncode == 5, (nothing.stdout + nothing.stderr)[-3000:]
    assert "no test selected" in nothing.stderr


def test_the_docs_sweep_config_of_the_extension_is_the_example_s(tmp_path):
    """docs/extending.md's my_sweep.py is examples/extending/my_sweep.py (which the extension
    block runs), docstring aside: the same sweep."""
    (block,) = [b for b in doc_blocks() if b.tag == "python" and "# my_sweep.py" in b.body]
    (tmp_path / "my_sweep.py").write_text(block.body)
    example = os.path.join(ROOT, "examples", "extending")
    code = (
        "import importlib.util, json, sys\n"
        f"sys.path.insert(0, {example!r})\n"
        "def load(path):\n"
        "    spec = importlib.util.spec_from_file_location('m', path)\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        "    return module.get_config().to_dict()\n"
        f"print(json.dumps([load({str(tmp_path / 'my_sweep.py')!r}),"
        f" load({os.path.join(example, 'my_sweep.py')!r})], default=str))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    readme, example_config = json.loads(done.stdout.splitlines()[-1])
    assert readme == example_config
