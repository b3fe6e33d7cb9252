r"""Beyond the paper: FedPALS' weights under user-level DP on the model updates (issue 46).

  python -m experiments.sweep --config=configs/beyond_private_updates.py \
      --workdir=runs/beyond_private_updates
  # smoke test: --config.training.rounds=2 --config.sweep.seeds='(0,)'
  python -m experiments.dp_updates_report --sweep=runs/beyond_private_updates \
      --workdir=runs/beyond_private_updates_report     # every ESS's table, the figure

The same sweep command again skips the finished runs and resumes the others (resumable).

DP-FedAvg (`algorithm.dp_clip_norm`, docs/guide/privacy.md "Private updates"): every
participant's update clipped to L2 norm C, the weighted aggregate noised with std
sigma * C * max_i alpha_i, sigma calibrated before training to the row's target epsilon over
the run's rounds (`dp_target_epsilon`; dp-accounting's RDP accountant, m of M clients drawn
without replacement, replace-one-client neighbours). The unit of privacy is one client.

Choices, and why:

* **Clients: M = 1,000 training clients** (`partition.num_clients = 1001`: the target is one
  more), **q = 0.1** (`training.clients_per_round = 100`). User-level DP needs many users: the
  noise per coordinate is sigma * C / m for FedAvg's equal weights, so m = 100 participants a
  round is the least that lets the aggregate survive a sigma of a few; 1,000 clients also give
  amplification by subsampling (q = 0.1). With Fashion-MNIST's 60,000 training images and the
  paper's sparsity sampling (C = 3 labels a client, equal counts) each client, the target
  included, holds 54 examples (18 per label): the target's validation set is 54 examples, so
  the best-validation round is chosen on a coarse signal.
* **Epsilon in {1, 2, 4, 8} and no DP** (a task axis, zipped: `dp_clip_norm` None makes the
  no-DP row, which the sweep cannot express as a number of `dp_target_epsilon`).
* **delta = 1e-5**, not 1/M^1.1 = 5.0e-4: both satisfy delta < 1/M, but at 5.0e-4 a mechanism
  allowed to fail with probability delta per client may expose M * delta = 0.5 of the 1,000
  clients, at 1e-5 0.01 of them; 1e-5 is also the package's default `dp_delta` and label DP's.
  It costs 15-30 % more noise (sigma at 40 rounds: 10.7 / 5.9 / 3.5 / 2.1 for epsilon
  1 / 2 / 4 / 8, against 8.3 / 4.7 / 2.9 / 1.8 at 5.0e-4).
* **Clip norm C = 0.5**: the median L2 norm of the unclipped client updates, measured on a
  no-DP FedAvg run of this task (40 rounds, seed 0, q = 0.1, every participant's norm each
  round): median 0.56 over rounds 1-40 (0.54 over rounds 11-40; 10th / 90th percentiles 0.40 /
  0.87; rising from 0.41 at round 1 to 0.78 at round 10, then falling to 0.5). Clipping at the
  median clips roughly half the updates (Andrew et al., NeurIPS 2021, found the median a good
  target) and keeps the noise, which is proportional to C, as small as that bias allows.
* **FedAvg and FedPALS at ESS 10 / 25 / 50 / 90 % of N** (`algorithm.ess_fraction`, a grid:
  the protocol selects one per epsilon on the validation set, and every point is reported).
  All are reachable on seeds 0-2 (the lowest reachable fraction, ESS(alpha^{0+}) / N, is
  0.2-0.7 %). With 100 participants FedAvg's max_i alpha_i is 0.010 each round; FedPALS' per-
  round max alpha (re-solved on the participants at the run's lambda, averaged over 30 random
  draws) is about 0.065 at ESS 10 %, 0.020 at 25 %, 0.014 at 50 % and 0.011 at 90 %: its noise
  is 6.5x, 2x, 1.4x and 1.1x FedAvg's at the same epsilon (over the sweep's own rounds: 7.6x,
  2.1x, 1.4x, 1.1x). ESS 10 % is where concentrated
  weights pay for DP; lambda -> 0+ (max alpha near 1 a round) would need 100x the noise.
* Fashion-MNIST, LeNet, E = 1, batch 32, learning rate 0.1 (Table 1's), evaluation every round,
  3 seeds (0, 1, 2).

**Budget** (a 2-core CPU shared with other jobs): 40 rounds, 3 seeds, 75 runs (5 epsilon rows x
(FedAvg + FedPALS at 4 ESS) x 3 seeds) = 3,000 run-rounds, planned for at most 75 minutes of
wall time; the run of 2026-11-28 took 49 min (2,960 s), 24 runs diverging before round 40
(REPRODUCTION.md, "DP on model updates"). Measured before choosing the rounds: one run with
`python -m experiments.run` (M = 1,000, q = 0.1, DP on) trains 1.4-1.6 s a round (0.65-0.7
rounds/s); in the sweep, runs that differ only in the seed, lambda and the DP
keys train together on the engine's runs axis (up to 16 a program), 0.6-1.5 s per run-round
depending on the load; the whole sweep at 4 rounds took 451 s, about 150 s of it start-up and
compilation.

**Poisson sampling** (`:poisson`): the same clients, grid, seeds and rounds, each client taking
part with probability q = 0.1 a round (161 lanes, 100 clients drawn on average), weighted by
McMahan et al.'s fixed-denominator estimator (alpha over every client / q) and accounted
zero-out (the Poisson-subsampled Gaussian; dp-accounting's REPLACE_SPECIAL): the epsilons are
for another neighbouring relation than the rows above (REPRODUCTION.md, "Under Poisson
sampling"). 75 runs in 1,869 s
(31 min) on the 2-core VM, 23 diverged; regenerated 2026-12-02 after the batch-mates fix in
4,072 s beside a test suite, 23 diverged.
"""

