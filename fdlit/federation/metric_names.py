"""The framework's metric namespaces, and where a method's stats go so that they never replace one."""

from __future__ import annotations

# the framework's metric namespaces: a method's stat never takes a name in them
FRAMEWORK = ("after_private/", "after_public/", "eval/", "teacher/", "weights/", "train/", "comm/",
             "participation/", "privacy/", "server/", "time/", "selection/", "ray/", "clients/after_private/",
             "clients/after_public/", "clients/trust_matrix", "clients/log/", "adversaries/", "audit/", "async/")
METHOD = "method/"  # where a method's stat named like a framework metric is kept instead


def method_stats(stats: dict[str, float]) -> dict[str, float]:
    """A method's stats as the run records them: a name in a framework namespace (``teacher/acc``)
    moves under ``method/``, so it can never replace the framework's own metric."""
    return {f"{METHOD}{k}" if k == "round" or k.startswith(FRAMEWORK) else k: v for k, v in stats.items()}
