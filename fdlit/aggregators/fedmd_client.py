"""FedMD's client (Li & Wang 2019): the digest step, an L1 loss to the consensus class scores.

Apart from :mod:`fdlit.aggregators.fedmd` because it is a client module: importing the rules
does not import the client machinery (start-up of ``fdlit fit --help``)."""

from __future__ import annotations

from typing import Optional

import torch

from fdlit.aggregators.fedmd import centred
from fdlit.clients.client import ClientModule


class FedMDClient(ClientModule):
    """A client whose public step is FedMD's digest: the mean absolute error between its class
    scores and the consensus scores, both centred per row (softmax and the consensus it is sent as
    do not depend on a per-row constant). Set with ``federation.client_class:
    fdlit.aggregators.fedmd_client.FedMDClient``."""

    def public_loss(self, logits: torch.Tensor, teacher: torch.Tensor,
                    weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        # log P = consensus scores - logsumexp: the consensus up to a per-row constant
        target = centred(torch.log(teacher.float().clamp_min(1e-30)))
        per_sample = (centred(logits.float()) - target).abs().mean(-1)
        if weight is None:
            return per_sample.mean()
        return (per_sample * weight).sum() / weight.sum()
