"""The supported ranges, tested: fdlit's smoke set on the oldest and the newest release of each dependency
whose range pyproject.toml states and fdlit leans on (Lightning, torchmetrics, lightning-utilities,
Flower, jsonargparse, W&B).

For each end (``oldest``: every range's lower bound; ``newest``: the newest release pip can install
here within the range) it makes a throwaway virtual environment under /tmp that sees this Python's
packages (torch and the rest, not reinstalled) behind its own, installs the six releases there (pip
resolves them against what it sees; they count as this environment's installation), and runs with this
checkout's fdlit:

    fit (W&B offline), fit --resume (one more round), sweep --stack, deploy (2 SuperNodes), report, export

    python scripts/compat.py [oldest] [newest] [--keep]        (make compat)

Each step prints one line (ok or failed, seconds) and any fallback fdlit noted; the last line of each end names the versions and
says PASS or FAIL; the exit status is 0 only if every end passed. ``--keep`` keeps the environments
and run folders (their paths are printed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning", "torchmetrics", "lightning-utilities", "flwr", "jsonargparse", "wandb")
TINY = ["--config", "digits.yaml", "--logger.progress", "false", "--federation.private_epochs_first", "1",
        "--federation.public_epochs_first", "1", "--federation.private_epochs", "1", "--federation.public_epochs", "1",
        "--data.num_clients", "4", "--data.classes_per_client", "3", "--data.public_size", "100"]


def ranges() -> dict[str, str]:
    """Each package's specifier as pyproject.toml states it (dependencies and the flower extra)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the tomli package
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["flower"]]:
        name, spec = re.match(r"\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)", requirement).groups()
        if name.lower() in PACKAGES:
            found[name.lower()] = spec.split(";")[0].strip()
    missing = [p for p in PACKAGES if p not in found]
    if missing:
        raise SystemExit(f"compat: pyproject.toml states no range for {', '.join(missing)}")
    return found


