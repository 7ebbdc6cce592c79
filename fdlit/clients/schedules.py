"""What a LightningModule's ``configure_optimizers`` returns, read as Lightning's Trainer reads it,
and its learning-rate schedulers stepped as the Trainer steps them."""

from __future__ import annotations

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


def read_optimizers(returned: Any) -> tuple[torch.optim.Optimizer, list[Schedule]]:
    """(the optimizer, its schedulers) from Lightning's return forms: an optimizer; a dict
    ``{"optimizer": ..., "lr_scheduler": scheduler or {"scheduler": ..., "interval": ..., "frequency": ...}}``;
    or ``([optimizer], [scheduler, ...])``. A client trains with one optimizer."""
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
        raise ConfigError("model.configure_optimizers", "must return one optimizer, a dict with 'optimizer' "
                          f"(and 'lr_scheduler'), or ([optimizer], [schedulers]); got {type(returned).__name__}")
    return optimizer, [_schedule(s) for s in schedulers]


def _schedule(entry: Any) -> Schedule:
    if not isinstance(entry, dict):
        return Schedule(entry)
    interval = entry.get("interval", "epoch")
    if interval not in ("epoch", "step"):
        raise ConfigError("model.configure_optimizers", f"lr_scheduler interval: allowed 'epoch', 'step'; got {interval!r}")
    if entry.get("monitor") is not None:
        raise ConfigError("model.configure_optimizers", "lr_scheduler 'monitor' (ReduceLROnPlateau) is not supported")
    return Schedule(entry["scheduler"], interval, int(entry.get("frequency", 1)))


def step_schedules(schedules: list[Schedule], interval: str, count: int) -> None:
    """Step the schedulers of ``interval`` after the ``count``-th epoch or step (1-based), as the Trainer does."""
    for s in schedules:
        if s.interval == interval and count % s.frequency == 0:
            s.scheduler.step()
