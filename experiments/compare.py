r"""Merges the tables of several sweeps into one Table 1 (one row per sweep row).

  python -m experiments.sweep --config=configs/table1_fmnist_c3.py --workdir=runs/t1_fmnist_c3
  python -m experiments.sweep --config=configs/table1_fmnist_c2.py --workdir=runs/t1_fmnist_c2
  python -m experiments.compare --tables=runs/t1_fmnist_c3,runs/t1_fmnist_c2 --workdir=runs/t1

Reads <dir>/table.json of each sweep (written by `fjp.run_sweep`), writes the merged
table.md, table.json and comparison.png to --workdir and prints the table; with
--paired=<method>, also paired.md and paired.json: every method against that one, seed by
seed. The selection rule is each sweep's own (fedjax_pals/experiment/protocol.py); all must
use the same one.
"""

from __future__ import annotations

import json
import os
import time

from absl import flags

from . import flags as common

fjp = common.fjp  # fedjax_pals, imported (with JAX) at its first use: --help prints at once

_TABLES = flags.DEFINE_list("tables", None, "Sweep workdirs (or table.json files) to merge.")
_TITLE = flags.DEFINE_string("title", "Table 1: target test accuracy", "Caption of the table.")
_PAIRED = flags.DEFINE_string(
    "paired", None,
    "A method key of the tables (e.g. fedpals): also write paired.md and paired.json, each "
    "method's accuracy minus this one's seed by seed (mean, sample std, seeds ahead / behind, "
    "paired t-test p).")
flags.mark_flags_as_required(["tables", "workdir"])
common.require_items(_TABLES, "sweep workdir or table.json")


def _load(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "table.json")
    if not os.path.isfile(path):
        raise SystemExit(
            f"error: {path} does not exist; run the sweep ({common.command_for('sweep')}) first."
        )
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, ValueError) as error:
        raise SystemExit(
            f"error: cannot read {path} ({type(error).__name__}: {' '.join(str(error).split())}); "
            f"it is not a table.json written by {common.command_for('sweep')}: run that sweep "
            "again."
        ) from None
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
        raise SystemExit(
            f"error: {path} is not a table.json written by {common.command_for('sweep')} (no "
            "'rows'); run "
            "that sweep again."
        )
    return table


def main(argv):
    del argv  # a stray argument is refused by common.run
    tables = [_load(path) for path in _TABLES.value]
    try:
        table = fjp.experiment.protocol.merge_tables(tables, title=_TITLE.value)
    except ValueError as error:
        raise SystemExit(f"error: {error}")
    started = time.time()
    fjp.experiment.protocol.write_protocol_report(common.WORKDIR.value, table)
    print(fjp.experiment.protocol.table_markdown(table))
    print()
    if _PAIRED.value:
        try:
            text = fjp.experiment.protocol.write_paired_report(
                common.WORKDIR.value, table, _PAIRED.value)
        except ValueError as error:
            raise SystemExit(f"error: --paired: {error}")
        print(text)
        print()
    common.print_written(common.WORKDIR.value, started)


def entry() -> None:
    """The `fedjax-pals-compare` command (`python -m experiments.compare`)."""
    common.run(main, takes=common.WRITES)


if __name__ == "__main__":
    entry()
