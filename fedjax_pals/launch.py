r"""Starts N local processes of a command as one `jax.distributed` program.

    python -m fedjax_pals.launch --num_processes=2 -- python -m experiments.run \
        --config=configs/demo.py --workdir=runs/demo2

Each child gets `FEDJAX_PALS_COORDINATOR`, `FEDJAX_PALS_NUM_PROCESSES` and
`FEDJAX_PALS_PROCESS_ID` in its environment, which `configure_runtime` reads when no explicit
settings are given, and `FEDJAX_PALS_LOCAL_PROCESSES`, so that `cpu_devices="auto"` divides the
cores among the local processes. The children's output is interleaved on this terminal, prefixed
by process id; the launcher exits with the first non-zero exit status (128 + the signal's number
for a process killed by a signal). Gloo's connection lines (`[Gloo] Rank 0 is connected to 1
peer ranks...`, written by its C++ code on every start) are left out unless the command raises
absl's verbosity (`--verbosity=1` or more; the mains then also show JAX's INFO lines).

Ctrl-C (SIGINT) or SIGTERM to the launcher stops the children (SIGTERM: process 0 says the
round the run reached and the one the same command resumes from), then one line, and the
exit status 130 or 143.

When one process dies while the others still run (they would wait on it in a collective, and
JAX's preemption notifier swallows SIGTERM), the launcher sends the others SIGTERM, then SIGKILL
after `GRACE_SECONDS`, and prints one line naming the process, how it died, and that the same
command resumes the run. The children never outlive the launcher: each is the leader of its own
process group (signalled as a group), and on Linux dies with the launcher (PR_SET_PDEATHSIG),
even when the launcher itself is SIGKILLed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

# Seconds between SIGTERM and SIGKILL when the launcher stops its children.
GRACE_SECONDS = 3.0
# The same when the user stops the launcher: process 0 finishes the round's writes (which may
# wait on the other processes at orbax's barriers) and says where it stopped.
INTERRUPT_GRACE_SECONDS = 10.0
# Seconds a dead child's remaining output may take to reach the terminal.
DRAIN_SECONDS = 5.0
# Exit status of a command-line mistake (absl's, and the experiments' mains').
USAGE_ERROR_STATUS = 2
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Lines of a child's output that say nothing to a user (C++ stderr, no logger to silence).
NOISE = (re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks"),)


def verbosity(command: list[str]) -> int:
    """The absl verbosity a command asks for (`--verbosity=N`, `-v N`, ...; 0 if none)."""
    level = 0
    for arg, following in zip(command, [*command[1:], None]):
        name, equals, value = arg.partition("=")
        if name in ("--verbosity", "-verbosity", "--v", "-v"):
            with contextlib.suppress(TypeError, ValueError):  # TypeError: a flag at the end
                level = int(value if equals else following)
    return level


def _pump(stream, prefix: str, out, muted: threading.Event, quiet: bool = False) -> None:
    for line in iter(stream.readline, ""):
        if muted.is_set():
            continue  # after a peer's death: the others' failures are its consequence
        if quiet and any(pattern.match(line) for pattern in NOISE):
            continue
        out.write(f"{prefix}{line}")
        out.flush()


def _die_with_parent(parent: int):
    """A `preexec_fn`: the child gets SIGKILL when the launcher dies (Linux; else nothing)."""

    def preexec() -> None:
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            except (OSError, AttributeError):
                return
            if os.getppid() != parent:  # the launcher died before prctl took effect
                os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def describe_exit(code: int) -> str:
    """`Popen.returncode` in words: "exited with status 3", "was killed by SIGKILL"."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def _advice(code: int) -> str:
    """What to do after a process ended with `code`: a usage error (status 2, the mains'
    convention) is not fixed by resuming."""
    if code == USAGE_ERROR_STATUS:
        return "; its command line was refused (its error is above): fix it and launch again."
    return "; run the same command again to resume the run from its last checkpoint."


def exit_status(code: int) -> int:
    """A shell's exit status for `Popen.returncode` (128 + N for a death by signal N)."""
    return 128 - code if code < 0 else code


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)  # the child leads its own group: its own children too
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(sig)


