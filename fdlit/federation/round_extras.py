"""What the config adds to every round (:class:`~fdlit.federation.round.RoundExtra`), composed once at
set-up by :func:`round_extras`: the attacks' private sets and metrics, the upload audit, the virtual
clock, the validation selection. The round calls their hooks in this order and never asks which are there."""

from __future__ import annotations

from fdlit.adversaries import Adversaries
from fdlit.federation import measurement
from fdlit.federation.clock.base import VirtualClock
from fdlit.federation.protocols import Protocol
from fdlit.federation.round import RoundExtra
from fdlit.federation.round_parts import RoundParts
from fdlit.federation.selection import ExactSelection
from fdlit.privacy.upload_audit import label_histograms, label_inference


class Attacks(RoundExtra):
    """The ``adversaries`` section's part of a round: the attackers' poisoned private sets, and the
    round's attack metrics (fdlit.adversaries; their uploads are the wrapped client part's)."""

    def __init__(self, adversaries: Adversaries, parts: RoundParts):
        self.adversaries, self.parts = adversaries, parts

    def private_sets(self, r, sets):
        return self.adversaries.private_sets(r, sets, self.parts.num_classes)

    def uploads(self, plan, sent):
        """With ``collude``: the round's attackers whose uploads arrive send the first one's."""
        lost = self.parts.clients.unreachable()
        ids = [i for i in plan.arrived if i in sent and i not in lost]
        colluded = self.adversaries.collude_uploads(plan.round, ids, [sent[i] for i in ids])
        return {**sent, **dict(zip(ids, colluded, strict=True))}

    def metrics(self, plan, result, after_public):
        return self.adversaries.after_round(self.parts, plan, result, after_public)


class UploadAudit(RoundExtra):
    """``privacy.upload_audit``: the membership attack on the models that made the round's uploads,
    right after the private phase (fdlit.privacy.upload_audit), reported with the round."""

    def __init__(self, parts: RoundParts, labels: bool):
        self.parts, self.labels, self.audited = parts, labels, {}

    def after_private(self, plan, accuracies):
        self.audited[plan.round] = measurement.upload_membership(self.parts)

    def received(self, plan, received):
        """With predictions uploaded (``labels``): what the server infers of each client's labels from
        the uploads it saw (not from sums)."""
        if self.labels and isinstance(received.uploads, list):
            t = self.parts.tensors
            histograms = label_histograms([t.private[i][1] for i in received.ids], self.parts.num_classes)
            received.stats.update(label_inference([u["logits"] for u in received.uploads], histograms))

    def metrics(self, plan, result, after_public):
        return self.audited.pop(plan.round, {})


class Clocked(RoundExtra):
    """``federation.clock``: who arrives next, whose uploads are late, and the round's virtual time and
    staleness (fdlit.federation.clock), measured once the exchange is done."""

    def __init__(self, clock: VirtualClock, parts: RoundParts):
        self.clock, self.parts, self.timed = clock, parts, {}

    def plan(self, plan):
        return self.clock.schedule(self.parts, plan)

    def arrived(self, plan, sent):
        return self.clock.arrive(self.parts, plan, sent)

    def exchanged(self, plan):
        self.timed[plan.round] = self.clock.close(self.parts, plan)

    def metrics(self, plan, result, after_public):
        return self.timed.pop(plan.round, {})


class Selection(RoundExtra):
    """The validation-selected rounds (fdlit.federation.selection): each phase's evaluation observed,
    the selected rounds measured on the whole test set with the last round."""

    def __init__(self, selection: ExactSelection, rounds: int):
        self.selection, self.rounds = selection, rounds

    def after_private(self, plan, accuracies):
        self.selection.observe("after_private", plan.round, accuracies)

    def after_exchange(self, plan, accuracies):
        self.selection.observe("after_public", plan.round, accuracies)

    def metrics(self, plan, result, after_public):
        return self.selection.finish() if plan.round == self.rounds else {}


def round_extras(parts: RoundParts, adversaries: Adversaries, selection: ExactSelection, upload_audit: bool,
                 exchange: Protocol, clock: VirtualClock | None = None) -> list[RoundExtra]:
    """The extras of a run's rounds, in the order their hooks run (and their metrics are added)."""
    audit = [UploadAudit(parts, labels=exchange.upload == "predictions")] if upload_audit else []
    timed = [Clocked(clock, parts)] if clock is not None else []
    return [Attacks(adversaries, parts), *audit, *timed, Selection(selection, parts.settings.rounds)]
