#!/usr/bin/env bash
# The main job: FedPALS vs FedAvg on Fashion-MNIST with sparsity label shift.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m experiments.demo "$@"
