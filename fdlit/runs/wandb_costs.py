"""What fdlit asks of wandb to keep logging cheap, kept apart from what the run logs.

The wandb module is passed in (``wandb_settings(wandb, ...)``), so that wandb_logger.py stays the only
module importing it. Each change below skips work whose result nothing in an fdlit run can see:

* wandb asks whether a logged value is a pandas DataFrame by importing pandas (~0.4 CPU s) at the
  first value that is not a plain number; without pandas imported nothing can be a DataFrame.
* ``wandb.init`` imports W&B Launch (its agent, public API and artifact models: ~0.5 CPU s in a
  process that has imported torch) only to apply inputs a Launch job staged in this process; staging
  them imports that module first, so without it imported there is nothing to apply.

* pydantic fills each model field's description from the attribute docstrings below it, which it
  finds by searching every loaded module's file for each frame of the class's definition (slow in a
  process that has imported torch); wandb's settings and API models ask for it, nothing in a run
  reads a description, so while wandb imports and logs (``without_field_docstrings``) it is skipped.

Console capture, system metrics and the requirements file are settings (``wandb_settings``).

The last two replace a private function: each is checked first to take the parameters its stand-in
takes (:mod:`fdlit.internals`); one that does not is left as it is (the import it would skip costs
its CPU seconds; nothing else changes), said once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fdlit.internals import MovedInternal, expect_function, fell_back

LAUNCH_INPUTS = "wandb.sdk.launch.inputs.internal"  # where W&B Launch stages a job's inputs


def skip_unused_work(wandb: Any) -> None:
    """Skip the pandas import and the Launch import described above (each only where nothing can use it)."""
    util = getattr(wandb, "util", None)
    if hasattr(util, "pd_available") and "pandas" not in sys.modules:
        util.pd_available = False
    run_class = getattr(getattr(getattr(wandb, "sdk", None), "wandb_run", None), "Run", None)
    apply_inputs = getattr(run_class, "_detect_and_apply_job_inputs", None)
    if apply_inputs is not None and not getattr(apply_inputs, "_fdlit_skips_unstaged", False):
        if not _takes_exactly(run_class, "_detect_and_apply_job_inputs", ("self",)):
            return
        def detect_and_apply_job_inputs(run):
            if LAUNCH_INPUTS in sys.modules:
                apply_inputs(run)

        detect_and_apply_job_inputs._fdlit_skips_unstaged = True
        run_class._detect_and_apply_job_inputs = detect_and_apply_job_inputs


def _takes_exactly(owner: Any, name: str, parameters: tuple[str, ...]) -> bool:
    """``owner.name`` takes ``parameters`` and no others (its stand-in takes those); else one note."""
    import inspect

    try:
        fn = expect_function(owner, name, parameters)
        if len(inspect.signature(fn).parameters) != len(parameters):
            raise MovedInternal(f"{getattr(owner, '__name__', owner)}.{name} takes more than {', '.join(parameters)}")
    except MovedInternal as exc:
        fell_back(f"{exc}: left as it is (W&B's start-up costs what it costs without fdlit)")
        return False
    return True


@contextmanager
def without_field_docstrings() -> Iterator[None]:
    """Models defined inside skip pydantic's docstring search (their fields keep no description)."""
    try:
        from pydantic._internal import _fields
    except ImportError:  # no pydantic, or another layout: nothing to skip
        yield
        return
    search = getattr(_fields, "extract_docstrings_from_cls", None)
    if search is None or not _takes_exactly(_fields, "extract_docstrings_from_cls", ("cls", "use_inspect")):
        yield
        return
    _fields.extract_docstrings_from_cls = lambda cls, use_inspect=False: {}
    try:
        yield
    finally:
        _fields.extract_docstrings_from_cls = search


def wandb_settings(wandb: Any, config: Any) -> Any:
    """``wandb.Settings`` for an fdlit run (``config``: the ``logger`` section): start-up bounded by
    ``init_timeout_s``; no console capture (it costs CPU every line; fdlit's summary and run
    directory hold the results); without ``system_metrics``, no sampling of the machine's use and no
    requirements file (reading every installed package's metadata: ~0.3 CPU s); without ``verbose``,
    none of W&B's own console output (its banners, run history and summary blocks: ``silent``)."""
    quiet = not config.system_metrics
    silent = not getattr(config, "verbose", False)
    return wandb.Settings(init_timeout=config.init_timeout_s, console="off", x_disable_stats=quiet,
                          x_save_requirements=not quiet, silent=silent, quiet=silent)
