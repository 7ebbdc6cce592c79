"""The Oracle: label-using diagnostic upper bound on "who to trust". NEVER a default."""

from __future__ import annotations

import torch

from fdlit.aggregators.base import AggregationResult, Aggregator


class OracleAggregator(Aggregator):
    """!!! USES THE TRUE PUBLIC LABELS. DIAGNOSTIC UPPER BOUND, NEVER A DEFAULT. !!!

    W[i, x] proportional to 1[ y(x) in C_i ],   P(x) = sum_i W[i, x] Q_i(x)

    where y(x) is the true label of public sample x (known only in simulation) and C_i client i's
    class set. It shows how much a perfect "who to trust" rule could gain over AVG (ALGORITHMS.md,
    "Oracle"). It is not a federated algorithm: the server reads ``loop.data.public.y`` and every
    client's class set in ``on_fit_start``; nothing besides the logits is uploaded, so its bytes are
    AVG's. A public sample whose class no client holds (possible under Dirichlet partitions) gets
    uniform weights (**choice**). Still averages *probabilities* of all holders, so it is an upper
    bound on weighting rules, not on the teacher (the true label itself would be).
    """

    short_name = "oracle"

    def __init__(self):
        self.holds: torch.Tensor | None = None  # M x N bool: client i holds the class of sample x

    def on_fit_start(self, loop):
        device = loop.public_x.device
        y = loop.data.public.y.to(device)
        classes = torch.zeros(len(loop.data.clients), loop.data.num_classes, dtype=torch.bool, device=device)
        for i, cd in enumerate(loop.data.clients):
            classes[i, cd.classes] = True
        self.set_truth(y, classes)

    def set_truth(self, public_labels: torch.Tensor, client_classes: torch.Tensor) -> None:
        """public_labels: N ints; client_classes: M x C bool (client i holds class c)."""
        self.holds = client_classes[:, public_labels]

    def aggregate(self, uploads):
        if self.holds is None:
            raise RuntimeError("OracleAggregator needs the public labels: call on_fit_start or set_truth first")
        z = self.stack_logits(uploads)
        holds = self.holds.to(z.device).float()
        count = holds.sum(0, keepdim=True)
        uniform = torch.full_like(holds, 1.0 / holds.shape[0])
        weights = torch.where(count > 0, holds / count.clamp_min(1.0), uniform)
        stats = {"oracle/unheld_samples": float((count == 0).sum())}
        return AggregationResult(teacher=self.mix(weights, z.softmax(-1)), weights=weights, stats=stats)
