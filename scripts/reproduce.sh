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
# Extra arguments after the experiment's name go to experiments.sweep (e.g. --quiet); of them the
# reports and merges (compare, weights, ...) get only --quiet, the one shared flag every main takes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
ROOT="${REPRODUCTION_DIR:-runs/reproduction}"

# Table 1 at the session budget: 10 rounds of E = 1 (the paper: 150), the paper's 8 seeds,
# learning rate 0.1 for every method, FedPALS' full lambda grid (lam = 0 and ESS 10/25/50/75 %
# of N), every baseline at its reference default (FedProx mu = 0.01, SCAFFOLD eta_g = 1,
# AFL gamma = 0.1) and FedRS over alpha = 0.5 (its default) and 0.1; early stopping, lambda and
# alpha selected on the target validation set; FedProx+FedPALS (mu = 0.01) over FedPALS'
# lambda grid. SCAFFOLD diverges at learning rate 0.1 on some seeds, so it has its own sweep
# (table1_*_scaffold) over learning rates 0.1 and 0.01; table1_* merges the two tables.
TABLE1=(
  --config.training.rounds=10
  "--config.sweep.methods=('fedpals','fedavg','fedprox','afl','fedrs','oracle','fedprox_fedpals')"
  "--config.sweep.grid.training.learning_rate=(0.1,)"
  "--config.sweep.grid.algorithm.prox_mu=(0.01,)"
  "--config.sweep.grid.algorithm.server_lr=(1.0,)"
  "--config.sweep.grid.algorithm.afl_step=(0.1,)"
  "--config.sweep.grid.algorithm.fedrs_alpha=(0.5,0.1)"
)
# The smaller experiments: learning rate 0.1, FedPALS over lam = 0 and ESS 50 % of N.
SMALL_GRID=(
  "--config.sweep.grid.training.learning_rate=(0.1,)"
  "--config.sweep.grid.algorithm.ess_fraction=(0.5,)"
)

TABLE1_SCAFFOLD=(
  --config.training.rounds=10
  "--config.sweep.methods=('scaffold',)"
  "--config.sweep.grid.training.learning_rate=(0.1,0.01)"
  "--config.sweep.grid.algorithm.server_lr=(1.0,)"
)

# Are 10 rounds enough, and do FedRS and AFL (below the paper at 10) catch up with more?
# FedPALS, FedAvg, FedRS and AFL for 40 rounds on three seeds.
TABLE1_LONG=(
  --config.training.rounds=40
  "--config.sweep.seeds=(0,1,2)"
  "--config.sweep.methods=('fedpals','fedavg','fedrs','afl')"
  "--config.sweep.grid.training.learning_rate=(0.1,)"
  "--config.sweep.grid.algorithm.ess_fraction=(0.5,)"
  "--config.sweep.grid.algorithm.fedrs_alpha=(0.5,)"
  "--config.sweep.grid.algorithm.afl_step=(0.1,)"
  "--config.sweep.grid.algorithm.server_lr=(1.0,)"
)

