"""A rule written outside fdlit: the coordinate-wise median teacher.

    P(x)_c = median_i softmax(z_i(x))_c / sum_c' median_i softmax(z_i(x))_c'

The median of the clients' probabilities, renormalised per public sample: a client that is alone in
claiming (or denying) a class cannot move the teacher, unlike the mean (AVG). It has no per-client
weights, so no weight concentration is logged. Run it from this folder (or with it on PYTHONPATH):

    python -m fdlit fit --config digits.yaml --aggregator median_teacher.MedianTeacher
"""

from __future__ import annotations

from fdlit.methods.base import AggregationResult, Aggregator


class MedianTeacher(Aggregator):
    """The coordinate-wise median of the clients' probabilities (server part only: clients upload
    their public logits, as for AVG)."""

    short_name = "median"

    def aggregate(self, uploads, ctx):
        probs = self.stack_logits(uploads).softmax(-1)  # M x N x C
        median = probs.median(dim=0).values
        return AggregationResult(teacher=median / median.sum(-1, keepdim=True).clamp_min(1e-12))
