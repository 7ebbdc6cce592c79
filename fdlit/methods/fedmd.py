"""FedMD (Li & Wang 2019): consensus of class scores, digested with an L1 loss; optional warm-up."""

from __future__ import annotations

import torch

from fdlit.errors import check_at_least
from fdlit.methods.base import AggregationResult, Aggregator, ClientPart, uniform_weights
from fdlit.privacy.secure_upload import LOGIT_BOUND


class FedMDDigest(ClientPart):
    """FedMD's client part: the public step is the digest, the mean absolute error between the
    client's class scores and the consensus scores, both centred per row (softmax and the consensus
    it is sent as do not depend on a per-row constant)."""

    rowwise_loss = False  # digest_loss averages over real rows itself

    def loss(self, ctx):
        return digest_loss(ctx.logits, ctx.target, ctx.weight) if ctx.phase == "public" else ctx.base


class FedMD(Aggregator):
    """FedMD (Li & Wang, *FedMD: Heterogenous federated learning via model distillation*, 2019, Algorithm 1).

    FedMD's rounds are communicate / aggregate / distribute / digest / revisit; on fdlit's round
    (docs/algorithms.md, "FedMD"):

    * transfer learning (optional, once): every client trains on the *labelled* public set for
      ``warmup_epochs`` (cross-entropy, before round 1; no messages), then on its private data:
      round 1's private phase (``federation.private_epochs_first``);
    * communicate: the class scores z_i(x) on the public set (the logits, N*C numbers per client);
    * aggregate: the consensus f~(x) = (1/M) sum_i z_i(x); it is sent down as
      P(x) = softmax(f~(x)), the same N*C numbers, from which a client recovers f~(x) up to a
      per-row constant (log P = f~ - logsumexp f~);
    * digest = fdlit's public phase with FedMD's client part (:class:`FedMDDigest`): L1 between the client's scores and
      the consensus, both centred per row, (1/C) sum_c |(z_i - mean_c z_i) - (log P - mean_c log P)|;
    * revisit = the next round's private phase (``federation.private_epochs``).

    Weights over clients are 1/M. The warm-up reads the public set's labels: FedMD's public set is
    labelled (MNIST, CIFAR-10 in the paper); fdlit's public split has those labels in simulation.

    Args:
        warmup_epochs: transfer-learning epochs on the labelled public set before round 1 (0: none).
    """

    short_name = "fedmd"
    label = "FedMD"  # how tables and figures name the method
    uses_public_labels = True  # only through the warm-up
    summed = "logits"  # the consensus is the clients' mean score

    def __init__(self, warmup_epochs: int = 0):
        check_at_least("aggregator.warmup_epochs", warmup_epochs, 0)
        self.warmup_epochs = warmup_epochs

    @property
    def public_warmup_epochs(self) -> int:
        """Epochs every client trains on the labelled public set before round 1 (read by the loop)."""
        return self.warmup_epochs

    def client_part(self) -> ClientPart:
        return FedMDDigest()

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        m, n, _ = z.shape
        return AggregationResult(teacher=torch.softmax(z.mean(0), -1), weights=uniform_weights(m, n, z.device))

    # secure aggregation (fdlit.privacy.secure_upload): the consensus is the sum of the scores / M
    def secure_summands(self, upload, client):
        return {"logits": (upload["logits"].float(), LOGIT_BOUND)}

    def aggregate_sums(self, sums, ctx):
        return AggregationResult(teacher=torch.softmax(sums.sums["logits"] / sums.count, -1).float())


def centred(scores: torch.Tensor) -> torch.Tensor:
    return scores - scores.mean(-1, keepdim=True)


def digest_loss(logits: torch.Tensor, teacher: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """(1/C) sum_c |(z - mean_c z) - (log P - mean_c log P)|, mean over samples (weighted by ``weight``)."""
    # log P = consensus scores - logsumexp: the consensus up to a per-row constant
    target = centred(torch.log(teacher.float().clamp_min(1e-30)))
    per_sample = (centred(logits.float()) - target).abs().mean(-1)
    if weight is None:
        return per_sample.mean()
    return (per_sample * weight).sum() / weight.sum()
