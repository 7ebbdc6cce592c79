"""Command line: ``python -m fdlit fit --config configs/digits.yaml [--dotted.flag value ...]``.

Built on jsonargparse: every constructor argument of the configured classes is a dotted flag and a
YAML key; aggregators, models and executors are chosen with ``class_path`` / ``init_args``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import torch
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser, Namespace

from fdlit.aggregators import Aggregator
from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.errors import ConfigError
from fdlit.federation import FederationLoop, NumericalFault, format_summary
from fdlit.federation.checkpoint import resume_hint, resume_loop, split_resume
from fdlit.loggers import LoggerConfig

PACKAGE_ROOT = Path(__file__).resolve().parent
CONFIG_DIRS = (Path.cwd() / "configs", PACKAGE_ROOT.parent / "configs")
LOOP_OBJECTS = {"data", "model", "client", "aggregator", "logger", "seed", "config", "config_yaml"}


def resolve_config_path(value: str) -> str:
    """``--config cifar100.yaml`` or ``--config cifar100`` finds ``configs/cifar100.yaml``."""
    path = Path(value)
    if path.exists():
        return value
    names = [value] if value.endswith((".yaml", ".yml")) else [value, value + ".yaml"]
    for folder in CONFIG_DIRS:
        for name in names:
            if (folder / name).exists():
                return str(folder / name)
    shipped = sorted({p.name for folder in CONFIG_DIRS if folder.exists() for p in folder.glob("*.yaml")})
    raise ConfigError("config", f"no config file {value!r}; shipped configs: {', '.join(shipped) or 'none'}")


def fit_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Run one federated-distillation experiment. Continue a killed run with "
                            "`fdlit fit --resume RUN_DIR` (config and seed come from RUN_DIR).", env_prefix="FDLIT",
                            default_env=False)
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file (path, or a name in configs/)")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the partition, models and batch order.")
    parser.add_class_arguments(FederatedData, "data")
    parser.add_subclass_arguments(
        torch.nn.Module, "model", instantiate=False, required=False,
        default={"class_path": "fdlit.models.SmallCNN"},
        help="Client network (class_path/init_args); input_shape and num_classes come from the data.",
    )
    parser.add_class_arguments(ClientOptimization, "client")
    parser.add_subclass_arguments(
        Aggregator, "aggregator", required=False,
        default={"class_path": "fdlit.aggregators.SmoothedUncertaintyWeightedAggregator"},
        help="Aggregation rule (class_path/init_args), e.g. fdlit.aggregators.ProbabilityAveragingAggregator.",
    )
    parser.add_class_arguments(FederationLoop, "federation", skip=LOOP_OBJECTS, instantiate=False)
    parser.add_class_arguments(LoggerConfig, "logger")
    return parser


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="fdlit", description="fdlit: federated distillation experiments.")
    sub = parser.add_subcommands(required=True, dest="command")
    sub.add_subcommand("fit", fit_parser(), help="Run one experiment.")
    sub.add_subcommand("sweep", sweep_parser(), help="Run a W&B sweep file locally (grid, grouped, resumable).")
    sub.add_subcommand("report", report_parser(), help="Tables and figures (HTML, PNG, Markdown) from run directories.")
    return parser


def sweep_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Run every combination of a W&B sweep file locally, no W&B server needed. "
                            "Extra fit flags go after '--' (e.g. -- --federation.rounds 2).")
    parser.add_argument("file", type=str, help="Sweep YAML (W&B sweep format), e.g. sweeps/tau.yaml.")
    parser.add_argument("--dry_run", action=ActionYesNo, default=False, help="List the combinations and their state; run nothing.")
    return parser


def report_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Write Table 1, Figure 2, App. B curves, chi and bytes figures from local runs.")
    parser.add_argument("runs", type=str, help="Folder holding run directories (searched recursively).")
    parser.add_argument("--out", type=Optional[str], default=None, help="Output folder; null gives <runs>/report.")
    parser.add_argument("--include_unfinished", action=ActionYesNo, default=False,
                        help="Also use runs that did not finish (crashed or still running).")
    return parser


def _rewrite_config_args(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = resolve_config_path(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + resolve_config_path(arg.split("=", 1)[1])
    return out


def parse_fit(argv: list[str]) -> tuple[ArgumentParser, Namespace]:
    """Parse ``fit`` arguments (without the subcommand word), resolving bare config names."""
    parser = fit_parser()
    return parser, parser.parse_args(_rewrite_config_args(argv))


def build_loop(cfg: Namespace, parser: Optional[ArgumentParser] = None) -> FederationLoop:
    """Instantiate every object of a parsed ``fit`` config; raises ConfigError before training."""
    parser = parser or fit_parser()
    init = parser.instantiate(cfg)
    config_dict = cfg.clone().as_dict()
    config_dict.pop("config", None)
    config_yaml = parser.dump(cfg, skip_unset=False)  # keep null keys: the saved config is complete
    return FederationLoop(
        **vars(init.federation),
        data=init.data,
        model=cfg.model.as_dict(),
        client=init.client,
        aggregator=init.aggregator,
        logger=init.logger,
        seed=cfg.seed,
        config=config_dict,
        config_yaml=config_yaml,
    )


def fit(cfg: Namespace, parser: ArgumentParser) -> dict:
    return run_loop(build_loop(cfg, parser))


def run_loop(loop: FederationLoop) -> dict:
    try:
        summary = loop.fit()
    except NumericalFault as exc:
        raise NumericalFault(f"{exc}\n{resume_hint(loop)}") from None
    print(format_summary(summary))
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["fit"]:
            run_dir, rest = split_resume(argv[1:])
            if run_dir is not None:  # fit --resume RUN_DIR [allowed overrides]
                run_loop(resume_loop(run_dir, rest))
                return 0
        extra: list[str] = []
        if argv[:1] == ["sweep"] and "--" in argv:  # fit flags for every sweep run follow "--"
            at = argv.index("--")
            argv, extra = argv[:at], argv[at + 1:]
        argv = _rewrite_config_args(argv)
        parser = build_parser()
        cfg = parser.parse_args(argv)
        if cfg.command == "fit":
            fit(cfg.fit, parser._subcommands_action._name_parser_map["fit"])
        elif cfg.command == "sweep":
            from fdlit.sweep import run_sweep

            result = run_sweep(cfg.sweep.file, extra, dry_run=cfg.sweep.dry_run)
            if result["failed"]:
                print(f"fdlit sweep: {len(result['failed'])} runs failed: {', '.join(result['failed'])}", file=sys.stderr)
                return 1
        elif cfg.command == "report":
            from fdlit.report import write_report

            index = write_report(cfg.report.runs, cfg.report.out, include_unfinished=cfg.report.include_unfinished)
            print(f"fdlit report: {index}")
        return 0
    except ConfigError as exc:
        print(f"fdlit: error: {exc}", file=sys.stderr)
        return 2
    except NumericalFault as exc:
        print(f"fdlit: numerical fault: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
