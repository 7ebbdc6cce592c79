"""What a run's privacy numbers mean, in words the summary and the report print.

**epsilon.** An (epsilon, delta) guarantee bounds how much more likely any output is with a client's data
than without it by a factor e^epsilon (beside a delta chance). At epsilon = 10 that factor is already
about 22,000, so an attacker's odds of telling two neighbouring data sets apart may rise that much:
such a bound excludes no realistic attack. Practice treats epsilon <= 1 as strong and single digits as
the limit of a meaningful guarantee (Dwork and Roth 2014, Sec. 2.3; Ponomareva et al. 2023, *How to
DP-fy ML*, Sec. 5.2, who call epsilon > 10 providing no meaningful formal guarantee). fdlit flags every
epsilon above ``MEANINGFUL_EPSILON``.

**secure aggregation.** A round whose masked sum could not be unmasked (fewer survivors than the
threshold t) has no teacher; the summary names those rounds instead of blaming the method.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MEANINGFUL_EPSILON = 10.0


def epsilon_meaning(epsilon: float | None) -> str:
    """A note for an epsilon: "" where it is a meaningful bound (or there is none), else why not."""
    if epsilon is None or not math.isfinite(epsilon) or epsilon <= MEANINGFUL_EPSILON:
        return ""
    return f"no meaningful guarantee (epsilon > {MEANINGFUL_EPSILON:g})"


def privacy_summary(history: Sequence[dict]) -> dict:
    """The summary's privacy entries (none for a run without DP or secure aggregation): the last
    epsilon and whether it means anything; the rounds whose secure aggregation failed, and the last
    round's survivors and threshold."""
    out: dict = {}
    eps = [h for h in history if "privacy/epsilon" in h]
    if eps:
        last = eps[-1]
        out |= {"privacy_epsilon": last["privacy/epsilon"], "privacy_delta": last.get("privacy/delta"),
                "privacy_epsilon_meaningful": not epsilon_meaning(last["privacy/epsilon"])}
    secure = [h for h in history if "secagg/failed" in h]
    if secure:
        failed = [h for h in secure if h["secagg/failed"] == 1]
        out["secagg_failed_rounds"] = len(failed)
        if failed:
            out |= {"secagg_failed_last_round": failed[-1]["round"],
                    "secagg_failed_survivors": failed[-1].get("secagg/survivors"),
                    "secagg_failed_threshold": failed[-1].get("secagg/threshold")}
    return out


def summary_lines(summary: dict) -> list[str]:
    """The printed summary's privacy lines (fdlit.federation.summary_text)."""
    lines = []
    if "privacy_epsilon" in summary:
        eps, meaning = summary["privacy_epsilon"], epsilon_meaning(summary["privacy_epsilon"])
        lines.append(f"  privacy                   : epsilon {eps:.4g} at delta {summary.get('privacy_delta'):g} "
                     f"per client{'; ' + meaning if meaning else ''}")
    if summary.get("secagg_failed_rounds"):
        lines.append(f"  secure aggregation        : failed in {summary['secagg_failed_rounds']} round(s), no teacher "
                     f"there (last: round {summary['secagg_failed_last_round']}, "
                     f"{summary['secagg_failed_survivors']:.0f} survivors, threshold "
                     f"{summary['secagg_failed_threshold']:.0f})")
    return lines


def no_teacher_cause(summary: dict) -> str:
    """Why the last round has no teacher, as the summary says it."""
    if summary.get("secagg_failed_last_round") == summary.get("final_round") and summary.get("secagg_failed_rounds"):
        return (f"no teacher (secure aggregation failed: {summary['secagg_failed_survivors']:.0f} survivors, "
                f"fewer than its threshold {summary['secagg_failed_threshold']:.0f})")
    if "secagg_failed_rounds" in summary:  # a secure run whose last round had no upload to sum
        return "no teacher in the last round (no client's upload arrived)"
    return "no teacher (this run sends no predictions on the public set)"
