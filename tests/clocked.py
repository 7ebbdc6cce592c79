"""Runs on a virtual clock for the clock's tests: a tiny digits federation, a clock flag, a fit in
process or through the entry point, and the metrics that say what the clients learned."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

from fdlit.configuration.schema import parse_fit
from fdlit.runs.experiment import Experiment

REPO = Path(__file__).resolve().parents[1]
SEQ, VEC = "fdlit.execution.SequentialExecutor", "fdlit.execution.VectorizedExecutor"
CLOCK = "fdlit.federation.clock."


def tiny(*extra, rounds=3):
    return ["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
            "--federation.rounds", str(rounds), "--federation.private_epochs_first", "1",
            "--federation.private_epochs", "1", "--federation.public_epochs_first", "1",
            "--federation.public_epochs", "1", "--data.num_clients", "4", "--data.classes_per_client", "3",
            "--data.public_size", "120", "--model", "fdlit.models.MLP", "--model.hidden", "[16]", *extra]


def clock(kind, **init_args):
    return ["--federation.clock", json.dumps({"class_path": CLOCK + kind, "init_args": init_args})]


def fitted(*extra, rounds=3):
    parser, cfg = parse_fit(tiny(*extra, rounds=rounds))
    loop = Experiment(cfg, parser).loop
    loop.fit()
    return loop


def learning(history):
    """What the clients learned and sent: everything but time and the clock's own metrics."""
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "async/", "participation/"))} for m in history]


HETEROGENEOUS = {"class_path": CLOCK + "LogNormalProfile", "init_args": {"speed_sigma": 1.5, "bandwidth_sigma": 1.5}}


def refusal(*extra):
    """fit's exit status and what it wrote to stderr, through its entry point in this process."""
    from fdlit.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["fit", *tiny(*extra)])
    return code, err.getvalue().strip().splitlines()


def entry(*args, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    return subprocess.Popen([sys.executable, "-m", "fdlit", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def killed_and_resumed(args: list[str], folder: Path, after: int, rounds: int):
    """Run ``fit args`` through the entry point, SIGKILL it once it has checkpointed release ``after``,
    resume it, run it uninterrupted (in this process, one thread, as the entry point's runs), and return
    both runs' metrics and communication rows (resumed, uninterrupted) and the release it was killed at."""
    from fdlit.runs import read_jsonl
    from fdlit.runs.checkpoint import load_checkpoint
    from tests.deploying import fit_with_one_thread
    from tests.fitting import kill_once_checkpointed

    victim = entry(*args, "--logger.run_dir", str(folder / "victim"))
    killed = kill_once_checkpointed(victim, folder / "victim", after, timeout=600)
    assert killed is not None, f"the victim never finished release {after}"
    killed_at = load_checkpoint(killed)["loop"]["round"]
    assert after <= killed_at < rounds and len(read_jsonl(killed / "metrics.jsonl")) < rounds
    resumed = entry("fit", "--resume", str(killed))
    fit_with_one_thread([*args[1:], "--logger.run_dir", str(folder / "ref")])  # meanwhile, the uninterrupted run
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    (uninterrupted,) = (folder / "ref").iterdir()
    runs = [(read_jsonl(f / "metrics.jsonl"), read_jsonl(f / "communication.jsonl")) for f in (killed, uninterrupted)]
    return runs[0], runs[1], killed_at