declare -A ARGS
ARGS[table1_fmnist_c3_long]="${TABLE1_LONG[*]@Q}"
ARGS[table1_fmnist_c3]="${TABLE1[*]@Q}"
ARGS[table1_fmnist_c2]="${TABLE1[*]@Q}"
ARGS[table1_fmnist_c3_scaffold]="${TABLE1_SCAFFOLD[*]@Q}"
ARGS[table1_fmnist_c2_scaffold]="${TABLE1_SCAFFOLD[*]@Q}"
ARGS[synthetic_fig9]=""
ARGS[target_perturbation_table2]="--config.training.rounds=6 ${SMALL_GRID[*]@Q}"
ARGS[num_clients_fig9c]="--config.training.rounds=15 --config.sweep.seeds='(0,1,2)' \
--config.sweep.methods='(\"fedpals\",\"fedavg\")' ${SMALL_GRID[*]@Q}"
ARGS[local_epochs_fig8b]="--config.sweep.seeds='(0,1,2)' --config.sweep.methods='(\"fedpals\",\"fedavg\")' \
--config.sweep.axes.training.local_epochs='(1,2,5,10)' --config.sweep.axes.training.rounds='(10,5,2,1)' \
--config.sweep.grid.training.learning_rate='(0.1,)' --config.sweep.grid.algorithm.ess_fraction='(0.25,)'"
# The paper's six E at a budget of E x rounds = 40 (the paper: 150), one seed.
ARGS[local_epochs_fig8b_all_e]="--config.sweep.seeds='(0,)' --config.sweep.methods='(\"fedpals\",\"fedavg\")' \
--config.sweep.axes.training.local_epochs='(1,2,5,10,20,40)' --config.sweep.axes.training.rounds='(40,20,8,4,2,1)' \
--config.sweep.grid.training.learning_rate='(0.1,)' --config.sweep.grid.algorithm.ess_fraction='(0.25,)'"
ARGS[beyond_adaptive_lambda_c3]="--config.training.rounds=10"
ARGS[beyond_adaptive_lambda_c2]="--config.training.rounds=10"
# Experiments whose config file is not configs/<name>.py.
declare -A CONFIG
CONFIG[table1_fmnist_c3_scaffold]="configs/table1_fmnist_c3.py"
CONFIG[local_epochs_fig8b_all_e]="configs/local_epochs_fig8b.py"
CONFIG[table1_fmnist_c3_long]="configs/table1_fmnist_c3.py"
CONFIG[table1_fmnist_c2_scaffold]="configs/table1_fmnist_c2.py"
CONFIG[beyond_adaptive_lambda_c3]="configs/beyond_adaptive_lambda.py:3"
CONFIG[beyond_adaptive_lambda_c2]="configs/beyond_adaptive_lambda.py:2"
CONFIG[beyond_unknown_target_c3]="configs/beyond_unknown_target.py:3"
CONFIG[beyond_unknown_target_c2]="configs/beyond_unknown_target.py:2"
CONFIG[beyond_feddisco_fedlc_c3]="configs/beyond_feddisco_fedlc.py:3"
CONFIG[beyond_feddisco_fedlc_c2]="configs/beyond_feddisco_fedlc.py:2"
# Loss reweighting (IW-ERM, T known and estimated; IW-ERM+FedPALS) and FedVLS(+FedPALS) beside
# FedPALS, FedAvg and the Oracle on Table 1's rows (issue 60); the config's "session" budget:
# 10 rounds, learning rate 0.1, lam = 0, 64 runs a row.
CONFIG[beyond_loss_reweighting_c3]="configs/beyond_loss_reweighting.py:3,session"
CONFIG[beyond_loss_reweighting_c2]="configs/beyond_loss_reweighting.py:2,session"
# Commands of their own: the weights picture (no training) on a partition whose clients differ
# in size (NIID-Bench's "#C=3": each label split evenly among its holders).
declare -A RAW
# FedRS' gap to the paper: Table 1's FedRS and FedAvg runs re-evaluated with the target's
# restricted softmax at test time (no training; needs table1_fmnist_c3 and _c2 first).
# The unknown-T ablation's report (stopping rules, L1 errors, figure) of both rows.
RAW[beyond_unknown_target]="experiments.unknown_target_report \
--sweeps=$ROOT/beyond_unknown_target_c3,$ROOT/beyond_unknown_target_c2"
RAW[fedrs_restricted_eval]="experiments.restricted_eval \
--sweeps=$ROOT/table1_fmnist_c3,$ROOT/table1_fmnist_c2 --methods=fedrs,fedavg --alphas=0.5,0.1,0"
RAW[weights]="experiments.weights --config=configs/default.py \
--config.partition.scheme=niid_bench_sparsity --config.partition.labels_per_client=3"
# Experiments that merge sweeps' tables (experiments.compare): rows of one task become one row.
# Both rows in one table, and every method against FedPALS seed by seed (paired.md).
RAW[beyond_loss_reweighting]="experiments.compare \
--tables=$ROOT/beyond_loss_reweighting_c3,$ROOT/beyond_loss_reweighting_c2 --paired=fedpals \
--title='IW-ERM and FedVLS beside FedPALS: target test accuracy'"
declare -A COMPARE
COMPARE[table1_fmnist]="table1_fmnist_c3,table1_fmnist_c3_scaffold,table1_fmnist_c2,table1_fmnist_c2_scaffold"
COMPARE[beyond_adaptive_lambda]="table1_fmnist_c3,beyond_adaptive_lambda_c3,table1_fmnist_c2,beyond_adaptive_lambda_c2"
COMPARE[beyond_server_optimizers]="table1_fmnist_c3,beyond_fedadam_fedpals_c3,beyond_fedavgm_c3,\
table1_fmnist_c2,beyond_fedadam_fedpals_c2,beyond_fedavgm_c2"
COMPARE[beyond_feddisco_fedlc]="table1_fmnist_c3,beyond_feddisco_fedlc_c3,table1_fmnist_c2,beyond_feddisco_fedlc_c2"
FEDDISCO_FEDLC="--config.training.rounds=10 \
--config.sweep.methods='(\"feddisco\",\"fedlc\")' --config.sweep.grid.training.learning_rate='(0.1,)' \
--config.sweep.grid.algorithm.feddisco_a='(0.5,)' --config.sweep.grid.algorithm.feddisco_b='(0.1,)' \
--config.sweep.grid.algorithm.fedlc_tau='(1.0,)'"
ARGS[beyond_loss_reweighting_c3]=""
ARGS[beyond_loss_reweighting_c2]=""
ARGS[beyond_feddisco_fedlc_c3]="$FEDDISCO_FEDLC"
ARGS[beyond_feddisco_fedlc_c2]="$FEDDISCO_FEDLC"
ARGS[beyond_private_marginals]="--config.training.rounds=5 --config.sweep.seeds='(0,1)' ${SMALL_GRID[*]@Q}"
# DP on the model updates (issue 46): the config holds the budget (40 rounds, 3 seeds, 75 runs:
# 49 min on 2 cores, planned for at most 75); its report gives every ESS fraction's accuracy
# against epsilon and the figure.
ARGS[beyond_private_updates]=""
RAW[beyond_private_updates_report]="experiments.dp_updates_report --sweep=$ROOT/beyond_private_updates"
# The same under Poisson sampling (q = 0.1, McMahan et al.'s fixed-denominator estimator):
# 75 runs, 31 min on 2 cores.
ARGS[beyond_private_updates_poisson]=""
CONFIG[beyond_private_updates_poisson]="configs/beyond_private_updates.py:poisson"
RAW[beyond_private_updates_poisson_report]="experiments.dp_updates_report \
--sweep=$ROOT/beyond_private_updates_poisson"
# The config holds the budget (10 rounds, 8 seeds) and the ablation's rows.
ARGS[beyond_unknown_target_c3]=""
ARGS[beyond_unknown_target_c2]=""
# Issue 45, the estimate's feedback loop and its remedies: 20 fresh seeds (11-30) on C = 3
# (240 runs, about 155 min on 2 cores) and C = 2 (160 runs, about 95 min), Table 1's seeds 0-7
# on C = 3 (64 runs) and the issue's held-out seeds 8-10 (27 runs), and a last held-out check on
# seeds 31-50, C = 3 and C = 2, the default and the ensemble (80 runs each, about 95 min each when
# both ran at once beside a test suite); the config holds seeds and rows (the times: the parts'
# measured ones added up).
for part in fresh table1 issue heldout; do
  for c in 3 2; do
    [[ $part != fresh && $part != heldout && $c == 2 ]] && continue
    name="beyond_unknown_target_loop_${part}_c$c"
    ARGS[$name]=""
    CONFIG[$name]="configs/beyond_unknown_target.py:$c,$part"
  done
