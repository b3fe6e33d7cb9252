#!/usr/bin/env bash
# Regenerates the numbers of REPRODUCTION.md, one experiment per call, at the budget stated there:
#
#   bash scripts/reproduce.sh table1_fmnist_c3      # one experiment
#   bash scripts/reproduce.sh all                   # every one, in the order below
#   bash scripts/reproduce.sh --list                # the experiments and their commands
#
# Each experiment is `python -m experiments.sweep --config=configs/<name>.py` with overrides that
# shrink the paper's budget to what a 2-core CPU runs in a session (the configs themselves keep
# the paper's full budget: drop the overrides to run it). Runs go to runs/reproduction/<name>/
# (REPRODUCTION_DIR to change it); the same command again skips finished runs and resumes the
# others from their checkpoints, so a killed job loses at most one evaluation interval.
# Extra arguments after the experiment's name go to experiments.sweep (e.g. --quiet).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
ROOT="${REPRODUCTION_DIR:-runs/reproduction}"

# Table 1 at the session budget: 10 rounds of E = 1 (the paper: 150), the paper's 8 seeds,
# learning rate 0.1 for every method, FedPALS' full lambda grid (lam = 0 and ESS 10/25/50/75 %
# of N), every baseline at its reference default (FedProx mu = 0.01, SCAFFOLD eta_g = 1,
# AFL gamma = 0.1, FedRS alpha = 0.5); early stopping and lambda selected on the target
# validation set.
TABLE1=(
  --config.training.rounds=10
  "--config.sweep.methods=('fedpals','fedavg','fedprox','scaffold','afl','fedrs','oracle')"
  "--config.sweep.grid.training.learning_rate=(0.1,)"
  "--config.sweep.grid.algorithm.prox_mu=(0.01,)"
  "--config.sweep.grid.algorithm.server_lr=(1.0,)"
  "--config.sweep.grid.algorithm.afl_step=(0.1,)"
  "--config.sweep.grid.algorithm.fedrs_alpha=(0.5,)"
)
# The smaller experiments: learning rate 0.1, FedPALS over lam = 0 and ESS 50 % of N.
SMALL_GRID=(
  "--config.sweep.grid.training.learning_rate=(0.1,)"
  "--config.sweep.grid.algorithm.ess_fraction=(0.5,)"
)

declare -A ARGS
ARGS[table1_fmnist_c3]="${TABLE1[*]@Q}"
ARGS[table1_fmnist_c2]="${TABLE1[*]@Q}"
ARGS[synthetic_fig9]=""
ARGS[target_perturbation_table2]="--config.training.rounds=6 ${SMALL_GRID[*]@Q}"
ARGS[num_clients_fig9c]="--config.training.rounds=15 --config.sweep.seeds='(0,1,2)' \
--config.sweep.methods='(\"fedpals\",\"fedavg\")' ${SMALL_GRID[*]@Q}"
ARGS[local_epochs_fig8b]="--config.sweep.seeds='(0,)' --config.sweep.methods='(\"fedpals\",\"fedavg\")' \
--config.sweep.axes.training.local_epochs='(1,2,5,10)' --config.sweep.axes.training.rounds='(10,5,2,1)' \
--config.sweep.grid.training.learning_rate='(0.1,)' --config.sweep.grid.algorithm.ess_fraction='(0.25,)'"
ARGS[beyond_adaptive_lambda_c3]="--config.training.rounds=10"
ARGS[beyond_adaptive_lambda_c2]="--config.training.rounds=10"
# Experiments whose config file is not configs/<name>.py.
declare -A CONFIG
CONFIG[beyond_adaptive_lambda_c3]="configs/beyond_adaptive_lambda.py:3"
CONFIG[beyond_adaptive_lambda_c2]="configs/beyond_adaptive_lambda.py:2"
CONFIG[beyond_unknown_target_c3]="configs/beyond_unknown_target.py:3"
ARGS[beyond_feddisco_fedlc]="--config.training.rounds=10 \
--config.sweep.methods='(\"feddisco\",\"fedlc\")' --config.sweep.grid.training.learning_rate='(0.1,)' \
--config.sweep.grid.algorithm.feddisco_a='(0.5,)' --config.sweep.grid.algorithm.feddisco_b='(0.1,)' \
--config.sweep.grid.algorithm.fedlc_tau='(1.0,)'"
ARGS[beyond_private_marginals]="--config.training.rounds=5 --config.sweep.seeds='(0,1)' ${SMALL_GRID[*]@Q}"
ARGS[beyond_unknown_target_c3]="--config.training.rounds=10"
ORDER=(table1_fmnist_c3 beyond_adaptive_lambda_c3 table1_fmnist_c2 beyond_adaptive_lambda_c2
       synthetic_fig9
       target_perturbation_table2 beyond_feddisco_fedlc beyond_unknown_target_c3
       beyond_private_marginals num_clients_fig9c local_epochs_fig8b)

command_for() {
  echo ".venv/bin/python -m experiments.sweep --config=${CONFIG[$1]:-configs/$1.py} --workdir=$ROOT/$1 ${ARGS[$1]}"
}

if [[ $# -lt 1 ]]; then
  echo "usage: bash scripts/reproduce.sh <experiment>|all|--list [experiments.sweep flags]" >&2
  exit 2
fi
name="$1"; shift
if [[ "$name" == "--list" ]]; then
  for n in "${ORDER[@]}"; do echo "$n:"; echo "  $(command_for "$n")"; done
  exit 0
fi
if [[ "$name" == "all" ]]; then
  for n in "${ORDER[@]}"; do bash "$0" "$n" "$@"; done
  exit 0
fi
if [[ -z "${ARGS[$name]+set}" ]]; then
  echo "unknown experiment '$name'; one of: ${ORDER[*]}" >&2
  exit 2
fi
mkdir -p "$ROOT/$name"
start=$(date +%s)
eval "$(command_for "$name") $(printf '%q ' "$@")"
echo "$name: $(( $(date +%s) - start )) s wall" | tee -a "$ROOT/$name/wall_time.txt"
