"""Measurement: the round's metrics, and the run's summary.

The clients' accuracies come from :mod:`fdlit.federation.evaluation`. Teacher quality and the
who-to-trust matrix use the public labels: diagnostics only, never used for training.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from fdlit.errors import NumericalFault, check_finite  # noqa: F401  (re-exported: the round raises them)
from fdlit.execution import steps
from fdlit.federation.diagnostics import trust_matrix
from fdlit.federation.evaluation import Accuracies
from fdlit.federation.participation import participation_metrics
from fdlit.messages import JSON, Metrics
from fdlit.methods.base import AggregationResult, weight_concentration, weight_entropy
from fdlit.privacy.audit import membership_audit
from fdlit.privacy.guarantee import privacy_summary
from fdlit.privacy.upload_audit import prediction_membership

if TYPE_CHECKING:
    from fdlit.federation.communication import CommunicationLedger
    from fdlit.federation.round_facts import RoundPlan
    from fdlit.federation.round_parts import RoundParts


def accuracy_metrics(after_private: Accuracies | None, after_public: Accuracies | None, with_validation: bool
                     ) -> Metrics:
    """Mean, min, max and per-client accuracies after each phase; NaN (and no per-client lists)
    for a phase that was not evaluated this round."""
    metrics: Metrics = {}
    for phase, accs in (("after_private", after_private), ("after_public", after_public)):
        for name in ("global_acc", "local_acc"):
            if accs is None:
                for stat in ("mean", "min", "max"):
                    metrics[f"{phase}/{name}_{stat}"] = math.nan
                continue
            values = accs[name]
            known = values[~values.isnan()]  # all but unreachable clients
            metrics[f"{phase}/{name}_mean"] = float(known.mean()) if len(known) else math.nan
            metrics[f"{phase}/{name}_min"] = float(known.min()) if len(known) else math.nan
            metrics[f"{phase}/{name}_max"] = float(known.max()) if len(known) else math.nan
            metrics[f"clients/{phase}/{name}"] = values.tolist()
        metrics[f"{phase}/test_samples"] = 0 if accs is None else accs["test_samples"]
        if with_validation:  # selection without the test set (summary: selected_*)
            metrics[f"{phase}/val_acc_mean"] = math.nan if accs is None else float(accs["val_acc"].nanmean())
    return metrics


def teacher_metrics(result: AggregationResult | None, public_y: torch.Tensor) -> dict[str, float]:
    """Teacher quality against the public labels of the round's rows (diagnostic only)."""
    if result is None or result.teacher is None:  # baselines, rounds where no upload arrived and
        # parameter exchange have no teacher
        return {"teacher/kept_fraction": math.nan, "teacher/acc": math.nan, "teacher/nll": math.nan}
    p, y = result.teacher, public_y
    if result.keep is not None:
        p, y = p[result.keep], y[result.keep]
    out = {"teacher/kept_fraction": float(len(y) / len(public_y))}
    if len(y):
        out["teacher/acc"] = float((p.argmax(-1) == y).float().mean())
        out["teacher/nll"] = float(-torch.log(p.gather(1, y[:, None]).clamp_min(1e-12)).mean())
    else:
        out["teacher/acc"] = out["teacher/nll"] = math.nan
    if result.weights is not None:
        out["weights/chi"] = float(weight_concentration(result.weights))
        out["weights/entropy"] = float(weight_entropy(result.weights))
    return out


def trust_rows(weights: torch.Tensor, public_y: torch.Tensor, num_classes: int, arrived: Sequence[int],
               num_clients: int) -> list:
    """The M x C who-to-trust matrix; rows of clients that sent nothing this round are null."""
    matrix = trust_matrix(weights, public_y, num_classes)
    if len(arrived) < num_clients:
        by_client = dict(zip(arrived, matrix, strict=True))
        matrix = [by_client.get(i, [None] * num_classes) for i in range(num_clients)]
    return matrix


# ---------------------------------------------------------------------- the run's summary
def _finite(value: JSON) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def selected(evaluated: list[Metrics]) -> Metrics:
    """Selection without the test set: per phase, the test accuracy of the evaluated round with
    the best mean validation accuracy (the earliest such round on a tie). Empty without a
    validation set."""
    out: Metrics = {}
    for phase, suffix in (("after_public", ""), ("after_private", "_after_private")):
        rows = [m for m in evaluated if _finite(m.get(f"{phase}/val_acc_mean"))]
        if rows:
            chosen = max(rows, key=lambda m: m[f"{phase}/val_acc_mean"])
            out[f"selected_global_acc_mean{suffix}"] = chosen[f"{phase}/global_acc_mean"]
            out[f"selected_round{suffix}"] = chosen["round"]
            out[f"selected_val_acc_mean{suffix}"] = chosen[f"{phase}/val_acc_mean"]
            if f"{phase}/test_samples" in chosen:
                out[f"selected_test_samples{suffix}"] = chosen[f"{phase}/test_samples"]
            exact = evaluated[-1]  # the selected round re-measured on the whole test set (federation.selection)
            if exact.get(f"selection/{phase}/round") == chosen["round"]:
                out[f"selected_global_acc_mean{suffix}"] = exact[f"selection/{phase}/global_acc_mean"]
                out[f"selected_test_samples{suffix}"] = exact[f"selection/{phase}/test_samples"]
    return out