import ml_collections

import fedjax_pals as fjp

CLIP_NORM = 0.5  # about the median update norm measured without DP (docstring)
EPSILONS = (1.0, 2.0, 4.0, 8.0)
SAMPLING_RATE = 0.1  # ":poisson": each client's probability a round (the 100 of 1,000's share)


def get_config(argument: str = ""):
    """The experiment; `argument` "poisson" (`--config=configs/beyond_private_updates.py:poisson`):
    the same clients under Poisson sampling, each with probability q = 0.1 a round, weighted by
    McMahan et al.'s fixed-denominator estimator and accounted with zero-out neighbours
    (module docstring)."""
    if argument not in ("", "poisson"):
        raise ValueError(f"the argument must be '' or 'poisson', got {argument!r}.")
    config = fjp.default_config()
    config.dataset.name = "fashion_mnist"
    config.partition.scheme = "sparsity"
    config.partition.labels_per_client = 3
    config.partition.num_clients = 1001  # 1,000 training clients + the target
    config.training.clients_per_round = 100  # q = 0.1, drawn without replacement each round
    config.training.rounds = 40
    config.training.local_epochs = 1
    config.training.batch_size = 32
    config.training.learning_rate = 0.1
    config.training.eval_every = 1
    config.algorithm.dp_delta = 1e-5
    row = "Fashion-MNIST C=3, 1,000 clients, DP on updates"
    if argument == "poisson":
        config.training.clients_per_round = None
        config.training.client_sampling = "poisson"
        config.training.client_fraction = SAMPLING_RATE
        row += ", Poisson sampling"
    config.sweep = ml_collections.ConfigDict(
        dict(
            row=row,
            seeds=(0, 1, 2),
            methods=("fedavg", "fedpals"),
            grid=dict(algorithm=dict(ess_fraction=(0.1, 0.25, 0.5, 0.9))),
            axes=dict(
                algorithm=dict(
                    dp_clip_norm=(None,) + (CLIP_NORM,) * len(EPSILONS),
                    dp_target_epsilon=(None,) + EPSILONS,
                )
            ),
            zip_axes=True,
            figures=("curves",),
            x_axis="dp_target_epsilon",
        )
    )
    return config
