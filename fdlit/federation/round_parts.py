"""What a round's steps are given: the federation's parts, each a typed object with its own state."""

from __future__ import annotations

from dataclasses import dataclass

from fdlit.adversaries import Adversaries
from fdlit.federation.client_side import ClientSide
from fdlit.federation.evaluation import Accuracies, Evaluation
from fdlit.federation.round_facts import RoundFacts, RoundPlan
from fdlit.federation.server_side import ServerSide
from fdlit.federation.settings import FederationSettings
from fdlit.federation.tensors import FederationTensors


@dataclass(frozen=True)
class RoundParts:
    """The parts of a federation a protocol, the measurement and the attacks work with.

    ``clients``: the clients and where they live; ``server``: the method's server part, privacy,
    server model, ledger; ``facts``: who takes part and what everyone knows; ``tensors``: the data on
    the device; ``evaluate``: how every client is measured; ``settings``: the schedule."""

    settings: FederationSettings
    facts: RoundFacts
    clients: ClientSide
    server: ServerSide
    tensors: FederationTensors
    evaluate: Evaluation
    adversaries: Adversaries
    num_classes: int
    seed: int
    batch_size: int
    public_batch_size: int

    def evaluated(self, plan: RoundPlan) -> Accuracies | None:
        """Every client's accuracies when the round evaluates, else None."""
        return self.evaluate(plan.eval_rows) if plan.evaluated else None
