"""The measurements, each a command run from the repository root.

  python -m experiments.benchmarks.round        # one round's throughput per backend vs a plain loop
  python -m experiments.benchmarks.scaling      # time and memory of FedPALS rounds against M and m
  python -m experiments.benchmarks.solve_time   # the FedPALS solve (eq. 8) against M
  python -m experiments.benchmarks.flower       # the round in Flower's simulation (optional extra)
  python -m experiments.benchmarks.torch_step   # one LeNet client step vs PyTorch (optional extra)

`harness` holds the round benchmark's logic (cases, worker processes, rows), `memory` the
resident-memory readings they report. Nothing here is imported by `fedjax_pals`.
"""
