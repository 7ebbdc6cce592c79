"""What a round's steps are given: the federation's parts, each a typed object with its own state,
and how they are built from the config's sections (``build_parts``, the loop's set-up)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fdlit.adversaries import Adversaries
from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.execution import select_executor
from fdlit.federation.client_side import ClientSide
from fdlit.federation.construction import ClientRecipe, InitialDraws, build_clients, eval_rows
from fdlit.federation.evaluation import Accuracies, Evaluation, updated
from fdlit.federation.public_rows import PublicRowsGuard
from fdlit.federation.round_facts import RoundFacts, RoundPlan
from fdlit.federation.server_side import ServerSide
from fdlit.federation.settings import FederationSettings
from fdlit.federation.tensors import FederationTensors
from fdlit.models.build import ModelSpec


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
        if not plan.evaluated:
            return None
        out = self.evaluate(plan.eval_rows)
        self.clients.evaluated()
        return out

    def evaluated_again(self, plan: RoundPlan, before: Accuracies | None, changed: frozenset[int] | None
                        ) -> Accuracies | None:
        """Every client's accuracies after a step of the round that evaluated them as ``before``: only
        the clients it may have ``changed`` are measured again (None or every client: all)."""
        if before is None or changed is None or len(changed) == len(self.clients):
            return self.evaluated(plan)
        if not plan.evaluated:
            return None
        ids = sorted(changed)
        out = updated(before, ids, self.evaluate(plan.eval_rows, ids)) if ids else dict(before)
        self.clients.evaluated()
        return out


@dataclass(frozen=True)
class FederationSections:
    """The config's sections a federation is built from (``server``: the server's side made of the
    method, privacy and server model sections)."""

    settings: FederationSettings
    data: FederatedData
    model_spec: ModelSpec
    optimization: ClientOptimization
    server: ServerSide
    adversaries: Adversaries
    seed: int


def build_parts(sections: FederationSections, device: torch.device, release: Callable[[int, int, dict], dict] | None,
                hosted: Sequence[int] | None = None, draws: InitialDraws | None = None) -> tuple[RoundParts, InitialDraws]:
    """The federation's parts on ``device`` from the config's sections (``data`` set up), and the
    random state each client's network was drawn from. Everything here can fail on bad input, so
    it runs before any training; the executor is chosen (when the config names none), not started.

    ``hosted`` (a deployment node's clients, with the server's ``draws``): the node keeps only
    those clients' data and builds only their modules."""
    s, data, server, adversaries, seed = sections.settings, sections.data, sections.server, sections.adversaries, sections.seed
    optimization = sections.optimization
    if hosted is not None and s.mode != "reference":
        data.keep_only(hosted)
    client_data, clients, method_part, draws = build_clients(
        data, s.mode, ClientRecipe(s.client_class, sections.model_spec, optimization), server.method, adversaries, seed,
        hosted, draws)
    present = [c for c in clients if c is not None]
    tensors = FederationTensors.on_device(data, client_data, device)
    if s.participation is not None:
        s.participation.check(len(clients), len(tensors.public_x))
    rows = eval_rows(s.eval_subsample, len(tensors.test_y), seed)
    rows = None if rows is None else rows.to(device)
    facts = RoundFacts(seed, s.rounds, len(clients), data.num_classes, tensors.public_x, tensors.public_y,
                       tuple(tuple(cd.classes) for cd in client_data), s.participation,
                       (s.private_epochs_first, s.private_epochs), s.eval_every_n_rounds, rows)
    if s.channels_last:
        for c in present:
            c.model.to(memory_format=torch.channels_last)  # 4-D weights only; the rest is unchanged
    if s.executor is None:  # null: the fastest executor that applies (fdlit.execution.selection)
        s.executor = select_executor(present, s.precision, sample=tensors.public_x[:1])
    side = ClientSide(s.executor, clients, client_data, method_part, tensors.private, release)
    evaluate = Evaluation(side.correct, (tensors.test_x, tensors.test_y), tensors.local_masks,
                          (tensors.val_x, tensors.val_y))
    server.start(PublicRowsGuard(len(tensors.public_x)))  # refuses server state it could not save
    if server.server_model is not None:  # on the driver, whatever the executor
        server.server_model.setup(data.input_shape, data.num_classes, seed, device,
                                  getattr(data, "input_transform", None))
    parts = RoundParts(s, facts, side, server, tensors, evaluate, adversaries, data.num_classes, seed,
                       optimization.batch_size, optimization.public_batch_size)
    return parts, draws
