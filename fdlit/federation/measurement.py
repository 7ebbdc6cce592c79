"""Measurement: evaluating the clients, the round's metrics, and the run's summary.

Global accuracy is measured on the whole test set (or a fixed subsample of it), local accuracy on
the test samples of each client's own classes (Kovalchuk et al. 2026, App. B). Teacher quality and
the who-to-trust matrix use the public labels: diagnostics only, never used for training.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fdlit.errors import NumericalFault, check_finite  # noqa: F401  (re-exported: the round raises them)
from fdlit.federation.diagnostics import trust_matrix
from fdlit.methods.base import weight_concentration, weight_entropy
from fdlit.privacy.audit import membership_audit
from fdlit.privacy.upload_audit import prediction_membership

# the framework's metric namespaces: a method's stat never takes a name in them
FRAMEWORK = ("after_private/", "after_public/", "eval/", "teacher/", "weights/", "train/", "comm/",
             "participation/", "privacy/", "server/", "time/", "selection/", "ray/", "clients/after_private/",
             "clients/after_public/", "clients/trust_matrix", "clients/log/", "adversaries/", "audit/")
METHOD = "method/"  # where a method's stat named like a framework metric is kept instead


def method_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """A method's stats as the run records them: a name in a framework namespace (``teacher/acc``)
    moves under ``method/``, so it can never replace the framework's own metric."""
    return {f"{METHOD}{k}" if k == "round" or k.startswith(FRAMEWORK) else k: v for k, v in stats.items()}


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

    def __call__(self, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Global accuracy (whole test set, or its ``rows``) and local accuracy (those test samples
        of the client's own classes), micro-averaged, for every client; ``test_samples``: how many
        test samples that was."""
        out = {}
        if self.val_y is not None:  # the (small) validation set
            out["val_acc"] = self.correct(self.val_x, self.val_y).mean(1)
        masks = self.local_mask_matrix if rows is None else self.local_mask_matrix[:, rows]
        # micro accuracy (correct / total; torchmetrics' MulticlassAccuracy defaults to macro), for
        # all clients in one op: 80 per-client metric calls a round cost more than the predictions
        correct = self.correct(self.test_x, self.test_y, rows)
        out.update(global_acc=correct.mean(1), local_acc=(correct * masks).sum(1) / masks.sum(1).clamp_min(1))
        # a client that could not be reached (a deployment's node is gone): no accuracy
        unreachable = correct.isnan().all(1) if correct.shape[1] else torch.zeros(len(correct), dtype=torch.bool)
        out = {k: v.masked_fill(unreachable.to(v.device), math.nan).cpu() if bool(unreachable.any()) else v.cpu()
               for k, v in out.items()}
        return {**out, "test_samples": correct.shape[1]}


def accuracy_metrics(after_private, after_public, with_validation: bool) -> dict[str, Any]:
    """Mean, min, max and per-client accuracies after each phase; NaN (and no per-client lists)
    for a phase that was not evaluated this round."""
    metrics: dict[str, Any] = {}
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


def teacher_metrics(result, public_y: torch.Tensor) -> dict[str, float]:
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


def participation_metrics(sampled: Sequence[int], arrived: Sequence[int], public_size: int) -> dict[str, Any]:
    return {"participation/clients": list(sampled), "participation/arrived": list(arrived),
            "participation/sampled_count": len(sampled), "participation/arrived_count": len(arrived),
            "participation/dropped_count": len(sampled) - len(arrived), "participation/public_size": public_size}


def trust_rows(weights: torch.Tensor, public_y: torch.Tensor, num_classes: int, arrived: Sequence[int],
               num_clients: int) -> list:
    """The M x C who-to-trust matrix; rows of clients that sent nothing this round are null."""
    matrix = trust_matrix(weights, public_y, num_classes)
    if len(arrived) < num_clients:
        by_client = dict(zip(arrived, matrix, strict=True))
        matrix = [by_client.get(i, [None] * num_classes) for i in range(num_clients)]
    return matrix


# ---------------------------------------------------------------------- the run's summary
def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def selected(evaluated: list[dict[str, Any]]) -> dict[str, Any]:
    """Selection without the test set: per phase, the test accuracy of the evaluated round with
    the best mean validation accuracy (the earliest such round on a tie). Empty without a
    validation set."""
    out: dict[str, Any] = {}
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


def server_summary(evaluated: list[dict[str, Any]]) -> dict[str, Any]:
    """Best and final server-model accuracy (only runs with a server model log ``server/acc``)."""
    rows = [m for m in evaluated if not math.isnan(m.get("server/acc", math.nan))]
    if not rows:
        return {}
    best = max(rows, key=lambda m: m["server/acc"])
    return {"server_best_acc": best["server/acc"], "server_best_round": best["round"],
            "server_final_acc": rows[-1]["server/acc"], "server_final_nll": rows[-1]["server/nll"]}


def summary(history: list[dict[str, Any]], *, rounds_done: int, rounds: int, test_samples: int,
            bytes_up: int, bytes_down: int, wall_time: float, client_classes: list[list[int]],
            measured_network: str = "") -> dict[str, Any]:
    """Best and final numbers over the rounds that evaluated the clients (``eval/test_samples`` > 0;
    a finished run's last round always did, on the whole test set)."""
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
        "bytes_up_total": bytes_up,
        "bytes_down_total": bytes_down,
        "wall_time_s": wall_time,
        "client_classes": client_classes,  # the report boxes them in trust matrices
        "measured_network": measured_network,  # whose accuracy every number above is
    }


def round_metrics(parts: Any, communicates: bool, plan: Any, result: Any, losses: tuple[list, list],
                  evaluations: tuple[Any, Any], lost: Sequence[int], started: float) -> dict[str, Any]:
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
    metrics.update(clients.executor.timing_metrics())  # e.g. Ray actors' CPU seconds
    metrics.update(clients.executor.logged_metrics())  # clients/log/<name>: the steps' self.log values
    if server.privacy.audit and r == parts.settings.rounds:  # membership inference on the final client models
        metrics.update(membership_audit(clients.predict, t.private, t.test_x, t.test_y, t.local_masks))
    if server.privacy.upload_audit and communicates:  # the client models queried as a server could
        metrics.update(prediction_membership(clients.predict, t.private, t.test_x, t.test_y, t.local_masks))
    if result is not None and result.weights is not None:  # M x C who-to-trust matrix (diagnostic only)
        metrics["clients/trust_matrix"] = trust_rows(result.weights, public_y, parts.num_classes,
                                                     plan.arrived, len(clients))
    return metrics
