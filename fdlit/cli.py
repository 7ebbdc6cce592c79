"""Command line: ``python -m fdlit fit --config configs/digits.yaml [--dotted.flag value ...]``.

Parses and dispatches only: the ``fit`` schema is :mod:`fdlit.configuration.schema`, a run is assembled (and
resumed) by :mod:`fdlit.runs.experiment`. Every way a command ends is one line on stderr and an
exit status: 0 done, 1 stopped by the system (disk full, read-only, ...), 2 bad input (nothing was
started), 3 numerical fault, 130 interrupted (Ctrl-C); a stopped run's line says how to resume it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from typing import TYPE_CHECKING, Literal

from jsonargparse import ActionYesNo, ArgumentParser

from fdlit.configuration.code_allowlist import check_config_files
from fdlit.configuration.schema import PARSER_MODE, config_files, fit_parser, parse_error, rewrite_config_args
from fdlit.errors import ConfigError
from fdlit.extras import require
from fdlit.federation import NumericalFault

if TYPE_CHECKING:  # the run machinery (Lightning) is imported when a run starts, not for --help
    from fdlit.runs.experiment import Experiment

EXIT_OS, EXIT_CONFIG, EXIT_NUMERICAL, EXIT_INTERRUPTED = 1, 2, 3, 130


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="fdlit", description="fdlit: federated distillation experiments.", allow_abbrev=False,
                            parser_mode=PARSER_MODE)  # passed on to the subcommands, fit's included
    sub = parser.add_subcommands(required=True, dest="command")
    sub.add_subcommand("fit", fit_parser(), help="Run one experiment.")
    sub.add_subcommand("sweep", sweep_parser(), help="Run a W&B sweep file locally (grid, grouped, resumable).")
    sub.add_subcommand("report", report_parser(), help="Tables and figures (HTML, PDF, SVG, PNG, LaTeX) from run directories.")
    sub.add_subcommand("export", export_parser(), help="A trained client's or the server's network as TorchScript with its "
                       "input step and a model card (torch alone loads it), or as a plain state dict.")
    # parsed by their own modules (main hands them their arguments); listed here so that --help names them
    sub.add_subcommand("deploy", ArgumentParser(), help="Run a fit config as a Flower federation (the flower extra; "
                       "`fdlit deploy --help`).")
    sub.add_subcommand("data", ArgumentParser(), help="`fdlit data fetch <dataset> --to DIR`: save a paper dataset "
                       "in the files --data.data_dir reads (on a machine with network, for one without).")
    return parser


def export_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Write a trained network of a run (its last checkpoint): by default as "
                            "TorchScript holding its input step, with a model card (FILE.json, also inside the file), "
                            "loadable with torch alone (torch.jit.load); or as a plain state dict with the model's "
                            "class path and init args (see fdlit.runs.export).", allow_abbrev=False)
    parser.add_argument("run_dir", type=str, help="The run directory.")
    parser.add_argument("--client", type=int | None, default=None, help="Export client i (0-based).")
    parser.add_argument("--server", action=ActionYesNo, default=False, help="Export the server model (server.model).")
    parser.add_argument("--out", type=str, required=True, help="The file to write, e.g. model.pt.")
    parser.add_argument("--format", type=Literal["torchscript", "state_dict"], default="torchscript",
                        help="torchscript: the network and its input step, loadable without fdlit, and its model card "
                             "beside it; state_dict: parameters, class path and init args (fdlit rebuilds it).")
    parser.add_argument("--trust_config", action=ActionYesNo, default=False,
                        help="Also import classes from outside fdlit that the run's config.yaml names (its code runs).")
    return parser


def sweep_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Run every combination of a W&B sweep file locally, no W&B server needed. "
                            "Extra fit flags go after '--' (e.g. -- --federation.rounds 2).", allow_abbrev=False)
    parser.add_argument("file", type=str, help="Sweep YAML (W&B sweep format), e.g. sweeps/tau.yaml.")
    parser.add_argument("--dry_run", action=ActionYesNo, default=False, help="List the combinations and their state; run nothing.")
    parser.add_argument("--jobs", type=int, default=1,
                        help="Runs at once, each in its own process and run directory; torch threads are split between them.")
    parser.add_argument("--stack", action=ActionYesNo, default=False,
                        help="Run the combinations that share dataset, network and schedule as one process whose "
                             "executor trains all their clients together; each keeps its own run directory.")
    return parser


def report_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Write Table 1, Figure 2, App. B curves, chi and bytes figures from local runs.",
                            allow_abbrev=False)
    parser.add_argument("runs", type=str, nargs="+", help="Folders holding run directories (searched recursively, "
                        "links to folders followed) or run directories: fdlit report runs, fdlit report runs/A runs/B.")
    parser.add_argument("--out", type=str | None, default=None, help="Output folder; null gives <runs>/report (for "
                        "several folders or run directories, report in the folder that holds them).")
    parser.add_argument("--include_unfinished", action=ActionYesNo, default=False,
                        help="Also use runs that did not finish (crashed or still running).")
    parser.add_argument("--include_duplicates", action=ActionYesNo, default=False,
                        help="Keep every run directory of the same setting and seed (a sweep run twice); by default "
                             "the finished one with the most rounds is used.")
    parser.add_argument("--formats", type=list[str] | str, default=["pdf", "svg", "png"],
                        help="Figure files to write: pdf, svg, png (the PNG is always written; the page shows it); "
                             "a list ([pdf,png]) or one format or a comma-separated string (png, pdf,png).")
    parser.add_argument("--budgets", type=list[int], default=[],
                        help="Also write budgets.md / .csv: each method's best accuracy within its first R rounds, "
                             "one column per R (e.g. --budgets [5,10]).")
    return parser


def report_budgets(value: list[int]) -> list[int]:
    """The round budgets in order, no repeats; each a whole number of rounds of at least 1."""
    bad = [b for b in value if b < 1]
    if bad:
        raise ConfigError("budgets", f"must be whole numbers of rounds >= 1 (e.g. --budgets [5,10]); got {bad}")
    return sorted(set(value))


def report_formats(value: list[str] | str) -> tuple[str, ...]:
    """``--formats png`` and ``--formats pdf,png`` as well as the list form ``--formats [pdf,png]``."""
    return tuple(f.strip() for f in value.split(",") if f.strip()) if isinstance(value, str) else tuple(value)


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


def help_config_files(argv: list[str]) -> tuple[list[str], list[str]]:
    """``fit --config X --help``: take X out so that it becomes the default config file, and the help
    shows X's values as the defaults (jsonargparse shows a default config file's values)."""
    helps = [i for i, a in enumerate(argv) if a in ("-h", "--help")]
    if argv[:1] != ["fit"] or not helps:
        return argv, []
    rest, files, i = [], [], 0
    while i < len(argv):
        if i < helps[0] and argv[i] == "--config" and i + 1 < len(argv):
            files.append(argv[i + 1])
            i += 2
            continue
        if i < helps[0] and argv[i].startswith("--config="):
            files.append(argv[i].split("=", 1)[1])
        else:
            rest.append(argv[i])
        i += 1
    return rest, files


def _parse(argv: list[str]):
    parser = build_parser()
    subparsers = parser._subcommands_action._name_parser_map
    argv, help_configs = help_config_files(argv)
    subparsers["fit"].default_config_files = help_configs
    for p in (parser, *subparsers.values()):
        p.exit_on_error = False  # errors come back as one line naming the field, not a usage dump
    try:
        return parser, parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        command = argv[0] if argv and argv[0] in subparsers else "fdlit"
        raise parse_error(exc, subparsers.get(command, parser), command, config_files(argv)) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    experiment: Experiment | None = None
    if argv[:1] in (["fit"], ["deploy"]):
        from fdlit.execution.allocator import keep_large_blocks

        keep_large_blocks()  # a run's tensors reused, not page-faulted in again every step
    try:
        if argv[:1] == ["fit"]:
            run_dir, rest = split_resume(argv[1:])
            if run_dir is not None:  # fit --resume RUN_DIR [allowed overrides]
                from fdlit.runs.experiment import resume_experiment

                experiment = resume_experiment(run_dir, rest)
                experiment.run()
                return 0
        if argv[:1] == ["deploy"]:  # fit on a Flower federation (fdlit.deployment; needs the flower extra)
            from fdlit.deployment.command import main as deploy

            return deploy(*split_resume(argv[1:]))
        if argv[:1] == ["data"]:  # data fetch: a hub dataset in the files --data.data_dir reads
            from fdlit.data.fetch import main as data

            return data(argv[1:])
        extra: list[str] = []
        if argv[:1] == ["sweep"] and "--" in argv:  # fit flags for every sweep run follow "--"
            at = argv.index("--")
            argv, extra = argv[:at], argv[at + 1:]
        argv = rewrite_config_args(argv)
        check_config_files(config_files(argv))  # bounded reads; every section a mapping
        parser, cfg = _parse(argv)
        if cfg.command == "fit":
            from fdlit.runs.experiment import Experiment

            experiment = Experiment(cfg.fit, parser._subcommands_action._name_parser_map["fit"])
            experiment.run()
        elif cfg.command == "sweep":
            from fdlit.sweeps.controller import run_sweep

            result = run_sweep(cfg.sweep.file, extra, dry_run=cfg.sweep.dry_run, jobs=cfg.sweep.jobs,
                               stack=cfg.sweep.stack)
            if result["failed"]:
                print(f"fdlit sweep: {len(result['failed'])} runs failed: {', '.join(result['failed'])}", file=sys.stderr)
                return 1
        elif cfg.command == "report":
            budgets = report_budgets(cfg.report.budgets)
            require("matplotlib", "report")  # figures
            require("scipy", "report")  # Welch's t-test of the tables' bold rule
            from fdlit.reporting import write_report

            with one_line_warnings("fdlit report"):  # a plotting library's warning, without its source line
                index = write_report(cfg.report.runs, cfg.report.out, include_unfinished=cfg.report.include_unfinished,
                                     include_duplicates=cfg.report.include_duplicates,
                                     formats=report_formats(cfg.report.formats), budgets=budgets)
            print(f"fdlit report: {index}")
        elif cfg.command == "export":
            from fdlit.runs.export import export_model

            written = export_model(cfg.export.run_dir, cfg.export.out, client=cfg.export.client,
                                   server=cfg.export.server, trust_config=cfg.export.trust_config,
                                   format=cfg.export.format)
            source = written["source"]
            card = f"; model card {written['card']}" if "card" in written else ""
            print(f"fdlit export: {cfg.export.out}: {source['model']} after round {source['round']} "
                  f"({written['class_path']}, {cfg.export.format}){card}")
        return 0
    except ConfigError as exc:
        print(f"fdlit: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except NumericalFault as exc:
        print(f"fdlit: numerical fault: {exc}", file=sys.stderr)
        return EXIT_NUMERICAL
    except KeyboardInterrupt:
        print(f"fdlit: interrupted; {_how_to_continue(argv, experiment)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:  # disk full, read-only or vanished folder: the system's words, not a traceback
        what = exc.strerror or type(exc).__name__
        where = f": {exc.filename}" if exc.filename else ""
        print(f"fdlit: stopped: {what}{where}; {_how_to_continue(argv, experiment)}", file=sys.stderr)
        return EXIT_OS


@contextlib.contextmanager
def one_line_warnings(prefix: str):
    """Warnings raised inside as one stderr line each (``<prefix>: warning: <message>``), each
    message once, instead of Python's file, line and source text."""
    seen: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if text not in seen:
            seen.add(text)
            print(f"{prefix}: warning: {text}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


def _how_to_continue(argv: list[str], experiment: Experiment | None) -> str:
    if argv[:1] == ["sweep"]:
        return ("run the same sweep command again to continue: finished runs are skipped and an unfinished "
                "one resumes in its own folder")
    if argv[:1] == ["fit"]:
        return experiment.stopped_hint() if experiment is not None else "the run had not started; nothing was written"
    return "nothing was changed"


if __name__ == "__main__":
    sys.exit(main())
