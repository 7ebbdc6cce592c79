"""What fdlit asks of wandb to keep logging cheap, kept apart from what the run logs.

The wandb module is passed in (``wandb_settings(wandb, ...)``), so that wandb_logger.py stays the only
module importing it. Each change below skips work whose result nothing in an fdlit run can see:

* wandb asks whether a logged value is a pandas DataFrame by importing pandas (~0.4 CPU s) at the
  first value that is not a plain number; without pandas imported nothing can be a DataFrame.
* ``wandb.init`` imports W&B Launch (its agent, public API and artifact models: ~0.5 CPU s in a
  process that has imported torch) only to apply inputs a Launch job staged in this process; staging
  them imports that module first, so without it imported there is nothing to apply.

Console capture, system metrics and the requirements file are settings (``wandb_settings``).
"""

from __future__ import annotations

import sys
from typing import Any

LAUNCH_INPUTS = "wandb.sdk.launch.inputs.internal"  # where W&B Launch stages a job's inputs


def skip_unused_work(wandb: Any) -> None:
    """Skip the pandas import and the Launch import described above (each only where nothing can use it)."""
    util = getattr(wandb, "util", None)
    if hasattr(util, "pd_available") and "pandas" not in sys.modules:
        util.pd_available = False
    run_class = getattr(getattr(getattr(wandb, "sdk", None), "wandb_run", None), "Run", None)
    apply_inputs = getattr(run_class, "_detect_and_apply_job_inputs", None)
    if apply_inputs is not None and not getattr(apply_inputs, "_fdlit_skips_unstaged", False):
        def detect_and_apply_job_inputs(run):
            if LAUNCH_INPUTS in sys.modules:
                apply_inputs(run)

        detect_and_apply_job_inputs._fdlit_skips_unstaged = True
        run_class._detect_and_apply_job_inputs = detect_and_apply_job_inputs


def wandb_settings(wandb: Any, config: Any) -> Any:
    """``wandb.Settings`` for an fdlit run (``config``: the ``logger`` section): start-up bounded by
    ``init_timeout_s``; no console capture (it costs CPU every line; fdlit's summary and run
    directory hold the results); without ``system_metrics``, no sampling of the machine's use and no
    requirements file (reading every installed package's metadata: ~0.3 CPU s)."""
    quiet = not config.system_metrics
    return wandb.Settings(init_timeout=config.init_timeout_s, console="off", x_disable_stats=quiet,
                          x_save_requirements=not quiet)