def installable(name: str) -> list[str]:
    """The releases pip can install here, newest first."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name], capture_output=True, text=True,
                         timeout=120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("Available versions:")), None)
    if line is None:
        raise SystemExit(f"compat: pip lists no releases of {name}: {out.stderr.strip()[-300:]}")
    return [v.strip() for v in line.split(":", 1)[1].split(",")]


def ends(specs: dict[str, str]) -> dict[str, dict[str, str]]:
    """{"oldest": {package: version}, "newest": {...}}: the oldest and the newest installable release
    within each range (the oldest is the range's lower bound where that release exists)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    oldest, newest = {}, {}
    for name, spec in specs.items():
        inside = sorted((Version(v) for v in installable(name) if Version(v) in SpecifierSet(spec)
                         and not Version(v).is_prerelease), reverse=True)
        if not inside:
            raise SystemExit(f"compat: no installable release of {name} satisfies {spec!r}")
        oldest[name], newest[name] = str(inside[-1]), str(inside[0])
    return {"oldest": oldest, "newest": newest}


def make_env(where: Path, versions: dict[str, str]) -> Path:
    """A virtual environment at ``where`` that sees this Python's packages behind its own, with ``versions``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    base = site.getsitepackages()
    Path(own, "fdlit-compat-base.pth").write_text("\n".join(base) + "\n")
    # those packages count as installed here (fdlit's import guard admits the installation's site-packages)
    Path(own, "sitecustomize.py").write_text(
        "import site\n_own = site.getsitepackages\n"
        f"site.getsitepackages = lambda prefixes=None: [*_own(prefixes), *{base!r}]\n")
    pins = [f"{name}=={version}" for name, version in versions.items()]
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check"]
    # then Flower's commands (flower-superlink, flower-supernode, flwr, ...) beside this environment's python
    for command in ([*pip, *pins], [*pip, "--no-deps", "--ignore-installed", f"flwr=={versions['flwr']}"]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            errors = [ln for ln in done.stderr.splitlines() if ln.startswith("ERROR")] or done.stderr.splitlines()
            raise RuntimeError("pip: " + " | ".join(errors[-3:]))
    return python


def installed(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json; "
            f"print(json.dumps({{p: m.version(p) for p in {list(PACKAGES)!r}}}))")
    return json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout)


def smoke(python: Path, work: Path) -> list[tuple[str, bool, float, str]]:
    """The smoke set in ``work``; (step, ok, seconds, the last lines of its output) each."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_DIR": str(work),
           "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    fdlit = [str(python), "-m", "fdlit"]
    sweep = work / "tiny_sweep.yaml"
    sweep.write_text(json.dumps({"name": "compat", "method": "grid", "parameters": {"seed": {"values": [0, 1]}},
                                 "command": ["${env}", "${interpreter}", "-m", "fdlit", "fit", "--config",
                                             "digits.yaml", "${args}"]}))

    def run_dir(folder: Path) -> str:
        found = sorted(p.parent for p in folder.glob("*/metrics.jsonl"))
        return str(found[-1]) if found else str(folder / "missing")

    steps = [
        ("fit", lambda: [*fdlit, "fit", *TINY, "--federation.rounds", "2", "--logger.mode", "offline",
                         "--logger.run_dir", str(work / "fit")]),
        ("fit --resume", lambda: [*fdlit, "fit", "--resume", run_dir(work / "fit"), "--federation.rounds", "3"]),
        ("sweep --stack", lambda: [*fdlit, "sweep", str(sweep), "--stack", "--", *TINY, "--federation.rounds", "1",
                                   "--logger.mode", "disabled", "--logger.run_dir", str(work / "sweep")]),
        ("deploy", lambda: [*fdlit, "deploy", "--nodes", "2", "--threads", "1", "--work-dir", str(work / "deploy-work"),
                            *TINY, "--federation.rounds", "2", "--logger.mode", "disabled",
                            "--logger.run_dir", str(work / "deploy")]),
        ("report", lambda: [*fdlit, "report", str(work / "sweep"), "--out", str(work / "report"),
                            "--formats", "[png]"]),
        ("export", lambda: [*fdlit, "export", run_dir(work / "fit"), "--client", "0", "--out", str(work / "m.pt")]),
    ]
    results = []
    for name, command in steps:
        start = time.monotonic()
        try:
            done = subprocess.run(command(), cwd=work, env=env, capture_output=True, text=True, timeout=900)
            lines = (done.stdout + done.stderr).strip().splitlines()
            ok, tail = done.returncode == 0, lines[-3:]
            logs = [ln for f in (work / "deploy-work").rglob("*.log") if name == "deploy"  # the SuperLink's, nodes'
                    for ln in f.read_text(errors="replace").splitlines()]
            notes = sorted({ln for ln in lines + logs if ln.startswith("fdlit: note:")})  # a fallback fdlit took
        except subprocess.TimeoutExpired:
            ok, tail, notes = False, ["timed out after 900 s"], []
        results.append((name, ok, time.monotonic() - start, " | ".join(tail)))
        print(f"  {name}: {'ok' if ok else 'FAILED'} ({results[-1][2]:.0f} s)" + ("" if ok else f": {results[-1][3]}"),
              flush=True)
        for note in notes:
            print(f"    {note}", flush=True)
    return results


def main(argv: list[str]) -> int:
    keep = "--keep" in argv
    wanted = [a for a in argv if a != "--keep"] or ["oldest", "newest"]
    unknown = [a for a in wanted if a not in ("oldest", "newest")]
    if unknown:
        print(f"compat: error: {unknown[0]}: oldest, newest or --keep", file=sys.stderr)
        return 2
    specs = ranges()
    chosen = ends(specs)
    print("compat: ranges " + ", ".join(f"{n}{s}" for n, s in specs.items()), flush=True)
    passed = True
    for end in wanted:
        base = Path(tempfile.mkdtemp(prefix=f"fdlit-compat-{end}-"))
        print(f"compat {end}: installing " + ", ".join(f"{n}=={v}" for n, v in chosen[end].items()), flush=True)
        try:
            python = make_env(base / "venv", chosen[end])
            have = installed(python)
            wrong = {n: v for n, v in have.items() if v != chosen[end][n]}
            (base / "work").mkdir()
            results = [] if wrong else smoke(python, base / "work")
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            print(f"  install: FAILED ({exc})", flush=True)
            have, wrong, results = {}, {"install": "failed"}, []
        ok = not wrong and all(r[1] for r in results)
        passed &= ok
        print(f"compat {end}: {'PASS' if ok else 'FAIL'} with " + ", ".join(f"{n} {v}" for n, v in have.items())
              + (f" (not the chosen release: {wrong})" if wrong else ""), flush=True)
        if keep:
            print(f"  kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
