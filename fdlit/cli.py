"""Command line: ``python -m fdlit fit --config configs/digits.yaml [--dotted.flag value ...]``.

Parses and dispatches only: the ``fit`` schema is :mod:`fdlit.config`, a run is assembled (and
resumed) by :mod:`fdlit.runs.experiment`.
"""

from __future__ import annotations

import sys
from typing import Optional

from jsonargparse import ActionYesNo, ArgumentParser

from fdlit.config import fit_parser, rewrite_config_args
from fdlit.errors import ConfigError
from fdlit.federation import NumericalFault
from fdlit.runs.experiment import Experiment, resume_experiment


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


def split_resume(argv: list[str]) -> tuple[str | None, list[str]]:
    """Take ``--resume RUN_DIR`` (or ``--resume=RUN_DIR``) out of ``fit``'s arguments."""
    rest, run_dir = [], None
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        if arg == "--resume":
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ConfigError("resume", "--resume needs a run directory, e.g. --resume runs/<timestamp>-<name>")
            run_dir = argv[i + 1]
            next(it, None)
        elif arg.startswith("--resume="):
            run_dir = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return run_dir, rest


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["fit"]:
            run_dir, rest = split_resume(argv[1:])
            if run_dir is not None:  # fit --resume RUN_DIR [allowed overrides]
                resume_experiment(run_dir, rest).run()
                return 0
        extra: list[str] = []
        if argv[:1] == ["sweep"] and "--" in argv:  # fit flags for every sweep run follow "--"
            at = argv.index("--")
            argv, extra = argv[:at], argv[at + 1:]
        argv = rewrite_config_args(argv)
        parser = build_parser()
        cfg = parser.parse_args(argv)
        if cfg.command == "fit":
            Experiment(cfg.fit, parser._subcommands_action._name_parser_map["fit"]).run()
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
