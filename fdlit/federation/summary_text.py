"""The run's closing summary as printed: each number with the round and the test samples it was
measured on, and no number where there is none (``no teacher``, never ``nan``)."""

from __future__ import annotations

import math

from fdlit.messages import JSON, Metrics
from fdlit.privacy.guarantee import no_teacher_cause, summary_lines


def _number(value: JSON) -> float | None:
    """A finite number, or None (a NaN, a null from summary.json, a missing key)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _acc(summary: Metrics, key: str, missing: str = "not measured") -> str:
    value = _number(summary.get(key))
    return missing if value is None else f"{value:.4f}"


def _on(samples: JSON, full: JSON) -> str:
    """``on 1000 of 1797 test samples (federation.eval_subsample)`` / ``on all 1797 test samples``."""
    if not isinstance(samples, int) or isinstance(samples, bool) or samples <= 0:
        return ""
    if isinstance(full, int) and samples < full:
        return f", on {samples} of {full} test samples (federation.eval_subsample)"
    return f", on all {samples} test samples"


def format_summary(summary: Metrics) -> str:
    mb = 1024**2
    full = summary.get("final_test_samples")
    best = (f"  best mean global accuracy : {_acc(summary, 'best_global_acc_mean')} after public phase (round "
            f"{summary.get('best_round')}{_on(summary.get('best_test_samples'), full)}), "
            f"{_acc(summary, 'best_global_acc_mean_after_private')} after private phase (round "
            f"{summary.get('best_round_after_private')}{_on(summary.get('best_test_samples_after_private'), full)})")
    lines = [f"fdlit summary: {summary['run']}  ({summary['rounds']} rounds, {summary['wall_time_s']:.1f} s)", best]
    if summary.get("measured_network"):
        lines.insert(1, f"  network measured          : {summary['measured_network']}")
    if "selected_global_acc_mean" in summary:
        lines.append(
            f"  validation-selected       : {_acc(summary, 'selected_global_acc_mean')} after public phase (round "
            f"{summary.get('selected_round')}{_on(summary.get('selected_test_samples'), full)}), "
            f"{_acc(summary, 'selected_global_acc_mean_after_private')} after private phase (round "
            f"{summary.get('selected_round_after_private')}"
            f"{_on(summary.get('selected_test_samples_after_private'), full)}); the round of best validation accuracy")
    lines.append(f"  final mean local accuracy : {_acc(summary, 'final_local_acc_mean_after_private')} after private "
                 f"phase, {_acc(summary, 'final_local_acc_mean_after_public')} after public phase (round "
                 f"{summary.get('final_round')}, each client on its own classes{_on(full, full)})")
    teacher = _number(summary.get("final_teacher_acc"))
    lines.append("  final teacher accuracy    : " + (
        f"{teacher:.4f} (on the public set's labels, diagnostic)" if teacher is not None else
        no_teacher_cause(summary)))
    lines += summary_lines(summary)
    if "server_final_acc" in summary:
        lines.append(f"  server model accuracy     : {_acc(summary, 'server_final_acc')} final, "
                     f"{_acc(summary, 'server_best_acc')} best (round {summary.get('server_best_round')})")
    lines += [f"  bytes up / down           : {summary['bytes_up_total'] / mb:.2f} MiB / "
              f"{summary['bytes_down_total'] / mb:.2f} MiB",
              f"  run directory             : {summary['run_dir']}"]
    return "\n".join(lines)
