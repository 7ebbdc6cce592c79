"""What a LightningModule's ``configure_optimizers`` returns, read as Lightning's Trainer reads it,
and its learning-rate schedulers stepped as the Trainer steps them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from fdlit.errors import ConfigError


@dataclass
class Schedule:
    """One scheduler: ``interval`` "epoch" (Lightning's default) or "step", every ``frequency`` of them."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1


def read_optimizers(returned: Any, field: str = "model.configure_optimizers") -> tuple[torch.optim.Optimizer, list[Schedule]]:
    """(the optimizer, its schedulers) from Lightning's return forms: an optimizer; a dict
    ``{"optimizer": ..., "lr_scheduler": scheduler or {"scheduler": ..., "interval": ..., "frequency": ...}}``;
    or ``([optimizer], [scheduler, ...])``. A client trains with one optimizer. ``field`` names the
    class whose ``configure_optimizers`` it is in errors."""
    if isinstance(returned, torch.optim.Optimizer):
        return returned, []
    if isinstance(returned, dict):
        optimizer, schedulers = returned.get("optimizer"), returned.get("lr_scheduler")
        schedulers = [] if schedulers is None else [schedulers]
    elif isinstance(returned, (list, tuple)) and len(returned) == 2 and isinstance(returned[0], (list, tuple)):
        optimizers, schedulers = returned
        optimizer = optimizers[0] if len(optimizers) == 1 else None
        schedulers = list(schedulers) if isinstance(schedulers, (list, tuple)) else [schedulers]
    elif isinstance(returned, (list, tuple)) and len(returned) == 1:
        optimizer, schedulers = returned[0], []
    else:
        optimizer, schedulers = None, []
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(field, "must return one optimizer, a dict with 'optimizer' "
                          f"(and 'lr_scheduler'), or ([optimizer], [schedulers]); got {type(returned).__name__}")
    return optimizer, [_schedule(s, field) for s in schedulers]


def _schedule(entry: Any, field: str) -> Schedule:
    scheduler = entry.get("scheduler") if isinstance(entry, dict) else entry
    # a metric-watching scheduler steps on a validation metric, which the rounds do not hand it
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) or (
            isinstance(entry, dict) and entry.get("monitor") is not None):
        raise ConfigError(field, f"lr_scheduler {type(scheduler).__name__} watches a metric ('monitor'), which fdlit "
                          "does not feed it; allowed: schedulers stepped without a metric (StepLR, "
                          "CosineAnnealingLR, LambdaLR, ...)")
    if not isinstance(entry, dict):
        return Schedule(entry)
    interval = entry.get("interval", "epoch")
    if interval not in ("epoch", "step"):
        raise ConfigError(field, f"lr_scheduler interval: allowed 'epoch', 'step'; got {interval!r}")
    return Schedule(scheduler, interval, int(entry.get("frequency", 1)))


def step_schedules(schedules: list[Schedule], interval: str, count: int) -> None:
    """Step the schedulers of ``interval`` after the ``count``-th epoch or step (1-based), as the Trainer does."""
    for s in schedules:
        if s.interval == interval and count % s.frequency == 0:
            s.scheduler.step()


def built_once(configure_optimizers):
    """A ``ClientModule`` subclass's own ``configure_optimizers``, called once per client and read as
    Lightning's Trainer reads it: the client keeps the optimizer (what every caller gets back) and
    steps the schedulers in its epoch and batch hooks, as for a user's own LightningModule."""
    if getattr(configure_optimizers, "built_once", False):
        return configure_optimizers

    @functools.wraps(configure_optimizers)
    def wrapper(self):
        if self._optimizer is None:
            field = f"federation.client_class ({type(self).__name__}.configure_optimizers)"
            self._optimizer, self._schedules = read_optimizers(configure_optimizers(self), field)
        return self._optimizer

    wrapper.built_once = True
    return wrapper


def stepping_hook(hook):
    """``hook`` (a ClientModule epoch or batch hook, where schedulers step) defined again on a subclass
    with its own ``configure_optimizers``: the vectorized executor calls no such hook, and it trains a
    client whose class defines one one at a time (``unsupported_reason``), so its schedulers step."""

    @functools.wraps(hook)
    def stepping(self, *args, **kwargs):
        return hook(self, *args, **kwargs)

    return stepping
