"""What a method's ``loss`` hook sees of one training step (built by :class:`~fdlit.clients.ClientModule`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossContext:
    """One training step of one client, as the method's ``loss`` hook sees it.

    ``logits`` (B x C) and ``target`` (B labels in the private phase, B x C probabilities in the public
    one) hold the step's real rows only: where an executor pads batches (the vectorized executor),
    the framework evaluates the hook row by row and averages over real rows, so a hook written as a
    plain mean over its batch is exact under every executor. ``base`` is the client's own loss
    (cross-entropy against the labels or the teacher) over the same rows. ``state`` is the method's
    client-side state (under the vectorized executor: this client's slice of ``loss_state_keys``).
    ``weight`` is given only to a part that declares ``rowwise_loss = False`` (it then averages with
    :meth:`mean` itself). ``features`` (B x D) are the penultimate features of the forward that
    produced ``logits``, given to a part that declares ``needs_features = True`` (FedProto), else None
    (:mod:`fdlit.clients.features`)."""

    client: torch.nn.Module  # the ClientModule whose step this is
    phase: str  # "private" or "public"
    logits: torch.Tensor
    target: torch.Tensor
    base: torch.Tensor
    state: dict[str, torch.Tensor]
    weight: torch.Tensor | None = None
    features: torch.Tensor | None = None

    def mean(self, per_row: torch.Tensor) -> torch.Tensor:
        """The mean of per-row values over the step's real rows (padding rows weigh 0)."""
        if self.weight is None:
            return per_row.mean()
        return (per_row * self.weight).sum() / self.weight.sum()
