"""Probability averaging (AVG)."""

from __future__ import annotations

from fdlit.methods.base import AggregationResult, Aggregator, uniform_weights
from fdlit.privacy.secure_upload import probability_rows


class ProbabilityAveraging(Aggregator):
    """AVG: P(x) = (1/M) sum_i softmax(z_i(x)), W = 1/M.

    Source: Kovalchuk et al. 2026, App. A.3 ("Simple Averaging"), the FedMD / FedDF family. Upload per
    client and round: N*C numbers (the public logits).
    """

    short_name = "avg"
    label = "AVG"  # how tables and figures name the method
    summed = "probabilities"  # the teacher is the clients' mean probability

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        m, n, _ = z.shape
        weights = uniform_weights(m, n, z.device)
        return AggregationResult(teacher=z.softmax(-1).mean(0), weights=weights)

    # secure aggregation (fdlit.privacy.secure_upload): the teacher is the sum of the probabilities / M
    def secure_summands(self, upload, client):
        return {"probabilities": (upload["logits"].float().softmax(-1), 1.0)}

    def aggregate_sums(self, sums, ctx):
        return AggregationResult(teacher=probability_rows(sums.sums["probabilities"] / sums.count))
