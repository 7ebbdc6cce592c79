"""F2L as published: regional FedAvg, label-driven distillation of the regional models at the global
server, and the switch back to FedAvg (Nguyen et al. 2022)."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

from fdlit.errors import ConfigError, check_at_least, check_number
from fdlit.messages import Message
from fdlit.methods.base import AggregationResult, ClientPart, ServerContext, Uploads
from fdlit.methods.distillation import Batches, distil
from fdlit.methods.f2l import Regions, region_assignment, upload_bytes
from fdlit.methods.fedavg import FedAvgClient, exchanged_tensors, flatten, load_flat, weighted_average
from fdlit.methods.feddf import FedDF
from fdlit.methods.lkd import auc_against_unlabelled

OPTIMIZERS = ("sgd", "adam")


def class_auc(scores: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """One-vs-rest ROC-AUC of ``scores[:, c]`` for every class c (C,), by sorting (O(L log L) a class,
    so F2L's 3,200-sample server pool costs no L x L matrix). A class without positives or without
    negatives gets 0.5 (no evidence)."""
    auc = torch.full((num_classes,), 0.5, dtype=torch.float64)
    for c in range(num_classes):
        pos, neg = scores[labels == c, c], scores[labels != c, c]
        if len(pos) and len(neg):
            auc[c] = auc_against_unlabelled(pos.double().cpu(), neg.double().cpu())
    return auc


class F2LParamsClient(FedAvgClient):
    """F2L's client part: FedAvg's, except that between global rounds a client loads the regional
    model it is sent (its own region's)."""

    def __init__(self, regions: Regions):
        self.regions = regions

    def receive(self, ctx) -> dict[str, torch.Tensor]:
        if "regional_parameters" in ctx.received:
            load_flat(exchanged_tensors(ctx.client.model), ctx.received["regional_parameters"])
            return {}
        return super().receive(ctx)


class F2LParams(FedDF):
    """F2L (Nguyen, Pham, Hoang, Tran-Thanh, Nguyen, Hwang, *Towards scalable and non-IID robust
    Hierarchical FL via Label-driven Knowledge Aggregator*, 2022; Sec. 3, Algorithms 1-6) with the
    parameter exchange the paper runs. Clients are in R regions. Every round each region averages its
    members' parameters (FedAvg, Algorithm 1's inner loop) and sends the regional model w_r back to its
    members. Every ``global_every`` rounds (a "global aggregation round") the global server scores
    each regional model on its labelled pool S with the class-wise AUC (Eq. 7, Algorithm 6):

        beta_r^c = softmax_r( T_w AUC_{r,c} ),   gap = max_c ( max_r beta_r^c - min_r beta_r^c )

    and, if gap >= ``epsilon`` (the regions still disagree), distils them into the global model by
    label-driven KD (Algorithm 2, Eq. 9), starting from the old global model w_old:

        L = lambda_1 sum_r sum_x beta_r^{c_r(x)} KL( p_r(x) || p_g(x) )               (Eq. 3, L-KD)
          + lambda_2 sum_x beta_old^{c_old(x)} KL( p_old(x) || p_g(x) )               (Eq. 4, G-update-KD)
          + lambda_3 CE( y, p_g(x) )                                                  (Eq. 10, hard loss)
        beta_old^c = exp(T_w AUC_old,c) / ( exp(T_w AUC_new,c) + exp(T_w AUC_old,c) )   (Eq. 8)

    where c_r(x) = argmax p_r(x) (Algorithm 3 aligns each sample to the class its teacher predicts);
    otherwise the global model is w_g = (1/R) sum_r w_r (Algorithm 1's switch to FedAvg). The
    coefficients follow Eq. 11-12 from the hard-loss weight lambda_3 (``hard_weight``): with
    ``update_distillation`` lambda_1 = (1 - lambda_3) R / (R + 1), lambda_2 = lambda_1 / R, otherwise
    lambda_1 = 1 - lambda_3, lambda_2 = 0 (so lambda_1 + lambda_2 = 1 - lambda_3, as in Tables 5-7,
    whose best lambda_3 is 0.01: the default). The global model then goes down to every client and
    every region restarts from it.

    **Choices** (the paper leaves them open): the server pool S is the public set with its labels
    (the first ``server_labelled_size`` rows of a seeded permutation; all of it by default), so this
    method uses public labels; T_w = 20 as fdlit's LKD (no value printed); the gap's norm over
    classes is the max; the KL terms use T = 1 (the paper's T is unprinted; its hard loss uses T = 1);
    mini-batches of ``batch_size`` with beta_old recomputed at the start of every epoch, as Algorithm 2
    recomputes beta_r per epoch (the regional models are fixed during the step, so beta_r is computed
    once); Adam by default, as fdlit's FedDF; ``global_every`` = 8 reads Tables 5-7's "5th distillation round (which is at every 40
    rounds of communication)". A region none of whose members arrived keeps its model.

    Messages (float32, counted per client by the ledger): ``num_samples`` up and the initial model
    down at set-up; every round ``parameters`` up, and down the client's regional model
    (``regional_parameters``) or, on a global round, the global model (``parameters``), P numbers
    either way. Rule stats: ``f2l/lkd_active`` (1: LKD ran, 0: FedAvg across regions; global rounds
    only), ``f2l/beta_gap``, ``f2l/distill_loss``, and bytes per tier ``f2l/bytes_client_to_region``,
    ``f2l/bytes_region_to_global`` and ``f2l/bytes_global_to_region`` (R x P x 4 each on global rounds).

    Args:
        regions: R, a count (client i is in region i mod R), or a region id per client.
        global_every: rounds between global aggregations (>= 1).
        epsilon: the switch: LKD while gap >= epsilon, FedAvg across regions below (0: always LKD,
            F2L-noFedAvg; > 1: always FedAvg).
        hard_weight: lambda_3 in [0, 1].
        update_distillation: include Eq. 4's term (lambda_2 > 0).
        temperature: T_w > 0.
        server_labelled_size: |S| (None: the whole public set; >= 2).
        epochs, lr, batch_size: the global distillation's epochs over S, learning rate, batch size.
        optimizer: ``adam`` (default) or ``sgd`` (Algorithm 2's plain gradient step; at lr 0.05 for
            2 epochs it collapsed the first distillation from the initial model on digits).
    """

    short_name = "f2l_fedavg"
    label = "F2L (parameters)"  # how tables and figures name the method

    def __init__(self, regions: int | list[int] = 3, global_every: int = 8, epsilon: float = 0.1,
                 hard_weight: float = 0.01, update_distillation: bool = True, temperature: float = 20.0,
                 server_labelled_size: int | None = None, epochs: int = 5, lr: float = 1e-3,
                 batch_size: int = 32, optimizer: Literal["sgd", "adam"] = "adam"):
        super().__init__(epochs=epochs, lr=lr, batch_size=batch_size)
        self.regions = region_assignment(regions)
        check_at_least("aggregator.global_every", global_every, 1)
        check_at_least("aggregator.epsilon", epsilon, 0.0)
        if not 0.0 <= hard_weight <= 1.0:
            raise ConfigError("aggregator.hard_weight", f"lambda_3 must be in [0, 1]; got {hard_weight}")
        check_number("aggregator.temperature", temperature)
        if server_labelled_size is not None:
            check_at_least("aggregator.server_labelled_size", server_labelled_size, 2)
        if optimizer not in OPTIMIZERS:
            raise ConfigError("aggregator.optimizer", f"allowed: 'sgd', 'adam'; got {optimizer!r}")
        self.global_every, self.epsilon, self.hard_weight = global_every, epsilon, hard_weight
        self.update_distillation, self.temperature = update_distillation, temperature
        self.server_labelled_size, self.optimizer = server_labelled_size, optimizer
        self.regional: torch.Tensor | None = None  # R x P, the regional models
        self.global_model: torch.Tensor | None = None  # P, the old global model w_old

    def assignment(self, num_clients: int) -> torch.Tensor:
        return self.regions.assignment(num_clients)

    def check_clients(self, num_clients: int) -> None:
        self.assignment(num_clients)  # every region needs a client

    def coefficients(self, num_regions: int) -> tuple[float, float, float]:
        """(lambda_1, lambda_2, lambda_3) by Eq. 11-12."""
        soft = 1.0 - self.hard_weight
        if self.update_distillation:
            lam1 = soft * num_regions / (num_regions + 1)
            return lam1, lam1 / num_regions, self.hard_weight
        return soft, 0.0, self.hard_weight

    def client_part(self) -> ClientPart:
        return F2LParamsClient(self.regions)

    def configure(self, message: Message, client_ids: list[int], ctx: ServerContext) -> dict[int, Message]:
        """Between global rounds each client is sent its own region's model only."""
        if "regional_parameters" not in message:
            return super().configure(message, client_ids, ctx)
        regions = self.assignment(ctx.info.num_clients)
        own = {int(r): Message({"regional_parameters": message["regional_parameters"][int(r)]})
               for r in set(regions.tolist())}
        return {i: own[int(regions[i])] for i in client_ids}

    # ------------------------------------------------------------------ server part
    def server_setup(self, uploads: Uploads, ctx: ServerContext) -> dict[str, torch.Tensor]:
        broadcast = super().server_setup(uploads, ctx)
        num_regions = int(self.assignment(ctx.info.num_clients).max()) + 1
        self.global_model = broadcast["parameters"].clone()
        self.regional = self.global_model[None].repeat(num_regions, 1)
        return broadcast

    def aggregate(self, uploads: Uploads, ctx: ServerContext) -> AggregationResult:
        region = self.assignment(ctx.info.num_clients)
        ids = ctx.info.client_ids()
        counts = self.counts[ids] if self.counts is not None else torch.ones(len(ids), dtype=torch.int64)
        regional = self.regional.to(uploads[0]["parameters"].device).clone()
        num_regions = len(regional)
        for r in range(num_regions):  # each regional server runs FedAvg over its members that arrived
            members = [j for j, i in enumerate(ids) if int(region[i]) == r]
            if members:
                regional[r] = weighted_average([uploads[j]["parameters"] for j in members], counts[members])
        stats = {"f2l/bytes_client_to_region": upload_bytes(uploads), "f2l/bytes_region_to_global": 0.0,
                 "f2l/bytes_global_to_region": 0.0}
        if ctx.info.round % self.global_every:
            self.regional = regional
            return AggregationResult(teacher=None, broadcast={"regional_parameters": regional}, stats=stats)
        tier = float(regional.numel() * regional.element_size())
        stats.update({"f2l/bytes_region_to_global": tier, "f2l/bytes_global_to_region": tier})
        x, y = self.server_pool(ctx, regional.device)
        net = self._network(ctx, regional[0])
        teacher_logits = torch.stack([self._logits(net, x, w) for w in regional])  # R x S x C
        c = teacher_logits.shape[-1]
        auc = torch.stack([class_auc(z.softmax(-1), y, c) for z in teacher_logits]).float()  # R x C
        beta = torch.softmax(self.temperature * auc, dim=0)
        gap = float((beta.max(0).values - beta.min(0).values).max())
        stats["f2l/beta_gap"] = gap
        if gap >= self.epsilon:
            new_global, loss = self.distil(net, teacher_logits, beta.to(x.device), x, y, ctx)
            stats.update({"f2l/lkd_active": 1.0, "f2l/distill_loss": loss})
        else:
            new_global = regional.mean(0)  # Algorithm 1: w_g = (1/R) sum_r w_r
            stats["f2l/lkd_active"] = 0.0
        self.global_model = new_global.clone()
        self.regional = new_global[None].repeat(num_regions, 1)
        return AggregationResult(teacher=None, broadcast={"parameters": new_global}, stats=stats)

    def server_pool(self, ctx: ServerContext, device) -> tuple[torch.Tensor, torch.Tensor]:
        """F2L's labelled pool S: the public set with its labels (a seeded subset when configured)."""
        x, y = ctx.info.public_x, ctx.public_y
        if self.server_labelled_size is not None and self.server_labelled_size < len(x):
            g = torch.Generator().manual_seed(ctx.info.seed)
            idx = torch.randperm(len(x), generator=g)[: self.server_labelled_size]
            x, y = x[idx.to(x.device)], y[idx.to(y.device)]
        return x.to(device), y.to(device)

    def distil(self, net, teacher_logits, beta, x, y, ctx) -> tuple[torch.Tensor, float]:
        """Algorithm 2: the global model, from w_old, trained on S with Eq. 9's joint loss."""
        num_regions, _, c = teacher_logits.shape
        lam1, lam2, lam3 = self.coefficients(num_regions)
        old_logits = self._logits(net, x, self.global_model.to(x.device))  # and the student starts from w_old
        old_auc = class_auc(old_logits.softmax(-1), y, c).float().to(x.device)
        p_teachers = teacher_logits.softmax(-1)
        # beta_r^{c_r(x)}: each teacher distils the samples it labels c with its class-c reliability
        teacher_w = torch.gather(beta, 1, teacher_logits.argmax(-1))  # R x S
        p_old, old_class = old_logits.softmax(-1), old_logits.argmax(-1)
        tensors = exchanged_tensors(net)
        parameters = list(net.parameters())
        optimizer = (torch.optim.SGD(parameters, lr=self.lr) if self.optimizer == "sgd"
                     else torch.optim.Adam(parameters, lr=self.lr))
        generator = torch.Generator().manual_seed(ctx.info.seed * 1_000_003 + 0xF21 + ctx.info.round)
        beta_old = torch.ones(c, device=x.device)

        def before_epoch():
            nonlocal beta_old
            if lam2 > 0:  # Eq. 8, the old model against the student as it stands
                new_auc = class_auc(self._logits(net, x).softmax(-1), y, c).float().to(x.device)
                beta_old = torch.softmax(self.temperature * torch.stack([old_auc, new_auc]), dim=0)[0]

        def joint_loss(log_q, idx):
            loss = lam1 * sum(
                (teacher_w[r, idx] * kl_rows(p_teachers[r, idx], log_q)).mean() for r in range(num_regions))
            if lam2 > 0:
                loss = loss + lam2 * (beta_old[old_class[idx]] * kl_rows(p_old[idx], log_q)).mean()
            return loss + lam3 * F.nll_loss(log_q, y[idx].long())

        loss = distil(net, optimizer, x, Batches(self.epochs, self.batch_size, generator), joint_loss, before_epoch)
        return flatten(tensors).clone(), loss

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "regional": self.regional, "global_model": self.global_model}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.regional, self.global_model = state.get("regional"), state.get("global_model")


def kl_rows(p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row, 0 log 0 = 0."""
    return (p * (p.clamp_min(1e-30).log() - log_q)).sum(-1)
