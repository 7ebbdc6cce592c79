"""fdlit's FedTGP, FedGH, LG-FedAvg, FedProto and FD next to the authors' code in HtFLlib (Zhang et al.,
KDD 2025 benchmark track; github.com/TsingZ0/HtFLlib), on one shared digits split, round by round.

    OMP_NUM_THREADS=1 python scripts/side_by_side_htfllib.py --authors PATH/HtFLlib \
        [--methods fedtgp fedgh lg_fedavg fedproto fd] [--seeds 0 1 2] [--clients 6] [--classes 3] \
        [--rounds 5] [--epochs 1] [--fixture PATH]

``--authors``: an export of their repository (its ``system/`` folder is put on ``sys.path`` at run time;
none of it is part of fdlit). Their server and client classes (``system/flcore/servers/server*.py``,
``system/flcore/clients/client*.py``) run unmodified through their ``Server.train``; around them:

* ``torchvision``: their ``flcore/trainmodel/models.py`` imports it at module level and uses it only in
  model names a run can choose; the script writes an empty stand-in package into a temporary folder.
  ``h5py`` (their ``Server.save_results``) and scikit-learn (their ``Client.test_metrics``) are needed.
* ``torch.load``: their clients save and load whole networks each step (``torch.save(model)``), which
  torch >= 2.6 refuses by default (``weights_only``); the script sets torch's public switch
  ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``.
* the split: fdlit's digits split of the same command (each client's training rows; as their test rows,
  the test rows of the client's own classes, fdlit's local-accuracy rows), written as their
  ``dataset/<name>/{train,test}/<i>.npz`` files, read by their own ``read_client_data``.
* the networks: their ``BaseHeadSplit`` builds each client's network from ``args.models`` and
  ``args.heads`` (expressions it evaluates); they name a support module the script writes, which
  returns client i's fdlit network (its initial weights, as fdlit's run draws them) as the feature
  extractor and a copy of its output layer as the head. So both sides start from the same weights.

Both sides then train with the same settings (SGD at ``--lr`` with no momentum, batches of
``--batch_size``, ``--epochs`` a round, their server settings). Measured on both sides, after every
round, with the networks each side holds then: the mean over clients of each client's accuracy on the
test rows of its own classes (fdlit's local accuracy) and on the whole test set (global accuracy),
each its own network's prediction (head on features); for their side the script measures their saved
networks. Their own metric (their ``evaluate``: correct / total over all clients; FedProto and FedTGP
classify by the nearest global prototype) is printed as well. ``--fixture`` writes both sides' numbers,
with their commit and this command, for tests/test_htfllib_authors.py.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import types
import warnings
from pathlib import Path

import numpy as np
import torch

# method: (fdlit configs, their server module and class, fdlit's knobs from the shared settings)
METHODS = {
    "fedtgp": (["digits_fedtgp.yaml"], "servertgp", "FedTGP"),
    "fedgh": (["digits_fedgh.yaml"], "servergh", "FedGH"),
    "lg_fedavg": (["digits_lg_fedavg.yaml"], "serverlg", "LG_FedAvg"),
    "fedproto": (["digits_fedproto.yaml", "models/digits_mixed.yaml"], "serverproto", "FedProto"),
    "fd": (["digits_fd.yaml", "models/digits_mixed.yaml"], "serverfd", "FD"),
}
TOLERANCE = 0.05  # the largest gap allowed between the two sides' seed means, each round (accuracy)

SUPPORT = '''"""fdlit's networks for HtFLlib's BaseHeadSplit (written by scripts/side_by_side_htfllib.py)."""
import copy
import torch

NETWORKS = {}  # client id -> fdlit's initial network


class FdlitFeatures(torch.nn.Module):
    """fdlit's network up to its penultimate features; ``fc`` is what BaseHeadSplit replaces by its
    pooling to feature_dim (the identity at fdlit's own width)."""

    def __init__(self, net):
        super().__init__()
        self.net, self.fc = net, torch.nn.Identity()

    def forward(self, x):
        return self.fc(self.net.embed(x))


def output_layer(net):
    layer = [m for m in net.modules() if isinstance(m, torch.nn.Linear)][-1]
    probe = torch.randn(2, layer.in_features)
    assert torch.equal(net.classify(probe), layer(probe)), "the last Linear is not the network's output layer"
    return layer


def base(cid):
    return FdlitFeatures(copy.deepcopy(NETWORKS[cid]))


def head(cid):
    return copy.deepcopy(output_layer(NETWORKS[cid]))
'''


def fit_argv(args, method: str, seed: int, run_dir: str) -> list[str]:
    """fdlit's run of ``method`` on the shared setting."""
    configs, _, _ = METHODS[method]
    knobs = {"fedtgp": ["--aggregator.init_args.lam", str(args.lam), "--aggregator.init_args.server_epochs",
                        str(args.server_epochs), "--aggregator.init_args.server_lr", str(args.lr),
                        "--aggregator.init_args.server_batch_size", str(args.batch_size),
                        "--aggregator.init_args.margin_threshold", str(args.margin)],
             "fedgh": ["--aggregator.init_args.server_epochs", str(args.server_epochs),
                       "--aggregator.init_args.server_lr", str(args.server_lr),
                       "--aggregator.init_args.server_batch_size", str(args.batch_size)],
             "lg_fedavg": [],
             "fedproto": ["--aggregator.init_args.lam", str(args.lam), "--aggregator.init_args.weighting", "mean"],
             "fd": ["--aggregator.init_args.gamma", str(args.lam), "--aggregator.init_args.temperature", "1.0"]}
    return [*(a for c in configs for a in ("--config", c)), *knobs[method], "--seed", str(seed),
            "--logger.mode", "disabled", "--logger.progress", "false", "--logger.run_dir", run_dir,
            "--federation.rounds", str(args.rounds), "--data.num_clients", str(args.clients),
            "--data.classes_per_client", str(args.classes),
            "--federation.private_epochs_first", str(args.epochs), "--federation.private_epochs", str(args.epochs),
            "--federation.executor", "fdlit.execution.SequentialExecutor",
            "--client.optimizer", "sgd", "--client.lr", str(args.lr), "--client.batch_size", str(args.batch_size)]


def mean_accuracies(models, data, local_masks) -> tuple[float, float]:
    """Mean over clients of the accuracy on their own classes' test rows and on the whole test set."""
    local, whole = [], []
    with torch.no_grad():
        for i, model in enumerate(models):
            model.eval()
            right = (model(data.test.x).argmax(1) == data.test.y).float()
            local.append(float(right[local_masks[i]].mean()))
            whole.append(float(right.mean()))
    return float(np.mean(local)), float(np.mean(whole))


# ------------------------------------------------------------------------------------------- fdlit
def run_fdlit(args, method: str, seed: int):
    """fdlit's run: the split, each client's initial network, and per round (local, global) accuracy."""
    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.experiment import Experiment

    with tempfile.TemporaryDirectory() as run_dir:
        parser, cfg = parse_fit(fit_argv(args, method, seed, run_dir))
        loop = Experiment(cfg, parser).loop
        loop.setup()
        initial = [copy.deepcopy(c.model) for c in loop.parts.clients.clients]
        masks = loop.parts.evaluate.local_mask_matrix.bool().cpu()
        loop.fit()
    rounds = [(h["after_public/local_acc_mean"], h["after_public/global_acc_mean"]) for h in loop.history]
    return loop.data, initial, masks, rounds


# ----------------------------------------------------------------------------------------- authors
def write_split(folder: Path, name: str, data, masks) -> None:
    """Their data files: client i's training rows, and as its test rows those of its own classes."""
    for part in ("train", "test"):
        (folder / name / part).mkdir(parents=True, exist_ok=True)
    for i, client in enumerate(data.clients):
        for part, x, y in (("train", client.train.x, client.train.y),
                           ("test", data.test.x[masks[i]], data.test.y[masks[i]])):
            with open(folder / name / part / f"{i}.npz", "wb") as f:
                np.savez(f, data={"x": x.numpy(), "y": y.numpy()})


def their_args(args, method: str, name: str, num_classes: int, feature_dim: int) -> types.SimpleNamespace:
    """Their ``main.py``'s arguments (its defaults) with the shared setting."""
    _, _, algorithm = METHODS[method]
    return types.SimpleNamespace(
        algorithm=algorithm, dataset=name, device="cpu", save_folder_name="temp", models_folder_name="",
        num_classes=num_classes, batch_size=args.batch_size, local_learning_rate=args.lr, local_epochs=args.epochs,
        global_rounds=args.rounds, num_clients=args.clients, join_ratio=1.0, random_join_ratio=False,
        few_shot=0, time_select=False, goal="test", time_threthold=10000, top_cnt=100, auto_break=False,
        eval_gap=1, client_drop_rate=0.0, train_slow_rate=0.0, send_slow_rate=0.0, feature_dim=feature_dim,
        lamda=args.lam, server_epochs=args.server_epochs, server_learning_rate=args.server_lr,
        margin_threthold=args.margin,
        models=["__import__('fdlit_htfllib_support').base(cid)"],
        heads=["__import__('fdlit_htfllib_support').head(cid)"])


def run_authors(args, method: str, seed: int, data, initial, masks, scratch: Path):
    """Their server class on fdlit's split and networks; per round (local, global) accuracy of their
    clients' saved networks and their own evaluate's number."""
    import importlib

    from flcore.clients.clientbase import load_item

    support = sys.modules["fdlit_htfllib_support"]
    support.NETWORKS.clear()
    support.NETWORKS.update(enumerate(initial))
    name = f"fdlit_digits_{method}_{seed}"
    write_split(scratch / "dataset", name, data, masks)
    _, module, cls = METHODS[method]
    Server = getattr(importlib.import_module(f"flcore.servers.{module}"), cls)
    records: list[tuple[float, float, float]] = []

    class Recording(Server):
        def evaluate(self, acc=None, loss=None):
            super().evaluate(acc, loss)  # theirs, unchanged; then the same networks measured as fdlit's
            models = [load_item(c.role, "model", c.save_folder_name) for c in self.clients]
            local, whole = mean_accuracies(models, data, masks)
            records.append((local, whole, float(self.rs_test_acc[-1])))
            if method == "fd":  # the targets of their next round's distillation term
                logits = load_item("Server", "global_logits", self.save_folder_name)
                targets.append(min(float(v.min()) for v in logits.values()) if logits else None)

    width = int(initial[0].embed(data.test.x[:2]).shape[1])
    torch.manual_seed(seed)
    np.random.seed(seed)
    os.chdir(scratch / "system")  # their paths: ../dataset, ../results, temp/
    targets: list[float | None] = []
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            Recording(their_args(args, method, name, data.num_classes, width), 0).train()
    except ValueError as e:  # their AUC (scikit-learn) refuses NaN outputs: their networks diverged
        lowest = f"; the lowest entry of the global logits it last trained on: {targets[-1]:.2f}" \
            if targets and targets[-1] is not None else ""
        print(f"{method}, seed {seed}: their run stopped after {len(records) - 1} rounds: {e}{lowest}", file=sys.stderr)
    records += [(math.nan,) * 3] * (args.rounds + 1 - len(records))
    return records[1:]  # records[r]: after r rounds (records[0]: before any)


# ------------------------------------------------------------------------------------------- table
def summarise(ours: list[list[tuple]], theirs: list[list[tuple]]) -> dict:
    """Per round the seed means and standard deviations of both sides, and the gap."""
    f, a = np.array(ours), np.array(theirs)  # seeds x rounds x metrics
    out = {"fdlit_local": f[:, :, 0].mean(0), "fdlit_local_std": f[:, :, 0].std(0),
           "theirs_local": a[:, :, 0].mean(0), "theirs_local_std": a[:, :, 0].std(0),
           "fdlit_global": f[:, :, 1].mean(0), "theirs_global": a[:, :, 1].mean(0), "theirs_own": a[:, :, 2].mean(0)}
    out["gap"] = np.maximum(abs(out["fdlit_local"] - out["theirs_local"]), abs(out["fdlit_global"] - out["theirs_global"]))
    return out


def show(method: str, s: dict) -> list[str]:
    lines = [f"\n{method}   (mean over seeds; local: own classes' test rows, global: whole test set)",
             "round | local fdlit | local theirs | global fdlit / theirs | theirs, own evaluate | largest gap"]
    for r in range(len(s["gap"])):
        lines.append(f"{r + 1:5d} | {s['fdlit_local'][r]:.3f} ± {s['fdlit_local_std'][r]:.3f} | "
                     f"{s['theirs_local'][r]:.3f} ± {s['theirs_local_std'][r]:.3f} | "
                     f"{s['fdlit_global'][r]:.3f} / {s['theirs_global'][r]:.3f} | {s['theirs_own'][r]:.3f} | "
                     f"{s['gap'][r]:.3f}{'' if s['gap'][r] <= TOLERANCE else '  over the tolerance'}")
    return lines


def write_fixture(args, recorded: dict, command: str) -> None:
    commit = subprocess.run(["git", "-C", str(args.authors), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or args.commit
    fixture = {"source": f"github.com/TsingZ0/HtFLlib, commit {commit}: their server and client classes "
                         "run unmodified on fdlit's digits split and initial networks by "
                         "scripts/side_by_side_htfllib.py",
               "command": "scripts/side_by_side_htfllib.py " + command.replace(str(args.authors), "PATH/TO/HtFLlib"),
               "setting": {k: getattr(args, k) for k in ("clients", "classes", "rounds", "epochs", "lr", "batch_size",
                                                         "lam", "server_epochs", "server_lr", "margin", "seeds")},
               "tolerance": TOLERANCE,
               "columns": "per seed, per round: [mean local accuracy, mean global accuracy] (fdlit); "
                          "[mean local, mean global, their own evaluate's accuracy] (theirs)",
               "methods": "@"}
    body = ",\n ".join(
        f'"{m}": {{\n  "fdlit": {json.dumps(v["fdlit"])},\n  "theirs": {json.dumps(v["theirs"])}\n }}'
        for m, v in recorded.items())
    text = json.dumps(fixture, indent=1).replace('"@"', "{\n " + body + "\n}")
    json.loads(text)
    args.fixture.write_text(text + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", required=True, type=Path, help="export of TsingZ0/HtFLlib")
    parser.add_argument("--commit", default="unknown", help="their commit, when --authors is not a git checkout")
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--classes", type=int, default=3, help="classes per client")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--lam", type=float, default=1.0, help="FedProto's and FedTGP's lambda, FD's gamma")
    parser.add_argument("--server_epochs", type=int, default=100)
    parser.add_argument("--server_lr", type=float, default=0.01, help="FedGH's server learning rate")
    parser.add_argument("--margin", type=float, default=100.0, help="FedTGP's margin threshold tau")
    parser.add_argument("--fixture", type=Path, help="write both sides' numbers here (JSON, with provenance)")
    args = parser.parse_args(argv)
    system = (args.authors / "system").resolve()
    if not (system / "flcore" / "servers" / "servertgp.py").is_file():
        parser.error(f"--authors: an export of TsingZ0/HtFLlib; no system/flcore/servers in {args.authors}")
    if args.fixture is not None:
        args.fixture = args.fixture.resolve()
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # their clients torch.save whole networks
    warnings.filterwarnings("ignore", message="Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    torch.set_num_threads(1)
    cwd = os.getcwd()
    recorded = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        (scratch / "torchvision").mkdir()
        (scratch / "torchvision" / "__init__.py").write_text('"""stand-in: their models.py imports it."""\n')
        (scratch / "fdlit_htfllib_support.py").write_text(SUPPORT)
        (scratch / "system").mkdir()
        sys.path[:0] = [str(scratch), str(system)]
        import fdlit_htfllib_support  # noqa: F401  (their BaseHeadSplit imports it by name)

        for method in args.methods:
            ours, theirs = [], []
            for seed in args.seeds:
                data, initial, masks, mine = run_fdlit(args, method, seed)
                ours.append(mine)
                theirs.append(run_authors(args, method, seed, data, initial, masks, scratch))
                os.chdir(cwd)
            recorded[method] = {side: [[[None if math.isnan(v) else v for v in r] for r in s] for s in runs]
                                for side, runs in (("fdlit", ours), ("theirs", theirs))}  # null: diverged
            print("\n".join(show(method, summarise(ours, theirs))), flush=True)
    if args.fixture is not None:
        write_fixture(args, recorded, " ".join(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