def server_summary(evaluated: list[Metrics]) -> Metrics:
    """Best and final server-model accuracy (only runs with a server model log ``server/acc``)."""
    rows = [m for m in evaluated if not math.isnan(m.get("server/acc", math.nan))]
    if not rows:
        return {}
    best = max(rows, key=lambda m: m["server/acc"])
    return {"server_best_acc": best["server/acc"], "server_best_round": best["round"],
            "server_final_acc": rows[-1]["server/acc"], "server_final_nll": rows[-1]["server/nll"]}


def summary(history: list[Metrics], *, rounds_done: int, rounds: int, test_samples: int, ledger: CommunicationLedger,
            wall_time: float, client_classes: list[list[int]], measured_network: str = "") -> Metrics:
    """Best and final numbers over the rounds that evaluated the clients (``eval/test_samples`` > 0;
    a finished run's last round always did, on the whole test set); the bytes the ``ledger`` counted."""
    if not history:
        return {}
    key = "after_public/global_acc_mean"
    evaluated = [m for m in history if m.get("eval/test_samples", 1) > 0] or history[:1]
    best = max(evaluated, key=lambda m: m[key])
    best_private = max(evaluated, key=lambda m: m["after_private/global_acc_mean"])
    # both phases are reported: Kovalchuk et al. 2026 do not say after which phase Table 1's accuracy is taken
    last = evaluated[-1]
    return {
        "rounds": rounds_done,
        "finished": rounds_done == rounds,
        "best_global_acc_mean": best[key],
        "best_round": best["round"],
        "best_global_acc_mean_after_private": best_private["after_private/global_acc_mean"],
        "best_round_after_private": best_private["round"],
        **selected(evaluated),
        "final_round": last["round"],
        "final_test_samples": last.get("eval/test_samples", test_samples),
        "best_test_samples": best.get("after_public/test_samples", best.get("eval/test_samples", test_samples)),
        "best_test_samples_after_private": best_private.get("after_private/test_samples",
                                                            best_private.get("eval/test_samples", test_samples)),
        "final_global_acc_mean": last[key],
        "final_local_acc_mean_after_private": last["after_private/local_acc_mean"],
        "final_local_acc_mean_after_public": last["after_public/local_acc_mean"],
        "final_teacher_acc": history[-1]["teacher/acc"],
        **server_summary(evaluated),
        **privacy_summary(history),
        "bytes_up_total": ledger.total("up"),
        "bytes_down_total": ledger.total("down"),
        "wall_time_s": wall_time,
        "client_classes": client_classes,  # the report boxes them in trust matrices
        "measured_network": measured_network,  # whose accuracy every number above is
    }


def upload_membership(parts: RoundParts) -> Metrics:
    """The membership attack on the client models that made the round's uploads (right after the
    private phase), queried as a server could (fdlit.privacy.upload_audit)."""
    t = parts.tensors
    return prediction_membership(parts.clients.predict, t.private, t.test_x, t.test_y, t.local_masks)


def round_metrics(parts: RoundParts, communicates: bool, plan: RoundPlan, result: AggregationResult | None,
                  losses: tuple[list[float], list[float]], evaluations: tuple[Accuracies | None, Accuracies | None],
                  lost: Sequence[int], started: float) -> Metrics:
    """One round's metrics (``parts``: the federation's RoundParts; ``communicates``: whether the
    round's protocol sends anything): accuracy after each phase, teacher quality, losses, bytes,
    participation, the method's and the executor's statistics, the privacy audit on the last round,
    and the who-to-trust matrix."""
    r = plan.round
    t, clients, server = parts.tensors, parts.clients, parts.server
    private_losses, public_losses = losses
    after_private, after_public = evaluations
    metrics = {"round": r, **accuracy_metrics(after_private, after_public, t.val_y is not None)}
    metrics["eval/test_samples"] = metrics["after_public/test_samples"]  # the curves' phase
    public_y = t.public_y if plan.public_index is None else t.public_y[plan.public_index]
    metrics.update(teacher_metrics(result, public_y))
    metrics["train/private_loss_mean"] = float(torch.tensor(private_losses).mean())
    metrics["train/public_loss_mean"] = float(torch.tensor(public_losses).mean())
    communicating = len(plan.arrived) if communicates else len(clients)
    metrics.update(server.ledger.round_metrics(r, max(communicating, 1)))
    if parts.settings.participation is not None or lost:
        metrics.update(participation_metrics(plan.sampled, plan.arrived, len(public_y)))
    metrics.update(result.stats if result is not None else {})
    metrics["time/round_s"] = time.perf_counter() - started
    metrics.update(steps.timing_metrics(clients.executor))  # e.g. Ray actors' CPU seconds
    metrics.update(steps.logged_metrics(clients.executor))  # clients/log/<name>: the steps' self.log values
    if server.privacy.audit and r == parts.settings.rounds:  # membership inference on the final client models
        metrics.update(membership_audit(clients.predict, t.private, t.test_x, t.test_y, t.local_masks))
    if result is not None and result.weights is not None:  # M x C who-to-trust matrix (diagnostic only)
        metrics["clients/trust_matrix"] = trust_rows(result.weights, public_y, parts.num_classes,
                                                     plan.arrived, len(clients))
    return metrics
