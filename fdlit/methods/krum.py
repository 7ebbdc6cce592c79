"""Krum and Multi-Krum: the parameter vector closest to its neighbours."""

from __future__ import annotations

import torch

from fdlit.errors import ConfigError
from fdlit.methods.base import AggregationResult
from fdlit.methods.fedavg import FedAvg


def krum_scores(vectors: torch.Tensor, byzantine: int) -> torch.Tensor:
    """s(i) = sum over the M - f - 2 nearest other vectors j of ||V_i - V_j||^2 (at least one neighbour)."""
    m = len(vectors)
    distances = torch.cdist(vectors.double()[None], vectors.double()[None])[0].pow(2)
    distances.fill_diagonal_(float("inf"))
    neighbours = max(m - byzantine - 2, 1)
    return distances.topk(min(neighbours, m - 1), dim=1, largest=False).values.sum(1)


class Krum(FedAvg):
    """Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer 2017, *Machine Learning with
    Adversaries: Byzantine Tolerant Gradient Descent*, Sec. 4 and the m-Krum variant):

        s(i) = sum_{j in N_i} ||w_i - w_j||^2,   N_i: the M - f - 2 clients closest to i
        Krum: w_{t+1} = w_{i*},  i* = argmin_i s(i);   Multi-Krum: the mean of the m lowest-scoring

    for M uploads of which at most f are Byzantine. The guarantee needs M > 2f + 2; the rule runs for
    M >= f + 3 (under client sampling, with fewer uploads, N_i keeps at least one neighbour). The
    selection is logged as each client's share of the global model (``clients/model_share``: 1/m for the
    selected). The client part and set-up are FedAvg's; the mean is unweighted.

    Args:
        byzantine: f, the number of attackers the rule tolerates (>= 0).
        selected: m, how many lowest-scoring updates are averaged (1: Krum).
    """

    short_name = "krum"
    label = "Krum"  # how tables and figures name the method
    secure_refusal = "scores every upload by its distances to the others, which needs the individual uploads"

    def __init__(self, byzantine: int = 1, selected: int = 1):
        super().__init__()
        if byzantine < 0:
            raise ConfigError("aggregator.byzantine", f"must be >= 0, got {byzantine}")
        if selected < 1:
            raise ConfigError("aggregator.selected", f"must be >= 1, got {selected}")
        self.byzantine, self.selected = byzantine, selected

    def check_clients(self, num_clients: int) -> None:
        if num_clients < self.byzantine + 3:
            raise ConfigError("aggregator.byzantine", f"Krum with f = {self.byzantine} needs at least f + 3 = "
                              f"{self.byzantine + 3} clients, got {num_clients}; allowed: 0 to {num_clients - 3}")
        if self.selected > num_clients:
            raise ConfigError("aggregator.selected", f"must be at most the number of clients, {num_clients}; "
                              f"got {self.selected}")

    def aggregate(self, uploads, ctx):
        vectors = torch.stack([u["parameters"] for u in uploads])
        scores = krum_scores(vectors, self.byzantine)
        chosen = scores.argsort()[: min(self.selected, len(vectors))]
        shares = torch.zeros(len(vectors), dtype=torch.float64)
        shares[chosen.cpu()] = 1.0 / len(chosen)
        return AggregationResult(teacher=None, broadcast={"parameters": vectors[chosen].mean(0)},
                                 stats={"clients/model_share": shares.tolist()})
