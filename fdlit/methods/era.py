"""DS-FL entropy-reduction aggregation (ERA)."""

from __future__ import annotations

import torch

from fdlit.errors import check_number
from fdlit.methods.base import AggregationResult, Aggregator, uniform_weights
from fdlit.privacy.secure_upload import probability_rows


class EntropyReduction(Aggregator):
    """ERA: P(x) = softmax( (1/M) sum_i Q_i(x) / T ), T = 0.1 (sharpens the AVG teacher).

    Source: DS-FL (Itahara et al., IEEE TMC 2021, entropy reduction aggregation); docs/algorithms.md
    ("Confidence and variance weightings"). Upload: N*C numbers per client.

    The softmax is applied to the *averaged probabilities* (values in [0, 1]), not to logits: with
    T < 1 this lowers the teacher's entropy while keeping AVG's argmax; T = 1 still differs from AVG
    (softmax of probabilities is flatter than the probabilities). Weights over clients are 1/M.
    It keeps AVG's argmax and raises the top probability, but it is not a per-sample entropy
    reduction: the ratio of two teacher probabilities becomes exp((p_a - p_b) / T) <= exp(1 / T), and
    near the uniform teacher exp((p_a - p_b) / T) ~ 1 + (p_a - p_b) / T while p_a / p_b ~ 1 + C (p_a -
    p_b), so with T = 0.1 and C = 10 classes ERA is close to the identity there, and tiny
    probabilities next to mid-sized ones are lifted. On random teachers T = 0.1 lowers the mean
    entropy, T = 0.05 lowers it on every sample (tests/test_aggregator_zoo.py).

    Args:
        temperature: T > 0 (DS-FL: 0.1).
    """

    short_name = "era"
    label = "ERA"  # how tables and figures name the method
    server_label = "DS-FL"  # ERA with the server model DS-FL trains on the same labels
    summed = "probabilities"  # the teacher is a function of the clients' mean probability

    def __init__(self, temperature: float = 0.1):
        check_number("aggregator.temperature", temperature)
        self.temperature = temperature

    def aggregate(self, uploads, ctx):
        z = self.stack_logits(uploads)
        m, n, _ = z.shape
        avg = z.softmax(-1).mean(0)
        weights = uniform_weights(m, n, z.device)
        return AggregationResult(teacher=torch.softmax(avg / self.temperature, -1), weights=weights)

    # secure aggregation (fdlit.privacy.secure_upload): the sharpening acts on the mean probability, a sum / M
    def secure_summands(self, upload, client):
        return {"probabilities": (upload["logits"].float().softmax(-1), 1.0)}

    def aggregate_sums(self, sums, ctx):
        avg = probability_rows(sums.sums["probabilities"] / sums.count)
        return AggregationResult(teacher=torch.softmax(avg / self.temperature, -1).float())