done
RAW[beyond_unknown_target_loop]="experiments.unknown_target_report \
--sweeps=$ROOT/beyond_unknown_target_loop_fresh_c3,$ROOT/beyond_unknown_target_loop_fresh_c2,\
$ROOT/beyond_unknown_target_loop_table1_c3,$ROOT/beyond_unknown_target_loop_issue_c3"
RAW[beyond_unknown_target_loop_heldout]="experiments.unknown_target_report \
--sweeps=$ROOT/beyond_unknown_target_loop_heldout_c3,$ROOT/beyond_unknown_target_loop_heldout_c2"
# Natural label shift (issue 55): LEAF's Shakespeare, built offline, a 2-core slice (the config
# holds it: 40 roles x 175 windows, Falstaff the target, 20 rounds of 10 participants, FedAvg /
# FedPALS, seeds 0-1: about 45 min on 2 cores), and its label-shift figure; the loss-reweighting
# table's natural row (issue 60) on the same slice and budget: IW-ERM, IW-ERM+FedPALS, FedVLS,
# FedVLS+FedPALS beside FedAvg and FedPALS, a table of its own (its sweep's table.md; the
# paired differences: experiments.compare --tables=<it> --paired=fedpals).
ARGS[natural_shakespeare]=""
CONFIG[natural_shakespeare]="configs/beyond_natural_shakespeare.py"
ARGS[natural_shakespeare_loss_reweighting]=""
CONFIG[natural_shakespeare_loss_reweighting]="configs/beyond_natural_shakespeare.py:loss_reweighting"
RAW[natural_shakespeare_label_shift]="experiments.natural_label_shift \
--out=docs/reproduction/shakespeare_label_shift.png"
# A plain argparse script, not a main of experiments/flags.py: no extra flag reaches it.
declare -A NO_SHARED_FLAGS=([natural_shakespeare_label_shift]=1)
# Every client as its own target (issue 56): Fashion-MNIST C = 3 and C = 2, 100 training clients,
# 10 % a round, 15 rounds; FedAvg with fine-tuning, Ditto and local training, FedPALS once per
# client (ESS 25 %), seeds 0-1: about 45 min a seed on 2 cores.
ARGS[per_client_c3]=""
CONFIG[per_client_c3]="configs/beyond_per_client_fmnist.py"
ARGS[per_client_c2]=""
CONFIG[per_client_c2]="configs/beyond_per_client_fmnist.py:2"
# Server optimisers (Reddi et al., 2021) on Table 1's rows at the session budget (the config's
# "session": 10 rounds, learning rate 0.1, FedAdam+FedPALS at lam = 0, server eta over two
# values: FedAdam {0.01, 0.03}, FedAvgM {1.0, 0.3}), 8 seeds; 16 runs each.
for c in 3 2; do
  for m in fedadam fedavgm; do
    if [[ $m == fedadam ]]; then name="beyond_fedadam_fedpals_c$c"; else name="beyond_fedavgm_c$c"; fi
    ARGS[$name]=""
    CONFIG[$name]="configs/beyond_server_optimizers.py:$c,$m,session"
  done
