"""The Oracle: label-using diagnostic upper bound on "who to trust". NEVER a default."""

from __future__ import annotations

import torch

from fdlit.methods.base import AggregationResult, Aggregator


class Oracle(Aggregator):
    """!!! USES THE TRUE PUBLIC LABELS. DIAGNOSTIC UPPER BOUND, NEVER A DEFAULT. !!!

    W[i, x] proportional to 1[ y(x) in C_i ],   P(x) = sum_i W[i, x] Q_i(x)

    where y(x) is the true label of public sample x (known only in simulation) and C_i client i's
    class set. It shows how much a perfect "who to trust" rule could gain over AVG (docs/algorithms.md,
    "Oracle"). It is not a federated algorithm: the server reads the public labels and every client's class
    set (``ServerContext.public_y``, ``client_classes``) in ``server_setup``; nothing besides the logits is uploaded, so its bytes are
    AVG's. A public sample whose class no client holds (possible under Dirichlet partitions) gets
    uniform weights (**choice**). Still averages *probabilities* of all holders, so it is an upper
    bound on weighting rules, not on the teacher (the true label itself would be).
    """

    short_name = "oracle"
    label = "Oracle"  # how tables and figures name the method

    def __init__(self):
        self.holds: torch.Tensor | None = None  # M x N bool: client i holds the class of sample x

    def server_setup(self, uploads, ctx):
        """Reads the simulation truth once: the public labels and every client's class set."""
        y = ctx.public_y.to(ctx.info.public_x.device)
        classes = torch.zeros(ctx.info.num_clients, ctx.info.num_classes, dtype=torch.bool, device=y.device)
        for i, own in enumerate(ctx.client_classes):
            classes[i, list(own)] = True
        self.set_truth(y, classes)
        return {}

    def state_dict(self):
        return {"holds": self.holds}

    def load_state_dict(self, state):
        self.holds = state["holds"]

    def set_truth(self, public_labels: torch.Tensor, client_classes: torch.Tensor) -> None:
        """public_labels: N ints; client_classes: M x C bool (client i holds class c)."""
        self.holds = client_classes[:, public_labels]

    def aggregate(self, uploads, ctx):
        if self.holds is None:
            raise RuntimeError("Oracle needs the public labels: run its set-up or set_truth first")
        z = self.stack_logits(uploads)
        holds = ctx.info.rows(self.holds).to(z.device).float()  # arrived clients
        count = holds.sum(0, keepdim=True)
        uniform = torch.full_like(holds, 1.0 / holds.shape[0])
        weights = torch.where(count > 0, holds / count.clamp_min(1.0), uniform)
        stats = {"oracle/unheld_samples": float((count == 0).sum())}
        return AggregationResult(teacher=self.mix(weights, z.softmax(-1)), weights=weights, stats=stats)
