"""FedKD: adaptive mutual distillation and SVD-compressed updates (Wu et al. 2022).

Wu, Wu, Lyu, Huang, Xie, *Communication-efficient federated learning via knowledge distillation*,
Nature Communications 13, 2032 (2022). Every client keeps a private "mentor" network (large,
never sent) and trains a copy of the shared "mentee" network (small: the exchanged one). Each
private step's loss, with the batch's mean cross-entropies CE_t (mentor) and CE_s (mentee), is

    L_t = CE_t + KL(p_s || p_t) / (CE_t + CE_s),
    L_s = CE_s + KL(p_t || p_s) / (CE_t + CE_s),        L = L_t + L_s,

the KL terms averaged over the batch: adaptive mutual distillation, whose intensity falls when
the two networks' predictions are poor (CE_t + CE_s is floored at 1e-6, which only a batch both
networks fit to float precision reaches, where 0 / 0 would stop training). In each KL term the other network's prediction is the
target and is not differentiated, and the weight 1 / (CE_t + CE_s) is a constant of the step, so
the mentor descends L_t and the mentee L_s. (The paper's hidden-state and attention terms L^h
need a learned map between two networks' hidden states; they are left out.)

After the private phase client k sends its mentee's update g_k = w_k - w (w: the mentee it
received last), compressed by truncated SVD (:mod:`fdlit.methods.svd_compression`): every weight
matrix keeps the fewest singular values that hold an energy share T of its squared singular
values, with T growing linearly over the rounds,

    T(r) = T_start + (T_end - T_start) * min(r, R) / R      (R = ``energy_rounds``).

The server rebuilds every g_k from its factors, averages them as FedAvg does,
g = sum_k (n_k / n) g_k, compresses g with the same T(r) and sends its factors to every client,
which sets its mentee to w + g~ (g~: the rebuilt g), so every client holds the same mentee.

Which network is measured (``evaluate``): by default (``private``) a client's accuracies
(``global_acc``, ``local_acc``) are its **mentor**'s (the pair's ``forward``), as the authors' code
(its ``test()``) and PFLlib evaluate the mentor; ``evaluate: shared`` measures the mentee after the
exchange instead. Training is the same under both.

The two networks per client: :class:`fdlit.models.mutual.MutualPair` (the mentee's own spec in
``shared``; any other network is paired with a fresh copy of its own architecture). With
``fdlit.models.PerClient`` the mentors may differ between clients; the mentee must be the same.

Messages: set-up (round 0): ``num_samples`` (int64) up from every client; from client 0 the
mentee's initial parameters ``initial_parameters`` (P float32, sent down to every client as
``parameters``) and ``matrix_shapes`` (int32, 2 per exchanged tensor, for the server); every round
``factors`` (float32: the kept U_k, s_k, V_k^T of every matrix and every other tensor's numbers)
and ``ranks`` (int32, one per matrix) up from every arrived client and down to every client. DP on
the factors is refused (``unbounded``).
"""

from __future__ import annotations

from typing import Any

import torch

from fdlit.errors import ConfigError, check_at_least
from fdlit.methods.base import AggregationResult, ClientContext, ClientPart, ServerContext, Uploads
from fdlit.methods.fedavg import FedAvg
from fdlit.methods.mutual import MutualClient, check_evaluate, per_row_ce, per_row_kl, shared_tensors
from fdlit.methods.parameters import flatten
from fdlit.methods.svd_compression import compress, decompress, matrix_shapes
from fdlit.models.mutual import check_one_shared_network

REFERENCE = "fedkd_reference"  # the mentee a client received last (w), flat
CE_FLOOR = 1e-6  # the least CE_t + CE_s the intensity divides by


def energy_at(round: int, start: float, end: float, rounds: int) -> float:
    """T(r) = T_start + (T_end - T_start) * min(r, R) / R."""
    return start + (end - start) * min(round, rounds) / rounds


