"""``self.log`` of a client's step: values kept per name until the executor takes their means."""

from __future__ import annotations

import torch


def under_transform(value) -> bool:
    """True for a tensor inside ``torch.func`` transforms (vmap, grad): it has no single value to record."""
    return isinstance(value, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(value)


class StepLog:
    """Logged values of one client since the last :meth:`take` (sums and counts, so a long phase stays small)."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def record(self, name: str, value) -> None:
        # under the vectorized executor's vmap a value is a batched tensor: nothing is recorded there
        if under_transform(value):
            return
        value = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
        self.sums[name] = self.sums.get(name, 0.0) + value
        self.counts[name] = self.counts.get(name, 0) + 1

    def take(self) -> dict[str, float]:
        """The mean of each name's values since the last call; clears them."""
        means = {k: self.sums[k] / self.counts[k] for k in self.sums}
        self.sums, self.counts = {}, {}
        return means
