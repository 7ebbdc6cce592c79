"""What an attack does to a round, measured (logged under ``adversaries/``):

* ``adversaries/attackers``: attackers whose upload reached the server this round;
* ``adversaries/weight``: their total weight in what the server made of the uploads. For a rule
  with per-client weights W (M x N, columns summing to 1): E_x sum_{i attacker} W[i, x], the
  attackers' share of the teacher (AVG: their share of the clients); for parameter exchange, their
  share of the global model (``clients/model_share`` where the rule reports it, e.g. Krum's selection,
  else FedAvg's n_k / n). NaN for a rule that reports neither;
* ``adversaries/honest_global_acc`` and ``adversaries/honest_local_acc``: the mean accuracy of the
  clients that are not attackers this round, after the exchange (global: the whole test set;
  local: the test samples of the client's own classes);
* ``adversaries/attack_success`` (targeted attacks only): the share of the honest clients'
  predictions on test samples of the attack's source classes that are the target class.
"""

from __future__ import annotations

import math

import torch

from fdlit.adversaries.attacks import Attack
from fdlit.adversaries.views import PartsView, PlanView
from fdlit.methods.base import AggregationResult, Aggregator


def attackers_weight(method: Aggregator, result: AggregationResult | None, arrived: list[int],
                     attackers: frozenset[int]) -> float:
    rows = [j for j, i in enumerate(arrived) if i in attackers]
    if result is None:
        return math.nan
    if result.weights is not None:
        return float(result.weights[rows].sum(0).mean()) if rows else 0.0
    shares = result.stats.get("clients/model_share")
    if shares is None and result.broadcast:
        shares = method.model_shares(arrived)
    if shares is None:
        return math.nan
    return float(sum(shares[j] for j in rows))


def attack_metrics(parts: PartsView, attackers: frozenset[int], attack: Attack, plan: PlanView,
                   result: AggregationResult | None, after_public: dict[str, torch.Tensor] | None) -> dict[str, float]:
    arrived = list(plan.arrived)
    out: dict[str, float] = {"adversaries/attackers": sum(i in attackers for i in arrived),
                           "adversaries/weight": attackers_weight(parts.server.method, result, arrived, attackers)}
    honest = [i for i in range(len(parts.clients)) if i not in attackers]
    for name in ("global_acc", "local_acc"):
        accs = None if after_public is None else after_public[name]
        out[f"adversaries/honest_{name}"] = (math.nan if accs is None or not honest
                                             else float(accs[honest].mean()))
    target = attack.targeted(parts.num_classes)
    if target is not None:
        out["adversaries/attack_success"] = math.nan
        if after_public is not None and honest:
            out["adversaries/attack_success"] = attack_success(parts, honest, plan.eval_rows, *target)
    return out


@torch.no_grad()
def attack_success(parts: PartsView, honest: list[int], rows: torch.Tensor | None, sources: list[int],
                   target: int) -> float:
    x, y = parts.tensors.test_x, parts.tensors.test_y
    if rows is not None:
        x, y = x[rows], y[rows]
    chosen = torch.isin(y, torch.tensor(sources, device=y.device))
    if not bool(chosen.any()):
        return math.nan
    preds = parts.clients.predict(x[chosen], honest).argmax(-1)  # H x T
    return float((preds == target).float().mean())
