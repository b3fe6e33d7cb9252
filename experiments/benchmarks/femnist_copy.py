"""A FEMNIST-sized federated data set, written in LEAF's JSON and in TFF's SQLite formats.

FEMNIST itself cannot be downloaded here, so the load and round benchmark
(`experiments.benchmarks.natural_data`) reads a generated copy of its size and shape: 3,400
writers, about 700,000 28x28 grey images of 62 classes (LEAF's FEMNIST: 3,597 writers and
805,263 images; TFF's: 3,400 writers, 671,585 train and 77,483 test images), each writer
holding a skewed share of the classes, pixels k / 255 as LEAF and TFF store them.

Written exactly in the published schemas, with no code of the readers:
* LEAF (github.com/TalwalkarLab/leaf, ``data/femnist``): ``train/`` and ``test/`` directories
  of JSON files of 100 users each, ``{"users", "num_samples", "user_data": {uid: {"x": [784
  floats], "y": [labels]}}}``, each user's samples split 90/10 by position (LEAF's
  ``--tf 0.9``).
* TFF's ``SqlClientData`` (tensorflow_federated ``simulation/datasets/sql_client_data.py``):
  tables ``examples(split_name, client_id, serialized_example_proto)`` and
  ``client_metadata(client_id, split_name, num_examples)``; each example a serialized
  ``tf.train.Example`` with the float feature ``pixels`` (784) and the int64 feature
  ``label``, as TFF's EMNIST has them, encoded here from the protobuf wire format.

Usage: ``python -m experiments.benchmarks.femnist_copy --out DIR [--clients 3400]
[--formats leaf,tff]``; it prints what it wrote and how long it took. Deterministic given
--seed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sqlite3
import struct
import sys
import time

import numpy as np

NUM_CLASSES = 62
SIDE = 28
MEAN_EXAMPLES = 206  # ~700,000 over 3,400 writers
USERS_PER_FILE = 100  # LEAF's data_to_json writes 100 writers a file
TRAIN_FRACTION = 0.9

# The 256 JSON spellings of k / 255, as Python's json writes the floats LEAF computes.
_FLOAT_TEXT = [json.dumps(k / 255) for k in range(256)]


def _writers(num_clients: int, seed: int):
    """(writer id, pixels (n, 784) uint8 k, labels (n,)) per writer, deterministic."""
    rng = np.random.default_rng(seed)
    templates = rng.random((NUM_CLASSES, SIDE * SIDE)) < 0.18  # a stroke pattern per class
    popularity = np.r_[np.full(10, 4.0), np.full(52, 1.0)]  # digits are most written
    popularity /= popularity.sum()
    for w in range(num_clients):
        n = int(np.clip(rng.lognormal(np.log(MEAN_EXAMPLES) - 0.08, 0.4), 20, 900))
        share = rng.dirichlet(popularity * 30)  # a writer's own class mix
        labels = rng.choice(NUM_CLASSES, size=n, p=share)
        ink = templates[labels] ^ (rng.random((n, SIDE * SIDE)) < 0.04)
        pixels = np.where(ink, rng.integers(0, 90, size=ink.shape), 255).astype(np.uint8)
        yield f"f{w:04d}_{w % 97:02d}", pixels, labels


def _split(n: int) -> int:
    return max(1, int(round(TRAIN_FRACTION * n))) if n > 1 else 1


def write_leaf(out: pathlib.Path, num_clients: int, seed: int) -> dict:
    """LEAF's train/ and test/ JSON files; returns the counts written."""
    counts = {"train": 0, "test": 0}
    for split in counts:
        (out / split).mkdir(parents=True, exist_ok=True)
    batch: list = []

    def flush(index: int) -> None:
        for split in ("train", "test"):
            users, sizes, parts = [], [], []
            for uid, pixels, labels in batch:
                cut = _split(len(labels))
                rows = slice(0, cut) if split == "train" else slice(cut, None)
                x, y = pixels[rows], labels[rows]
                if not len(y):
                    continue
                users.append(uid)
                sizes.append(len(y))
                xs = ",".join("[" + ",".join(_FLOAT_TEXT[k] for k in row) + "]" for row in x)
                parts.append(f"{json.dumps(uid)}: {{\"x\": [{xs}], \"y\": {json.dumps(y.tolist())}}}")
                counts[split] += len(y)
            path = out / split / f"all_data_{index}_niid_0_keep_0_{split}_9.json"
            with open(path, "w") as f:  # LEAF's key order: users, num_samples, user_data
                f.write(f"{{\"users\": {json.dumps(users)}, \"num_samples\": {json.dumps(sizes)}, "
                        f"\"user_data\": {{{', '.join(parts)}}}}}")
        batch.clear()

    for w, writer in enumerate(_writers(num_clients, seed)):
        batch.append(writer)
        if len(batch) == USERS_PER_FILE:
            flush(w // USERS_PER_FILE)
    if batch:
        flush(num_clients // USERS_PER_FILE)
    return counts


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # a length-delimited field (wire type 2)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example(pixels: np.ndarray, label: int) -> bytes:
    """tf.train.Example{features{feature{"pixels": float_list}, {"label": int64_list}}}:
    Example.features = 1; Features.feature = 1 (map entries: key = 1, value = 2);
    Feature.float_list = 2, int64_list = 3; FloatList.value = 1 and Int64List.value = 1,
    packed (example.proto and feature.proto of TensorFlow)."""
    floats = (pixels.astype(np.float32) / np.float32(255)).astype("<f4").tobytes()
    pixel_feature = _field(2, _field(1, floats))
    label_feature = _field(3, _field(1, _varint(label)))
    entries = (_field(1, _field(1, b"pixels") + _field(2, pixel_feature))
               + _field(1, _field(1, b"label") + _field(2, label_feature)))
    return _field(1, entries)


def write_tff(path: pathlib.Path, num_clients: int, seed: int) -> dict:
    """TFF's SqlClientData file; returns the counts written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    counts = {"train": 0, "test": 0}
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
                   "serialized_example_proto BLOB NOT NULL)")
        db.execute("CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT "
                   "NULL, num_examples INTEGER NOT NULL)")
        for uid, pixels, labels in _writers(num_clients, seed):
            cut = _split(len(labels))
            for split, rows in (("train", slice(0, cut)), ("test", slice(cut, None))):
                x, y = pixels[rows], labels[rows]
                if not len(y):
                    continue
                db.executemany("INSERT INTO examples VALUES (?, ?, ?)",
                               ((split, uid, _example(p, int(k))) for p, k in zip(x, y)))
                db.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (uid, split, len(y)))
                counts[split] += len(y)
        db.execute("CREATE INDEX idx_examples_client_id ON examples (client_id)")
        db.execute("CREATE INDEX idx_examples_client_id_split ON examples (split_name, client_id)")
        db.execute("CREATE INDEX idx_metadata_client_id ON client_metadata (client_id)")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--clients", type=int, default=3400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--formats", default="leaf,tff")
    args = parser.parse_args(argv)
    for fmt in args.formats.split(","):
        started = time.perf_counter()
        if fmt == "leaf":
            where = args.out / "leaf"
            counts = write_leaf(where, args.clients, args.seed)
        elif fmt == "tff":
            where = args.out / "tff" / "femnist_copy.sqlite"
            counts = write_tff(where, args.clients, args.seed)
        else:
            print(f"error: unknown format {fmt!r} (leaf, tff)", file=sys.stderr)
            return 2
        size = sum(f.stat().st_size for f in ([where] if where.is_file() else where.rglob("*")))
        print(f"{fmt}: {args.clients} writers, {counts['train']} train + {counts['test']} test "
              f"examples ({(counts['train'] + counts['test']) * SIDE * SIDE / 2**20:.0f} MiB as "
              f"uint8) -> {where} ({size / 2**20:.0f} MiB on disk) in "
              f"{time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
