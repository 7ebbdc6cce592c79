"""Logit averaging (Kovalchuk et al. 2025 (workshop), Eq. 1-2; FedDF)."""

from __future__ import annotations

import torch

from fdlit.errors import check_number
from fdlit.methods.base import AggregationResult, Aggregator, uniform_weights
from fdlit.privacy.secure_upload import LOGIT_BOUND


class LogitAveraging(Aggregator):
    """Logit averaging: P(x) = softmax( (1/M) sum_i z_i(x) / T ), W = 1/M.

    Source: Sec. 3.1.1, Eq. 1-2 (Kovalchuk et al., workshop version of *Who to Trust?*); the
    same rule as FedDF's logit ensemble. Upload per client and round: N*C numbers (the logits).

    Args:
        temperature: T > 0 (workshop paper: T = 1).

    ``weights`` are the uniform 1/M because every client's logits enter the mean equally; note that
    unlike AVG the teacher is *not* sum_i W[i] Q[i] (the mean is taken before the softmax), so a
    very confident client moves the teacher more than under probability averaging.
    """

    short_name = "logitavg"
    label = "Logit averaging"  # how tables and figures name the method
    summed = "logits"  # the teacher is a function of the clients' mean logits

    def __init__(self, temperature: float = 1.0):
        check_number("aggregator.temperature", temperature)
        self.temperature = temperature

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        m, n, _ = z.shape
        weights = uniform_weights(m, n, z.device)
        return AggregationResult(teacher=torch.softmax(z.mean(0) / self.temperature, -1), weights=weights)

    # secure aggregation (fdlit.privacy.secure_upload): the teacher is a function of the sum of the logits
    def secure_summands(self, upload, client):
        return {"logits": (upload["logits"].float(), LOGIT_BOUND)}

    def aggregate_sums(self, sums, ctx):
        return AggregationResult(teacher=torch.softmax(sums.sums["logits"] / sums.count / self.temperature, -1).float())
