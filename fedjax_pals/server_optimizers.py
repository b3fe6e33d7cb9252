"""Deprecated since 0.3.0: the server optimisers moved to `fedjax_pals.algorithms.server_optimizers`
(beside the methods whose server update they replace).

`import fedjax_pals.server_optimizers` (and `from fedjax_pals.server_optimizers import ...`)
still works, gives that module and warns; fedjax_pals 0.4.0 refuses it. Fix: import
`fedjax_pals.algorithms.server_optimizers`, or use the public names `fjp.ServerOptimizer`,
`fjp.register_server_optimizer`, `fjp.registered_server_optimizers`.
"""

import sys

from fedjax_pals import deprecation
from fedjax_pals.algorithms import server_optimizers as _moved

deprecation.warn(
    "fedjax_pals.server_optimizers moved to fedjax_pals.algorithms.server_optimizers; import it "
    "from there (or use fjp.ServerOptimizer, fjp.register_server_optimizer).",
    refused_in="0.4.0",
)
# The same module object: what a user's code registers or patches through the old name is
# what the package uses.
sys.modules[__name__] = _moved
