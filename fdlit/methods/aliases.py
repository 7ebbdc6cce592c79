"""The methods' former names: the package was ``fdlit.aggregators`` and most classes ended in
``Aggregator``. Configs, checkpoints and run directories written with those names keep working: the old
package imports as a deprecated alias of this one (``fdlit/aggregators``), the old class names resolve to
the new classes with a ``FutureWarning``, and reports label old runs as new ones."""

from __future__ import annotations

import warnings

OLD_PACKAGE, PACKAGE = "fdlit.aggregators", "fdlit.methods"
# former class name -> current class name (the others kept theirs: FedAvg, FedDF, FedProx, Scaffold, ...)
RENAMED = {
    "ProbabilityAveragingAggregator": "ProbabilityAveraging",
    "UncertaintyWeightedAggregator": "UncertaintyWeighted",
    "SmoothedUncertaintyWeightedAggregator": "SmoothedUncertaintyWeighted",
    "EntropyWeightedAggregator": "EntropyWeighted",
    "EntropyReductionAggregator": "EntropyReduction",
    "LogitAveragingAggregator": "LogitAveraging",
    "LogitVarianceAggregator": "LogitVariance",
    "MetaModelAggregator": "MetaModel",
    "SelectiveFDAggregator": "SelectiveFD",
    "FedMDAggregator": "FedMD",
    "FedGOAggregator": "FedGO",
    "F2LAggregator": "F2L",
    "LKDAggregator": "LKD",
    "OracleAggregator": "Oracle",
}


def warn_renamed(old: str, new: str) -> None:
    # FutureWarning, not DeprecationWarning: Python shows it to users running a config, not only to developers
    warnings.warn(f"{old} is a former name of {new}; it still works, but write {new} in new configs",
                  FutureWarning, stacklevel=4)


def renamed_class(name: str, namespace: dict):
    """The class a former class name refers to in ``namespace`` (fdlit.methods' globals), with a
    warning; None if ``name`` is not a former name."""
    if name not in RENAMED:
        return None
    warn_renamed(name, RENAMED[name])
    return namespace[RENAMED[name]]


def canonical_class_path(class_path: str) -> str:
    """A class path in current names: ``fdlit.aggregators.SmoothedUncertaintyWeightedAggregator`` ->
    ``fdlit.methods.SmoothedUncertaintyWeighted``; any other path unchanged."""
    module, _, name = class_path.rpartition(".")
    if module == OLD_PACKAGE or module.startswith(OLD_PACKAGE + "."):
        module = PACKAGE + module[len(OLD_PACKAGE):]
    if module == PACKAGE or module.startswith(PACKAGE + "."):
        name = RENAMED.get(name, name)
    return f"{module}.{name}" if module else name
