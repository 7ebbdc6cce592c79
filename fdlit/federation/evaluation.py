"""Evaluating the clients: global accuracy on the whole test set (or a fixed subsample of it), local
accuracy on the test samples of each client's own classes (Kovalchuk et al. 2026, App. B)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Accuracies = dict[str, "torch.Tensor | int"]  # every client's accuracies (M-vectors) and ``test_samples``


class Evaluation:
    """The held-out tensors on the device and how every client is measured on them.

    ``correct(x, y, rows)`` says which samples every client predicts right (M x T), wherever the clients
    live: an executor may measure it where they are, so their predictions need not leave them."""

    def __init__(self, correct: Callable[..., torch.Tensor], test: tuple[torch.Tensor, torch.Tensor],
                 local_masks: torch.Tensor, validation: tuple[torch.Tensor | None, torch.Tensor | None]):
        self.correct = correct  # (x, y, rows) -> M x N correctness, wherever the clients live
        self.test_x, self.test_y = test
        self.local_mask_matrix = local_masks  # M x T: test samples of each client's own classes
        self.val_x, self.val_y = validation

    def __call__(self, rows: torch.Tensor | None = None, ids: list[int] | None = None) -> Accuracies:
        """Global accuracy (whole test set, or its ``rows``) and local accuracy (those test samples
        of the client's own classes), micro-averaged, for every client (or the clients ``ids``, in
        that order); ``test_samples``: how many test samples that was."""
        out = {}
        if self.val_y is not None:  # the (small) validation set
            out["val_acc"] = self._correct(self.val_x, self.val_y, None, ids).mean(1)
        masks = self.local_mask_matrix if ids is None else self.local_mask_matrix[ids]
        masks = masks if rows is None else masks[:, rows]
        # micro accuracy (correct / total; torchmetrics' MulticlassAccuracy defaults to macro), for
        # all clients in one op: 80 per-client metric calls a round cost more than the predictions
        correct = self._correct(self.test_x, self.test_y, rows, ids)
        out.update(global_acc=correct.mean(1), local_acc=(correct * masks).sum(1) / masks.sum(1).clamp_min(1))
        # a client that could not be reached (a deployment's node is gone): no accuracy
        unreachable = correct.isnan().all(1) if correct.shape[1] else torch.zeros(len(correct), dtype=torch.bool)
        out = {k: v.masked_fill(unreachable.to(v.device), math.nan).cpu() if bool(unreachable.any()) else v.cpu()
               for k, v in out.items()}
        return {**out, "test_samples": correct.shape[1]}

    def _correct(self, x, y, rows, ids):
        return self.correct(x, y, rows) if ids is None else self.correct(x, y, rows, ids)


def updated(before: Accuracies, ids: list[int], measured: Accuracies) -> Accuracies:
    """``before`` (every client's accuracies) with the clients ``ids`` measured again (``measured``)."""
    out: Accuracies = {}
    index = torch.tensor(ids, dtype=torch.long)
    for k, v in before.items():
        if k == "test_samples":
            out[k] = v
        else:
            out[k] = v.clone()
            out[k][index] = measured[k].to(v.dtype)
    return out
