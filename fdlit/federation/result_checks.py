"""The framework's check of a method's math: what its ``aggregate`` returned is a teacher and weights
the round can use, or the run stops in one line naming the method and the check.

A method's author writes the rule; fdlit, not the author, checks that its result is what the round
takes (docs/extending.md): a probability teacher (the default, ``Aggregator.teacher_space =
"probabilities"``) is finite, non-negative and each row sums to 1; a logit teacher
(``teacher_space = "logits"``) is finite; weights (M x N, one column per public sample) are
non-negative and each kept column sums to 1 over the clients; shapes match the clients heard and the
public rows of the round. A rule that normalises its weights over samples instead of clients, or
whose teacher rows sum to 10, is stopped at its first round instead of distilling from noise.

The check reads each tensor once (a few reductions over N x C numbers): measured in
``benchmarks/result_checks.py`` against a round's aggregation.
"""

from __future__ import annotations

import torch

from fdlit.errors import ConfigError
from fdlit.methods.base import AggregationResult, Aggregator

TEACHER_SPACES = ("probabilities", "logits")


def tolerance(t: torch.Tensor, classes: int) -> float:
    """How far a float sum of ``classes`` numbers may be from 1: rounding, not a modelling choice."""
    eps = torch.finfo(t.dtype).eps if t.is_floating_point() else 0.0
    return max(1e-4, 16 * eps * max(classes, 1))


def refuse(method: Aggregator, what: str) -> ConfigError:
    return ConfigError("aggregator", f"{type(method).__name__}'s aggregate returned {what}; fdlit checks every "
                                     "method's result (docs/extending.md, what the round checks)")


def check_result(method: Aggregator, result: AggregationResult, clients: int, rows: int, classes: int) -> None:
    """Stop the run unless ``result`` (the method's aggregation of ``clients`` uploads over ``rows``
    public samples and ``classes`` classes) is a teacher and weights the round can use."""
    space = method.teacher_space
    if space not in TEACHER_SPACES:
        raise ConfigError("aggregator", f"{type(method).__name__}.teacher_space is {space!r}; allowed: "
                                        f"{', '.join(TEACHER_SPACES)}")
    keep = result.keep
    if keep is not None and (keep.shape != (rows,) or keep.dtype != torch.bool):
        raise refuse(method, f"a keep mask of shape {tuple(keep.shape)} and dtype {keep.dtype} (expected a "
                             f"bool mask over the round's {rows} public rows)")
    teacher = result.teacher
    if teacher is not None:
        if teacher.dim() != 2 or teacher.shape != (rows, classes):
            raise refuse(method, f"a teacher of shape {tuple(teacher.shape)} (expected {rows} x {classes}: one row "
                                 "per public sample of the round, one column per class)")
        kept = teacher if keep is None else teacher[keep]
        if kept.numel():
            if not bool(torch.isfinite(kept).all()):
                raise refuse(method, "a teacher with NaN or inf entries")
            if space == "probabilities":
                tol = tolerance(kept, classes)
                low = float(kept.min())
                if low < -tol:
                    raise refuse(method, f"a probability teacher with a negative entry ({low:.4g}); declare "
                                         "teacher_space = 'logits' for a logit teacher")
                sums = kept.double().sum(-1)
                worst = int((sums - 1).abs().argmax())
                if abs(float(sums[worst]) - 1) > tol:
                    raise refuse(method, f"a probability teacher whose row {worst} sums to {float(sums[worst]):.6g} "
                                         f"(each row must sum to 1 within {tol:.0e}); declare teacher_space = "
                                         "'logits' for a logit teacher")
    weights = result.weights
    if weights is not None:
        if weights.dim() != 2 or weights.shape != (clients, rows):
            raise refuse(method, f"weights of shape {tuple(weights.shape)} (expected {clients} x {rows}: one row per "
                                 "client heard, one column per public sample)")
        kept = weights if keep is None else weights[:, keep]
        if kept.numel():
            if not bool(torch.isfinite(kept).all()):
                raise refuse(method, "weights with NaN or inf entries")
            tol = tolerance(kept, clients)
            if float(kept.min()) < -tol:
                raise refuse(method, f"a negative weight ({float(kept.min()):.4g}); weights are non-negative")
            sums = kept.double().sum(0)
            worst = int((sums - 1).abs().argmax())
            if abs(float(sums[worst]) - 1) > tol:
                raise refuse(method, f"weights whose column {worst} sums to {float(sums[worst]):.6g} over the clients "
                                     f"(each public sample's weights must sum to 1 over the {clients} clients within "
                                     f"{tol:.0e}: normalised over clients, not over samples)")