class FedKDClient(MutualClient):
    """FedKD's client part: the adaptive mutual loss; the mentee's compressed update up, the
    averaged one applied on receipt."""

    label = "FedKD"

    def __init__(self, energy_start: float, energy_end: float, energy_rounds: int, evaluate: str = "private"):
        self.energy_start, self.energy_end, self.energy_rounds = energy_start, energy_end, energy_rounds
        self.evaluate = evaluate

    def setup(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        out = super().setup(ctx)
        if "initial_parameters" in out:
            out["matrix_shapes"] = matrix_shapes(shared_tensors(ctx.client.model, self.label))
        return out

    def upload(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        tensors = shared_tensors(ctx.client.model, self.label)
        update = flatten(tensors) - ctx.state[REFERENCE].to(tensors[0].device)
        energy = energy_at(ctx.info.round, self.energy_start, self.energy_end, self.energy_rounds)
        return compress(update, matrix_shapes(tensors), energy)

    def receive(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        received = ctx.received
        if "parameters" in received:  # set-up: the initial mentee
            flat = received["parameters"].float()
        else:
            shapes = matrix_shapes(shared_tensors(ctx.client.model, self.label))
            update = decompress(received["factors"], received["ranks"], shapes)
            flat = ctx.state[REFERENCE] + update.to(ctx.state[REFERENCE].device)
        self.load_shared(ctx, flat)
        ctx.state[REFERENCE] = flat.detach().clone()
        return {}

    def loss(self, ctx):
        if ctx.phase != "private":
            return ctx.base
        mentor, mentee = self.logits(ctx)
        ce_t, ce_s = ctx.mean(per_row_ce(mentor, ctx.target)), ctx.mean(per_row_ce(mentee, ctx.target))
        kd_t, kd_s = ctx.mean(per_row_kl(mentee, mentor)), ctx.mean(per_row_kl(mentor, mentee))
        # a batch both networks fit to float precision would divide 0 by 0: the floor only acts there
        intensity = 1.0 / (ce_t + ce_s).detach().clamp_min(CE_FLOOR)
        return ce_t + ce_s + intensity * (kd_t + kd_s)


class FedKD(FedAvg):
    """FedKD (Wu et al. 2022): L_t = CE_t + KL(p_s || p_t) / (CE_t + CE_s), L_s likewise; the
    mentee's updates exchanged as truncated SVDs holding energy T(r) (module docstring).

    Args:
        energy_start: T_start, where the energy share starts (round r keeps T(r), above it), in (0, 1].
        energy_end: T_end, the share kept from round ``energy_rounds`` on, in [energy_start, 1].
        energy_rounds: R, the rounds over which T grows from T_start to T_end (the paper: the run's rounds).
        evaluate: the network each client's accuracies are measured with: ``private`` (the default:
            the local mentor, as the authors' code and PFLlib measure it) or ``shared`` (the mentee
            after the exchange).
    """

    short_name = "fedkd"
    label = "FedKD"
    needs_public_set = False
    released = {"factors": "unbounded", "ranks": "clear"}

    def __init__(self, energy_start: float = 0.95, energy_end: float = 0.98, energy_rounds: int = 20,
                 evaluate: str = "private"):
        super().__init__()
        self.evaluate = check_evaluate(evaluate)
        self.energy_start = check_energy("aggregator.energy_start", energy_start)
        self.energy_end = check_energy("aggregator.energy_end", energy_end)
        if energy_start > energy_end:
            raise ConfigError("aggregator.energy_start", f"must be <= aggregator.energy_end ({energy_end}); the "
                              f"energy share grows over the rounds, got {energy_start}")
        self.energy_rounds = check_at_least("aggregator.energy_rounds", energy_rounds, 1)
        self.shapes: torch.Tensor | None = None  # (rows, cols) of every mentee tensor, from set-up

    @property
    def measured_network(self) -> str:
        return ("the mentor (the private network)" if self.evaluate == "private"
                else "the mentee (the shared network), averaged at the exchange")

    def check_config(self, model: Any, client: Any) -> None:
        check_one_shared_network(model, self.label)  # the mentors may differ

    def client_part(self) -> ClientPart:
        return FedKDClient(self.energy_start, self.energy_end, self.energy_rounds, self.evaluate)

    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        self.shapes = next(u["matrix_shapes"] for u in uploads if "matrix_shapes" in u).cpu()
        return super().server_setup(uploads, ctx)

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        if self.shapes is None:
            raise RuntimeError("FedKD aggregates before its set-up: the mentee's matrix shapes are unknown")
        updates = [{"update": decompress(u["factors"].cpu(), u["ranks"].cpu(), self.shapes)} for u in uploads]
        energy = energy_at(ctx.info.round, self.energy_start, self.energy_end, self.energy_rounds)
        sent = compress(self.average(updates, ctx, key="update"), self.shapes, energy)
        kept = float(sent["factors"].numel()) / max(1, int(self.shapes.prod(-1).sum()))
        return AggregationResult(teacher=None, broadcast=sent,
                                 stats={"fedkd/energy": energy, "fedkd/down_numbers_ratio": kept})

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "shapes": self.shapes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.shapes = state.get("shapes")


def check_energy(field: str, value: float) -> float:
    if not 0 < value <= 1:
        raise ConfigError(field, f"must be an energy share in (0, 1], got {value}")
    return value
