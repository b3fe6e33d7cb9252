r"""Starts N local processes of a command as one `jax.distributed` program.

    python -m fedjax_pals.launch --num_processes=2 -- python -m experiments.run \
        --config=configs/demo.py --workdir=runs/demo2

Each child gets `FEDJAX_PALS_COORDINATOR`, `FEDJAX_PALS_NUM_PROCESSES` and
`FEDJAX_PALS_PROCESS_ID` in its environment, which `configure_runtime` reads
when no explicit settings are given, and `FEDJAX_PALS_LOCAL_PROCESSES`, so
that `cpu_devices="auto"` divides the cores among the local processes. The
children's output is interleaved on this terminal, prefixed by process id;
the launcher exits with the first non-zero exit status (and stops the others).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pump(stream, prefix: str, out) -> None:
    for line in iter(stream.readline, ""):
        out.write(f"{prefix}{line}")
        out.flush()


def launch(command: list[str], num_processes: int, port: int | None = None) -> int:
    """Runs `command` as `num_processes` local processes; returns the exit status."""
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}.")
    if not command:
        raise ValueError("no command to launch (put it after --).")
    address = f"127.0.0.1:{port or free_port()}"
    children, pumps = [], []
    for i in range(num_processes):
        env = dict(
            os.environ,
            FEDJAX_PALS_COORDINATOR=address,
            FEDJAX_PALS_NUM_PROCESSES=str(num_processes),
            FEDJAX_PALS_PROCESS_ID=str(i),
            FEDJAX_PALS_LOCAL_PROCESSES=str(num_processes),
        )
        child = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        children.append(child)
        pump = threading.Thread(target=_pump, args=(child.stdout, f"[{i}] ", sys.stdout))
        pump.start()
        pumps.append(pump)
    status = 0
    remaining = list(children)
    while remaining:
        for child in list(remaining):
            try:
                code = child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            remaining.remove(child)
            if code != 0 and status == 0:
                status = code
                for other in remaining:
                    other.terminate()
    for pump in pumps:
        pump.join()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return launch(command, args.num_processes, args.port)


if __name__ == "__main__":
    sys.exit(main())
