"""Exact validation-selected numbers when the per-round curves use a test subsample.

The summary reports, per phase, the test accuracy of the round with the best mean validation
accuracy (``selected_*``). With ``federation.eval_subsample`` the rounds before the last are measured
on a fixed test subset, so that round's number would come from the subset. Measuring every round
that improves the validation accuracy on the whole test set instead costs about as much as not
subsampling at all (on Fashion-MNIST the validation accuracy rises in most of the first 10 rounds).
So the clients' weights are kept, in memory, when a phase's validation accuracy improves in a
subsampled round; after the last round the selected round's weights are loaded back, measured on
the whole test set once, and the final weights restored. At most one full evaluation per phase and
run, whatever the number of rounds, and one for both phases where they kept the same weights (a
``local_only`` or ``reference`` run, whose public phase changes nothing); the numbers are those a full evaluation in that round would have
given (the same weights through the same evaluation).
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import torch

from fdlit.messages import Metrics

if TYPE_CHECKING:
    from fdlit.federation.client_side import ClientSide
    from fdlit.federation.evaluation import Accuracies, Evaluation

PHASES = ("after_private", "after_public")


def same_weights(a: list[dict], b: list[dict]) -> bool:
    """Whether two sets of the clients' weights are bit for bit equal (a phase that changed nothing:
    ``local_only`` and ``reference`` runs, whose after-public state is the after-private one)."""
    return a is b or (len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True)))


class ExactSelection:
    """Keeps each phase's best-validation weights and measures them on the whole test set at the end.

    Args:
        clients: the federation's :class:`~fdlit.federation.client_side.ClientSide`.
        evaluate: the federation's :class:`~fdlit.federation.evaluation.Evaluation`.
        active: whether the run subsamples its intermediate evaluations and has a validation set.
    """

    def __init__(self, clients: ClientSide, evaluate: Evaluation, active: bool):
        self.clients, self.evaluate, self.active = clients, evaluate, active
        self.best: dict[str, tuple[float, int]] = {}  # phase -> (mean validation accuracy, round)
        self.kept: dict[str, list[dict] | None] = {}  # phase -> the clients' weights then (None: measured exactly)

    def observe(self, phase: str, round: int, accs: Accuracies | None) -> None:
        """After a phase's evaluation: keep the weights when its validation accuracy beats every
        earlier round's (the earliest round wins a tie, as the summary's selection does)."""
        if not self.active or accs is None or "val_acc" not in accs:
            return
        mean = float(accs["val_acc"].nanmean())
        if not mean > self.best.get(phase, (-math.inf, 0))[0]:
            return
        self.best[phase] = (mean, round)
        exact = accs["test_samples"] == len(self.evaluate.test_y)
        self.kept[phase] = None if exact else self._weights()

    def _weights(self) -> list[dict]:
        states = self.clients.state_dict()  # fetched from where the clients live
        return [copy.deepcopy(s["model"]) for s in states]

    def _load(self, weights: list[dict]) -> None:
        for client, w in zip(self.clients.clients, weights, strict=True):
            client.model.load_state_dict(w)
        self.clients.executor.push_states(self.clients.clients)
        self.clients.forget_evaluation()

    def finish(self) -> Metrics:
        """After the last round's evaluations: the selected rounds measured on the whole test set
        (``selection/<phase>/*`` metrics, for the last round's row); the final weights stay."""
        out: Metrics = {}
        pending = {p: w for p, w in self.kept.items() if w is not None}
        if not pending:
            return out
        final = self._weights()
        measured: list[tuple[list[dict], Accuracies]] = []  # no network state is measured twice
        try:
            for phase, weights in pending.items():
                accs = next((a for w, a in measured if same_weights(w, weights)), None)
                if accs is None:
                    self._load(weights)
                    accs = self.evaluate(None)
                    measured.append((weights, accs))
                known = ~accs["global_acc"].isnan()
                out[f"selection/{phase}/round"] = self.best[phase][1]
                out[f"selection/{phase}/global_acc_mean"] = float(accs["global_acc"][known].mean())
                out[f"selection/{phase}/local_acc_mean"] = float(accs["local_acc"][known].mean())
                out[f"selection/{phase}/test_samples"] = accs["test_samples"]
        finally:
            self._load(final)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"best": dict(self.best), "kept": dict(self.kept)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        self.best = {p: tuple(v) for p, v in state.get("best", {}).items()}
        self.kept = dict(state.get("kept", {}))
