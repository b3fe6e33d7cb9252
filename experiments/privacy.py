r"""What a run of a config guarantees, without training: its privacy statement.

  python -m experiments.privacy --config=configs/default.py \
      --config.algorithm.dp_clip_norm=0.5 --config.algorithm.dp_target_epsilon=8

Prints the mechanisms the run applies (DP on the model updates: clip norm, noise multiplier,
given or calibrated to algorithm.dp_target_epsilon exactly as the run calibrates it, rounds,
the clients' sampling, the accountant and its neighbouring relation; DP on the label
marginals: mechanism and noise), the (epsilon, delta) they spend, the unit of privacy and the
assumptions in words; a config without DP says that none is applied. The numbers come from the
accountant function the training calls, so they are what the run's results.json records
(`dp_epsilon`, `dp_noise_multiplier`). The config is validated as a run's (the same
--config.<key>=<value> overrides); no data set is loaded, no model built, nothing is written.
--json prints the statement as JSON instead: strict JSON, where a value without a finite
number (epsilon when sigma = 0: no guarantee) is null, as the "text" field says in words.
"""

from __future__ import annotations

import json
import math
from typing import Any

from absl import flags

from . import flags as common

fjp = common.fjp  # fedjax_pals, imported (with JAX) at its first use: --help prints at once

_CONFIG = common.define_config_file("config", None, "Run config file (configs/*.py).")
_JSON = flags.DEFINE_boolean(
    "json", False,
    "Print the statement as JSON (its fields and text; epsilon null where there is no guarantee).")
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv  # a stray argument is refused by common.run
    with common.user_errors():
        statement = fjp.privacy_statement(_CONFIG.value)
    if _JSON.value:
        print(json.dumps(_finite_or_null(statement.as_dict()), indent=2, allow_nan=False))
    else:
        print(statement.text(), end="")


def _finite_or_null(value: Any) -> Any:
    """`value` with every infinite or NaN float replaced by None: Python's `Infinity` is not
    JSON, and jq or a browser refuse it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def entry() -> None:
    """The `fedjax-pals-privacy` command (`python -m experiments.privacy`)."""
    common.run(main, takes=())


if __name__ == "__main__":
    entry()
