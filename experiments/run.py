r"""Runs one federated experiment and writes results.json and a plot.

  python -m experiments.run --dataset=fashion_mnist --algorithm=fedpals \
      --partition=sparsity --labels_per_client=3 --ess_fraction=0.5 \
      --rounds=50 --output_dir=runs/fmnist_c3_fedpals

Flags can come from a file: --flagfile=configs/x.flags. The run writes
`<output_dir>/results.json` after every evaluation and keeps a checkpoint
there: a killed run started again with the same flags resumes where it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

import fedjax_pals as fjp

FLAGS = flags.FLAGS

flags.DEFINE_enum("dataset", "synthetic", ["synthetic", "fashion_mnist", "cifar10"], "Data set.")
flags.DEFINE_enum(
    "model",
    "auto",
    ["auto", "logistic_regression", "lenet"],
    "Model; auto = logistic regression for synthetic, LeNet otherwise.",
)
flags.DEFINE_string(
    "algorithm",
    "fedpals",
    "fedavg | fedpals | fedprox | scaffold | afl | fedrs | fedshift | oracle.",
)
flags.DEFINE_enum(
    "weights",
    None,
    ["fedavg", "fedpals"],
    "Server weighting for the client-side methods fedprox, fedrs, fedshift "
    "(default: FedAvg). fedprox with --weights=fedpals is FedProx+FedPALS.",
)
flags.DEFINE_float(
    "lam", None, "FedPALS trade-off lambda (eq. 8). Default 0 unless --ess_fraction."
)
flags.DEFINE_float("ess_fraction", None, "Choose lambda so that ESS = fraction * N (App. B.3).")
flags.DEFINE_enum("partition", "sparsity", ["sparsity", "dirichlet"], "Label-shift partition.")
flags.DEFINE_integer("labels_per_client", 3, "C, labels per client (sparsity partition).")
flags.DEFINE_float("dirichlet_beta", 0.1, "beta of the per-client Dir_K(beta) partition.")
flags.DEFINE_integer("num_clients", 10, "Clients including the target client (the paper's 10).")
flags.DEFINE_integer("clients_per_round", None, "Participants per round (default: all).")
flags.DEFINE_float("client_fraction", None, "Participants per round as a fraction.")
flags.DEFINE_integer("rounds", 20, "Communication rounds.")
flags.DEFINE_integer("local_epochs", 1, "Local epochs E per round.")
flags.DEFINE_integer("batch_size", 32, "Local minibatch size.")
flags.DEFINE_float("learning_rate", 0.1, "Local SGD learning rate.")
flags.DEFINE_integer("eval_every", 1, "Evaluate the global model every k rounds.")
flags.DEFINE_integer("seed", 0, "Seed of the partition, initialisation and training.")
flags.DEFINE_float(
    "delta", 0.5, "Synthetic task: T_delta = (1-delta)[.5,.25,.25] + delta[0,.5,.5]."
)
flags.DEFINE_string("data_dir", None, "Directory with the data set files (see README).")
flags.DEFINE_string("output_dir", "runs/latest", "Where results.json, the plot and checkpoint go.")
flags.DEFINE_enum("strategy", "auto", ["auto", *fjp.STRATEGIES], "Client-axis execution strategy.")
flags.DEFINE_integer("chunk_size", 64, "Clients per chunk for the vmap_chunked strategy.")
flags.DEFINE_float("prox_mu", 0.01, "FedProx proximal weight mu.")
flags.DEFINE_float("server_lr", 1.0, "SCAFFOLD server learning rate eta_g.")
flags.DEFINE_float("afl_step", 0.1, "AFL step size of the mixture weights.")
flags.DEFINE_float("fedrs_alpha", 0.5, "FedRS scaling of absent classes' logits.")
flags.DEFINE_boolean("fedrs_soft", False, "FedRS soft variant.")
flags.DEFINE_boolean("overwrite", False, "Start afresh even if output_dir holds a run.")

# The flags that define an experiment (and so its results.json / checkpoint).
CONFIG_KEYS = (
    "dataset",
    "model",
    "algorithm",
    "weights",
    "lam",
    "ess_fraction",
    "partition",
    "labels_per_client",
    "dirichlet_beta",
    "num_clients",
    "clients_per_round",
    "client_fraction",
    "rounds",
    "local_epochs",
    "batch_size",
    "learning_rate",
    "eval_every",
    "seed",
    "delta",
    "data_dir",
    "strategy",
    "chunk_size",
    "prox_mu",
    "server_lr",
    "afl_step",
    "fedrs_alpha",
    "fedrs_soft",
)


def config_from_flags() -> dict:
    return {key: FLAGS[key].value for key in CONFIG_KEYS}


def load_task(config: dict) -> tuple[fjp.Dataset, fjp.FederatedPartition]:
    """The data set and its label-shift partition, as the config describes."""
    if config["dataset"] == "synthetic":
        return fjp.synthetic_label_shift_task(config["delta"], seed=config["seed"])
    dataset = fjp.load_dataset(config["dataset"], data_dir=config["data_dir"])
    common = dict(
        num_clients=config["num_clients"], seed=config["seed"], num_classes=dataset.num_classes
    )
    if config["partition"] == "sparsity":
        partition = fjp.sparsity_partition(
            dataset.train.y, dataset.test.y, labels_per_client=config["labels_per_client"], **common
        )
    else:
        partition = fjp.dirichlet_partition(
            dataset.train.y, dataset.test.y, beta=config["dirichlet_beta"], **common
        )
    return dataset, partition


def choose_lambda(config: dict, partition: fjp.FederatedPartition) -> float:
    if config["lam"] is not None and config["ess_fraction"] is not None:
        raise ValueError("give --lam or --ess_fraction, not both.")
    if config["ess_fraction"] is not None:
        return float(
            fjp.lambda_for_ess(
                partition.client_label_dists,
                partition.target_label_dist,
                partition.client_sizes,
                config["ess_fraction"],
            )
        )
    return 0.0 if config["lam"] is None else float(config["lam"])


def _config_digest(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def _write_json(path: str, payload: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)


def plot_curves(path: str, curves: dict, title: str) -> None:
    """Target accuracy per round: test solid, validation dotted, one colour per run.

    A curve whose values are a list per seed is drawn as its mean with a +-1 std band.
    """
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.0, 4.2))
    handles = []
    for index, (label, curve) in enumerate(curves.items()):
        color = f"C{index % 10}"
        rounds = np.asarray(curve["rounds"])
        for key, style in (("target_accuracy", "-"), ("val_accuracy", ":")):
            values = np.asarray(curve[key], dtype=float)
            mean = values.mean(0) if values.ndim == 2 else values
            ax.plot(rounds, mean, style, color=color, marker="." if len(rounds) < 15 else None)
            if values.ndim == 2 and key == "target_accuracy" and len(values) > 1:
                std = values.std(0)
                ax.fill_between(
                    rounds, mean - std, mean + std, color=color, alpha=0.15, linewidth=0
                )
        handles.append(Line2D([], [], color=color, label=label))
    handles += [
        Line2D([], [], color="gray", linestyle="-", label="target test"),
        Line2D([], [], color="gray", linestyle=":", label="target validation"),
    ]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_experiment(
    config: dict, output_dir: str, *, overwrite: bool = False, log_prefix: str = ""
) -> dict:
    """Runs the experiment `config` (see CONFIG_KEYS) and returns its results."""
    os.makedirs(output_dir, exist_ok=True)
    digest = _config_digest(config)
    checkpoint = os.path.join(output_dir, "checkpoint.msgpack")
    results_path = os.path.join(output_dir, "results.json")
    if os.path.exists(checkpoint):
        previous = None
        if os.path.exists(results_path):
            with open(results_path) as f:
                previous = json.load(f).get("config_digest")
        if overwrite:
            os.remove(checkpoint)
        elif previous != digest:
            raise ValueError(
                f"{output_dir} holds a run with another configuration; choose another --output_dir "
                "or pass --overwrite."
            )

    dataset, partition = load_task(config)
    lam = choose_lambda(config, partition)
    name = config["algorithm"]
    if name == "oracle":
        # FedAvg on clients resampled to the target label distribution (App. B.5).
        partition = fjp.oracle_partition(partition, dataset.train.y, seed=config["seed"])
    algorithm = fjp.make_algorithm(
        name,
        partition=partition,
        lam=lam,
        prox_mu=config["prox_mu"],
        server_lr=config["server_lr"],
        afl_step=config["afl_step"],
        fedrs_alpha=config["fedrs_alpha"],
        fedrs_soft=config["fedrs_soft"],
        weights=config["weights"],
    )
    model_name = config["model"]
    if model_name == "auto":
        model_name = "logistic_regression" if config["dataset"] == "synthetic" else "lenet"
    model = fjp.make_model(model_name, dataset.train.x.shape[1:], dataset.num_classes)
    training = fjp.LocalTraining(
        local_epochs=config["local_epochs"],
        batch_size=config["batch_size"],
        learning_rate=config["learning_rate"],
    )
    clients_per_round = fjp.clients_per_round_from(
        partition.num_clients, config["clients_per_round"], config["client_fraction"]
    )

    # The weights the algorithm's weighting gives with every client taking part,
    # at the initial state (AFL's then move from round to round).
    sizes, dists = partition.client_sizes, partition.client_label_dists
    initial = fjp.init_server_state(
        algorithm, model.init(jax.random.PRNGKey(0)), partition.num_clients
    )
    everyone = (np.arange(partition.num_clients),) if algorithm.weighting.uses_participants else ()
    alpha = algorithm.weighting.weights(
        jnp.asarray(dists, jnp.float32), jnp.asarray(sizes, jnp.float32), initial, *everyone
    )
    partition_summary = partition.summary()
    summary = {
        "config": config,
        "config_digest": digest,
        "dataset_source": dataset.source,
        "partition": partition_summary,
        "lam": lam,
        "alpha": np.asarray(alpha).tolist(),
        "ess": float(fjp.effective_sample_size(alpha, sizes)),
        "total_examples": int(np.sum(sizes)),
        "projection_distance": partition_summary["projection_distance"],
        "clients_per_round": clients_per_round,
        "strategy": fjp.engine.resolve_strategy(config["strategy"], model),
    }
    logging.info(
        "%s%s on %s: lam=%.4g ESS=%.0f/%d d(T,S)=%.4g, %d rounds",
        log_prefix,
        name,
        partition.description,
        lam,
        summary["ess"],
        summary["total_examples"],
        summary["projection_distance"],
        config["rounds"],
    )
    started = time.perf_counter()

    def on_evaluation(done: int, metrics: dict, history: fjp.TrainingHistory) -> None:
        # results.json is rewritten at every evaluation: a killed run loses nothing.
        _write_json(results_path, results_of(history))
        elapsed = time.perf_counter() - started
        logging.info(
            "%sround %d/%d  target acc %.4f  val acc %.4f  train loss %.4f  (%.0fs)",
            log_prefix,
            done,
            config["rounds"],
            metrics["test"]["accuracy"],
            metrics["val"]["accuracy"],
            metrics["train_loss"],
            elapsed,
        )

    def results_of(history: fjp.TrainingHistory) -> dict:
        best = history.best_val_index()
        return {
            **summary,
            **history.to_dict(),
            "final_target_accuracy": history.target_accuracy[-1],
            "final_target_macro_f1": history.target_macro_f1[-1],
            "best_val_round": history.rounds[best],
            "target_accuracy_at_best_val": history.target_accuracy[best],
            "target_macro_f1_at_best_val": history.target_macro_f1[best],
        }

    _, history = fjp.run_training(
        algorithm,
        model,
        dataset,
        partition,
        training,
        rounds=config["rounds"],
        seed=config["seed"],
        eval_every=config["eval_every"],
        clients_per_round=clients_per_round,
        strategy=config["strategy"],
        chunk_size=config["chunk_size"],
        checkpoint_path=checkpoint,
        on_evaluation=on_evaluation,
    )
    results = results_of(history)
    _write_json(results_path, results)
    plot_curves(
        os.path.join(output_dir, "curves.png"),
        {name: results},
        f"{name} on {partition.description}",
    )
    return results


def main(argv):
    del argv
    config = config_from_flags()
    results = run_experiment(config, FLAGS.output_dir, overwrite=FLAGS.overwrite)
    print(
        f"final target accuracy {results['final_target_accuracy']:.4f}; "
        f"at best val (round {results['best_val_round']}) "
        f"{results['target_accuracy_at_best_val']:.4f}; {results['wall_seconds']:.1f}s"
    )
    print(f"wrote {os.path.join(FLAGS.output_dir, 'results.json')} and curves.png")


if __name__ == "__main__":
    app.run(main)