done
ORDER=(table1_fmnist_c3 table1_fmnist_c3_scaffold table1_fmnist_c3_long beyond_adaptive_lambda_c3
       table1_fmnist_c2 table1_fmnist_c2_scaffold beyond_adaptive_lambda_c2
       synthetic_fig9
       target_perturbation_table2 beyond_feddisco_fedlc_c3 beyond_feddisco_fedlc_c2
       beyond_loss_reweighting_c3 beyond_loss_reweighting_c2
       beyond_unknown_target_c3 beyond_unknown_target_c2 beyond_unknown_target_loop_fresh_c3
       beyond_unknown_target_loop_fresh_c2 beyond_unknown_target_loop_table1_c3
       beyond_unknown_target_loop_issue_c3 beyond_unknown_target_loop_heldout_c3
       beyond_unknown_target_loop_heldout_c2
       beyond_fedadam_fedpals_c3 beyond_fedavgm_c3 beyond_fedadam_fedpals_c2
       beyond_fedavgm_c2 beyond_private_marginals beyond_private_updates beyond_private_updates_poisson
       natural_shakespeare natural_shakespeare_label_shift natural_shakespeare_loss_reweighting
       per_client_c3 per_client_c2
       num_clients_fig9c local_epochs_fig8b
       local_epochs_fig8b_all_e weights fedrs_restricted_eval table1_fmnist beyond_adaptive_lambda beyond_unknown_target
       beyond_unknown_target_loop beyond_unknown_target_loop_heldout beyond_feddisco_fedlc
       beyond_loss_reweighting
       beyond_server_optimizers beyond_private_updates_report beyond_private_updates_poisson_report)

# Everything runs from main(), called on the last line: bash has then read the whole file, so
# editing it while an experiment runs cannot change what the running call does next.
command_for() {
  if [[ -n "${RAW[$1]+set}" ]]; then
    echo ".venv/bin/python -m ${RAW[$1]} --workdir=$ROOT/$1"
  elif [[ -n "${COMPARE[$1]+set}" ]]; then
    local tables
    tables=$(echo "${COMPARE[$1]}" | sed "s|\([^,]*\)|$ROOT/\1|g")
    echo ".venv/bin/python -m experiments.compare --tables=$tables --workdir=$ROOT/$1"
  else
    echo ".venv/bin/python -m experiments.sweep --config=${CONFIG[$1]:-configs/$1.py} --workdir=$ROOT/$1 ${ARGS[$1]}"
  fi
}

main() {
  if [[ $# -lt 1 ]]; then
    echo "usage: bash scripts/reproduce.sh <experiment>|all|--list [experiments.sweep flags]" >&2
    return 2
  fi
  name="$1"; shift
  if [[ "$name" == "--list" ]]; then
    for n in "${ORDER[@]}"; do echo "$n:"; echo "  $(command_for "$n")"; done
    return 0
  fi
  if [[ "$name" == "all" ]]; then
    for n in "${ORDER[@]}"; do bash "$0" "$n" "$@" || return $?; done
    return 0
  fi
  if [[ -z "${ARGS[$name]+set}" && -z "${COMPARE[$name]+set}" && -z "${RAW[$name]+set}" ]]; then
    echo "unknown experiment '$name'; one of: ${ORDER[*]}" >&2
    return 2
  fi
  mkdir -p "$ROOT/$name"
  start=$(date +%s)
  if [[ -n "${RAW[$name]+set}" || -n "${COMPARE[$name]+set}" ]]; then
    local kept=()
    for a in "$@"; do
      if [[ ( "$a" == --quiet || "$a" == --noquiet ) && -z "${NO_SHARED_FLAGS[$name]+set}" ]]; then
        kept+=("$a")
      fi
    done
    set -- ${kept[@]+"${kept[@]}"}
  fi
  eval "$(command_for "$name") \"\$@\""
  echo "$name: $(( $(date +%s) - start )) s wall" | tee -a "$ROOT/$name/wall_time.txt"
}

main "$@"; exit $?