def stop(children: list[subprocess.Popen], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM to every running child's group, then SIGKILL to those still there after `grace`."""
    running = [c for c in children if c.poll() is None]
    for child in running:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
    for child in running:
        if child.poll() is None:
            _signal_group(child, signal.SIGKILL)
    for child in running:
        child.wait()


def launch(command: list[str], num_processes: int, port: int | None = None) -> int:
    """Runs `command` as `num_processes` local processes; returns the exit status."""
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}.")
    if not command:
        raise ValueError("no command to launch (put it after --).")
    address = f"127.0.0.1:{port or free_port()}"
    children, pumps = [], []
    muted = threading.Event()
    stopping = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.getsignal(signum) for signum in stopping}
    in_main_thread = threading.current_thread() is threading.main_thread()
    quiet = verbosity(command) < 1
    try:
        if in_main_thread:  # SIGTERM or Ctrl-C to the launcher stops its children (finally)
            for signum in stopping:
                if signum == signal.SIGTERM or previous[signum] is not signal.SIG_IGN:
                    # (a SIGINT ignored from the start stays so)
                    signal.signal(signum, _interrupted)
        # Every child is started before any thread (preexec_fn is not thread-safe).
        for i in range(num_processes):
            env = dict(
                os.environ,
                FEDJAX_PALS_COORDINATOR=address,
                FEDJAX_PALS_NUM_PROCESSES=str(num_processes),
                FEDJAX_PALS_PROCESS_ID=str(i),
                FEDJAX_PALS_LOCAL_PROCESSES=str(num_processes),
            )
            children.append(
                subprocess.Popen(
                    command,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                    preexec_fn=_die_with_parent(os.getpid()),
                )
            )
        for i, child in enumerate(children):
            pump = threading.Thread(
                target=_pump, args=(child.stdout, f"[{i}] ", sys.stdout, muted, quiet)
            )
            pump.start()
            pumps.append(pump)
        status = 0
        remaining = list(children)
        while remaining:
            for child in list(remaining):
                try:
                    code = child.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    continue
                remaining.remove(child)
                if code != 0 and status == 0:
                    status = exit_status(code)
                    if remaining or code < 0:
                        # A peer's death: the others would wait on it (JAX swallows SIGTERM).
                        stopped = [children.index(c) for c in remaining]
                        # Its last lines (its error) may still be in its pipe: print them
                        # before muting the others, whose failures follow from its death.
                        pumps[children.index(child)].join(timeout=DRAIN_SECONDS)
                        muted.set()
                        stop(remaining)
                        remaining.clear()
                        for pump in pumps:
                            pump.join(timeout=1.0)
                        others = ", ".join(str(i) for i in stopped)
                        print(
                            f"error: process {children.index(child)} of {num_processes} "
                            f"{describe_exit(code)}"
                            + (f"; stopped process(es) {others}" if others else "")
                            + _advice(code),
                            file=sys.stderr,
                            flush=True,
                        )
                        break
        for pump in pumps:
            pump.join()
        return status
    except _Interrupted as interrupted:
        # SIGTERM: process 0 says where the run stopped (through its pump)
        stop(children, grace=INTERRUPT_GRACE_SECONDS)
        for pump in pumps:
            pump.join(timeout=DRAIN_SECONDS)
        print(
            f"interrupted ({signal.Signals(interrupted.signum).name}): stopped the "
            f"{len(children)} process(es); the same command resumes the run from its last "
            "checkpoint.",
            file=sys.stderr,
            flush=True,
        )
        return 128 + interrupted.signum
    finally:
        if in_main_thread:  # a signal now would cut the stop below: the stop is under way
            for signum in stopping:
                signal.signal(signum, signal.SIG_IGN)
        stop(children)  # on an exception or a signal: no child outlives the launcher
        if in_main_thread:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class _Interrupted(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _interrupted(signum: int, frame) -> None:
    del frame
    for other in (signal.SIGTERM, signal.SIGINT):  # a second signal: the stop is under way
        signal.signal(other, signal.SIG_IGN)
    raise _Interrupted(signum)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage text (the mains' convention)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(USAGE_ERROR_STATUS)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.num_processes < 1:
        parser.error(f"--num_processes must be an integer >= 1, got {args.num_processes}.")
    if args.port is not None and not 0 < args.port < 65536:
        parser.error(f"--port must be in [1, 65535], got {args.port}.")
    if not command:
        parser.error("no command to launch: put it after --, e.g. -- python -m experiments.run ...")
    if shutil.which(command[0]) is None:  # else each child's start fails as a traceback
        parser.error(f"cannot run {command[0]!r}: no such executable (on PATH, or at that path).")
    try:
        return launch(command, args.num_processes, args.port)
    except OSError as error:  # e.g. it stopped being executable since the check
        print(f"error: cannot run {command[0]!r}: {error.strerror or error}.", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
