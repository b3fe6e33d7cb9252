"""The experiment layer: configs, train_and_evaluate, workdirs, sweeps (and their shards on a
cluster), metrics, plots."""

# -- EXP-SWEEP: metric writer, progress bar, plots ---------------------------------------------
from fedjax_pals.experiment import interruption, mlflow_writer
from fedjax_pals.experiment.writers import MetricWriter, flatten_hparams, read_metrics
from fedjax_pals.experiment.progress import Progress
from fedjax_pals.experiment.plots import (
    plot_accuracy_vs_distance,
    plot_comparison,
    plot_curves,
    plot_weights_vs_ess,
)
from fedjax_pals.experiment.protocol import (
    PAPER_METHODS,
    PAPER_TABLE_1,
    RunRecord,
    best_val_point,
    merge_tables,
    protocol_grid,
    protocol_table,
    select_method,
    table_markdown,
    write_protocol_report,
)
from fedjax_pals.experiment.sweep import SweepRun, execute_runs, expand_sweep, run_sweep
from fedjax_pals.experiment.shards import Shard, assign_shards, collect_sweep, run_shard
from fedjax_pals.experiment.submission import submit_sweep

# -- EXP-CORE: config, task, workdir, checkpoints, train_and_evaluate -------------------------
from fedjax_pals.experiment.config import (
    ConfigError,
    ResolvedConfig,
    config_differences,
    config_digest,
    default_config,
    resolve_config,
    validate_config,
)
from fedjax_pals.experiment.checkpoints import (
    CheckpointError,
    CheckpointMismatchError,
    Checkpointer,
)
from fedjax_pals.experiment.task import Task, TaskError, build_task
from fedjax_pals.experiment.errors import WorkdirError, WorkdirLockedError
from fedjax_pals.experiment.workdir import Workdir
from fedjax_pals.experiment.train import train_and_evaluate

# fmt: off
__all__ = [
    "interruption", "mlflow_writer", "MetricWriter", "flatten_hparams", "read_metrics", "Progress",
    "plot_accuracy_vs_distance", "plot_comparison", "plot_curves", "plot_weights_vs_ess",
    "PAPER_METHODS", "PAPER_TABLE_1", "RunRecord", "best_val_point",
    "merge_tables", "protocol_grid", "protocol_table", "select_method", "table_markdown",
    "write_protocol_report", "SweepRun", "execute_runs", "expand_sweep", "run_sweep",
    "Shard", "assign_shards", "collect_sweep", "run_shard", "submit_sweep",
    "ConfigError", "ResolvedConfig", "config_differences", "config_digest", "default_config",
    "resolve_config", "validate_config",
    "CheckpointError", "CheckpointMismatchError", "Checkpointer", "Task", "TaskError",
    "build_task", "Workdir", "WorkdirError", "WorkdirLockedError", "train_and_evaluate",
]
# fmt: on
