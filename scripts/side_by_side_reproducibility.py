"""fdlit's CFD, COMET and Selective-FD next to the SCARLET authors' code for them (kitsuyaazuma/SCARLET,
``reproducibility`` branch, ``src/algorithm/``), on one shared digits setting, round by round.

    OMP_NUM_THREADS=1 python scripts/side_by_side_reproducibility.py --authors PATH/SCARLET-reproducibility \
        [--methods cfd comet selective] [--clients 10] [--rounds 8] [--epochs 2] [--seed 0] [--fixture PATH]

``--authors``: an export of that branch (its ``src`` is imported at run time; none of it is part of
fdlit). Their code needs fedlab (PyPI, installed without its dependencies: it pins torchvision),
nvidia-ml-py (fedlab imports ``pynvml``), fast-pytorch-kmeans and psutil (their COMET imports it at
load); run this script with a Python that has them and fdlit's dependencies (docs/authors-code.md). What
their code expects of a GPU machine with Python 3.12 and torch 2.3 is set in this process only (in
``main``: ``typing.override``, ``torch.cuda.initial_seed``, the handler's ``device``, ``torch.load``). scripts/authors_repro_support.py writes, into a temporary folder
before their ``src``: a stand-in ``torchvision`` and a ``model`` package whose ``get_model`` returns
fdlit's client network (the MLP of ``configs/datasets/digits.yaml``) in place of ResNet-20. An adapter
hands them fdlit's split behind their ``PartitionedDataset`` interface, and their server handlers draw
the round's public rows from fdlit's draw (``participation.public_rows``) through the one method the
adapter overrides below them, ``set_next_public_indices`` of their DS-FL handler. Their server handlers,
client worker processes and trainers run unmodified, one client after another (``num_parallels`` 1),
in the loop of their ``DSFLPipeline.main`` / ``COMETPipeline.main`` with its byte counts.

fdlit runs ``configs/digits_cfd.yaml``, ``digits_comet.yaml`` and ``digits_selective_fd.yaml`` with the
shared setting (clients, rounds, SGD per phase, epochs, batch; Selective-FD with their thresholds).
Printed per round: bytes up and down, the rows each client uploads, the mean client accuracy on the
test set (fdlit after private and after public training, theirs after private training) and their
server model's. ``--fixture`` writes both sides' per-round numbers and, for the last round, their
uploads and what their server made of them, for tests/test_authors_reproducibility.py.
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import sys
import tempfile
import typing
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import authors_repro_support as support  # noqa: E402

CONFIGS = {"cfd": ["--config", "digits_cfd.yaml"], "comet": ["--config", "digits_comet.yaml"],
           "selective": ["--config", "digits_selective_fd.yaml", "--aggregator.init_args.client_quantile", "0.125",
                         "--aggregator.init_args.server_threshold", "2.0", "--aggregator.init_args.per_class", "false",
                         "--federation.participation.public_fraction", "0.1"]}
# their config/algorithm/*.yaml, with kmeans on the CPU (their "cuda" runs fast_pytorch_kmeans on a GPU)
STATS = ("selective/client_kept_fraction", "comet/largest_cluster_share", "cfd/up_bytes_per_client",
         "teacher/acc", "teacher/kept_fraction")
THEIR_KNOBS = {"cfd": {}, "comet": {"num_clusters": 2, "regularization_weight": 1.0, "kmeans_device": "cpu"},
               "selective": {"gaussian_kernel_width": 5.0, "lambda_exponent": 0.5, "kulsif_test_batch_size": 1000,
                             "l1_distance_threshold": 2.0, "dre_threshold": 0.125}}


def fit_argv(args, method: str, run_dir: str) -> list[str]:
    return [*CONFIGS[method], "--seed", str(args.seed), "--logger.mode", "disabled", "--logger.progress", "false",
            "--logger.run_dir", run_dir, "--federation.rounds", str(args.rounds), "--data.num_clients", str(args.clients),
            "--federation.private_epochs_first", str(args.epochs), "--federation.private_epochs", str(args.epochs),
            "--federation.public_epochs_first", str(args.epochs), "--federation.public_epochs", str(args.epochs),
            "--federation.executor", "fdlit.execution.SequentialExecutor", "--client.optimizer", "sgd",
            "--client.lr", str(args.lr), "--client.optimizer_scope", "per_phase", "--client.batch_size",
            str(args.batch_size)]


def run_fdlit(args, method: str) -> dict[int, dict]:
    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.experiment import Experiment

    with tempfile.TemporaryDirectory() as run_dir:
        parser, cfg = parse_fit(fit_argv(args, method, run_dir))
        loop = Experiment(cfg, parser).loop
        loop.fit()
        ledger = loop.server_side.ledger
        out = {}
        for r in range(1, args.rounds + 1):
            hist = loop.history[r - 1]
            ups = [m for m in ledger.messages if m.round == r and m.direction == "up"]
            out[r] = {"bytes_up": ledger.total("up", round=r), "bytes_down": ledger.total("down", round=r),
                      "messages_up": len(ups), "acc_private": hist["after_private/global_acc_mean"],
                      "acc_public": hist["after_public/global_acc_mean"]}
            out[r].update({k: hist[k] for k in STATS if k in hist})
        return out


# ----------------------------------------------------------------------------------------- authors
def their_classes(method: str):
    if method == "cfd":
        from algorithm.cfd import CFDParallelClientTrainer, CFDServerHandler
        return CFDServerHandler, CFDParallelClientTrainer
    if method == "comet":
        from algorithm.comet import COMETParallelClientTrainer, COMETServerHandler
        return COMETServerHandler, COMETParallelClientTrainer
    from algorithm.selectivefd import SelectiveFDParallelClientTrainer, SelectiveFDServerHandler
    return SelectiveFDServerHandler, SelectiveFDParallelClientTrainer


def run_authors(args, method: str, split, public_rows: list[list[int]], work: Path) -> tuple[dict, dict]:
    """Their server handler and client trainer on fdlit's split; per round the numbers, and for the
    recorded rounds their uploads and their server's result."""
    import torch.nn.functional as F
    from algorithm.dsfl import DSFLServerHandler

    Handler, Trainer = their_classes(method)
    knobs = THEIR_KNOBS[method]
    recorded_rounds = {args.rounds}  # the last round's uploads and results (kept small for the fixture)
    rounds: dict[int, dict] = {}
    detail: dict[int, dict] = {}
    kd_targets: list[torch.Tensor] = []

    class FdlitRows(DSFLServerHandler):
        """Below their method's handler: the next round's public rows are fdlit's draw (theirs: randperm)."""

        def set_next_public_indices(self):
            self.draws = getattr(self, "draws", 0)
            self.next_public_indices = torch.tensor(public_rows[min(self.draws, len(public_rows) - 1)])
            self.draws += 1

    class Server(Handler, FdlitRows):
        def load(self, payload):
            r = self.round + 1
            rec = rounds.setdefault(r, {"bytes_up": 0, "uploaded": []})
            rec["bytes_up"] += sum(p.element_size() * p.nelement() for p in payload if isinstance(p, torch.Tensor))
            rec["uploaded"].append(len(payload[1]))
            if r in recorded_rounds:
                values = payload[0] if method == "cfd" else payload[0].double().round(decimals=7)
                detail.setdefault(r, {"uploads": []})["uploads"].append(
                    {"indices": payload[1].tolist(), "values": values.tolist()})
            return super().load(payload)

    from utils import seed_everything

    seed_everything(args.seed)  # as their main.py, before the data and the handler (the server model's initialisation)
    server_knobs = {k: v for k, v in knobs.items() if k in ("num_clusters", "kmeans_device", "l1_distance_threshold")}
    server = Server(model_name="fdlit", global_round=args.rounds, sample_ratio=1.0, cuda=False,
                    public_size_per_round=len(public_rows[0]), dataset=split, **server_knobs)
    server.setup_kd_optim(args.epochs, args.batch_size, args.lr)
    server.device = "cpu"  # fedlab sets it only with cuda=True; their evaluate reads it

    def recording_kl_div(output, prob, **kw):  # the targets their server model distils on, in order
        kd_targets.append(prob.detach().clone())
        return F.kl_div(output, prob, **kw)

    server.kd_criterion = recording_kl_div
    trainer_knobs = {k: v for k, v in knobs.items() if k not in ("num_clusters", "kmeans_device", "l1_distance_threshold")}
    state_dir, analysis_dir = work / f"{method}-states", work / f"{method}-analysis"
    state_dir.mkdir(), analysis_dir.mkdir()
    trainer = Trainer(model_name="fdlit", num_clients=args.clients, cuda=False, state_dict_dir=state_dir,
                      seed=args.seed, num_parallels=1, **trainer_knobs)
    trainer.setup_datasets(split)
    trainer.setup_worker(args.epochs, args.batch_size, args.lr, args.epochs, args.batch_size, args.lr, analysis_dir)
    server.num_clients = trainer.num_clients
    while server.if_stop is False:  # their DSFLPipeline.main / COMETPipeline.main, records between its steps
        r = server.round + 1
        clients = server.sample_clients()
        broadcast = server.downlink_package
        down = 0.0
        for i, b in enumerate(broadcast):
            if isinstance(b, torch.Tensor):
                share = server.num_clusters if method == "comet" and i == 0 else 1  # their COMET: / K
                down += b.element_size() * b.nelement() * len(clients) / share
        kd_targets.clear()
        trainer.local_process(payload=broadcast, id_list=clients)
        for pack in trainer.uplink_package:
            server.load(pack)
        loss, top1, _ = server.evaluate()
        accs = []
        for cid in clients:
            with open(analysis_dir / f"{cid}.csv") as f:
                accs.append(float(list(csv.reader(f))[-1][1]))
        rounds[r].update(bytes_down=int(down), acc_private=sum(accs) / len(accs), acc_server=top1)
        # their teacher (what their server model distils on: CFD's votes, COMET's mean, Selective-FD's kept
        # rows' mean, which their Selective-FD clients also get) against the public set's labels
        batches = -(-len(server.public_indices) // args.batch_size)
        if batches:
            truth = torch.tensor(split.public.targets)[server.public_indices]
            rounds[r]["teacher_acc"] = float((torch.cat(kd_targets[:batches]).argmax(-1) == truth).float().mean())
            rounds[r]["teacher_kept_fraction"] = len(server.public_indices) / len(public_rows[r - 1])
        if r in recorded_rounds:
            targets = torch.cat(kd_targets[:batches]) if batches else torch.empty(0)
            rec = detail[r]
            rec.update(rows=public_rows[r - 1], server_indices=server.public_indices.tolist(),
                       server_targets=targets.double().round(decimals=7).tolist())
            if method == "comet":
                rec["centroids"] = server.public_centroids.double().round(decimals=7).tolist()
                rec["chosen"] = their_chosen_centroids(server.public_centroids, server.public_indices, rec["uploads"])
        if method == "selective" and r == 1:
            rounds[r]["kept_fraction"] = kept_fractions(state_dir, clients, split.public_size)
    return rounds, detail


def their_chosen_centroids(centroids, indices, uploads) -> list:
    """Which centroid (0..K-1) each client distils on per row, by their client's ``get_best_centroids``
    (its prediction at the start of the next round is its upload: the same network on the same rows)."""
    from algorithm.comet import COMETClientWorkerProcess

    out = []
    for up in uploads:
        assert up["indices"] == indices.tolist()
        probs = torch.tensor(up["values"])
        client = type("Client", (), {"predict": lambda self, idx, p=probs: (p, idx)})()
        best = COMETClientWorkerProcess.get_best_centroids(client, centroids, indices)
        out.append([int((c == b).all(-1).float().argmax()) for c, b in zip(centroids, best, strict=True)])
    return out


def kept_fractions(state_dir: Path, clients, public_size: int) -> list[float]:
    """Their Selective-FD clients' share of the public set kept (not an outlier), from their saved state."""
    out = []
    for cid in clients:
        outliers = torch.load(state_dir / f"{cid}.pt", weights_only=False)["outlier_public_indices"]
        out.append(1 - sum(1 for v in outliers.values() if v) / public_size)
    return out


# ------------------------------------------------------------------------------------------- table
def show(method: str, ours: dict, theirs: dict) -> list[str]:
    lines = [f"\n{method}   (f: fdlit, a: the authors' code; bytes of all clients)",
             "round | bytes up f / a | bytes down f / a | rows up/client a | acc f after-private, after-public | "
             "acc a clients (after private), server"]
    for r in sorted(ours):
        f, a = ours[r], theirs[r]
        lines.append(f"{r:5d} | {f['bytes_up']:7d} / {a['bytes_up']:7d} | {f['bytes_down']:7d} / {a['bytes_down']:7d} | "
                     f"{min(a['uploaded'])}-{max(a['uploaded'])} | {f['acc_private']:.3f}, {f['acc_public']:.3f} | "
                     f"{a['acc_private']:.3f}, {a['acc_server']:.3f}")
    for side, rec in (("fdlit", ours), ("theirs", theirs)):
        lines.append(f"total over {len(rec)} rounds, {side}: up {sum(x['bytes_up'] for x in rec.values()):,}, "
                     f"down {sum(x['bytes_down'] for x in rec.values()):,}")
    lines.append("teacher accuracy on its kept rows (share of the round's rows kept), per round, fdlit / theirs: "
                 + ", ".join(f"{ours[r]['teacher/acc']:.2f} ({ours[r]['teacher/kept_fraction']:.2f}) / "
                             f"{theirs[r]['teacher_acc']:.2f} ({theirs[r]['teacher_kept_fraction']:.2f})"
                             for r in sorted(ours)))
    if "selective/client_kept_fraction" in ours[1]:
        lines.append("fdlit's clients' kept share of the round's rows, per round: "
                     + ", ".join(f"{ours[r]['selective/client_kept_fraction']:.2f}" for r in sorted(ours)))
    if "kept_fraction" in theirs[1]:
        lines.append("their clients' kept share of the public set: "
                     + ", ".join(f"{v:.2f}" for v in theirs[1]["kept_fraction"]))
    return lines


def write_fixture(args, result: dict, command: str, commit: str) -> None:
    import json

    fixture = {"source": f"github.com/kitsuyaazuma/SCARLET, branch reproducibility, commit {commit}: their "
                         "CFD, COMET and Selective-FD server handlers and client trainers run unmodified on fdlit's "
                         "digits split by scripts/side_by_side_reproducibility.py",
               "command": "scripts/side_by_side_reproducibility.py " + command.replace(str(args.authors), "PATH"),
               "setting": {"clients": args.clients, "rounds": args.rounds, "epochs": args.epochs, "seed": args.seed,
                           "lr": args.lr, "batch_size": args.batch_size},
               "methods": result}
    args.fixture.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", required=True, type=Path, help="export of kitsuyaazuma/SCARLET, reproducibility")
    parser.add_argument("--methods", nargs="+", default=["cfd", "comet", "selective"], choices=sorted(CONFIGS))
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--commit", help="their commit, for the fixture's provenance (default: git rev-parse "
                                          "HEAD in --authors, when it is a checkout)")
    parser.add_argument("--fixture", type=Path, help="write both sides' numbers here (JSON, with provenance)")
    args = parser.parse_args(argv)
    src = args.authors / "src"
    if not (src / "algorithm" / "cfd.py").is_file():
        parser.error(f"--authors: an export of kitsuyaazuma/SCARLET's reproducibility branch; no src/algorithm "
                     f"in {args.authors}")
    # their code saves Python and NumPy random states with torch.save and reads them with torch.load (torch 2.3)
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    warnings.filterwarnings("ignore", message="Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    if not hasattr(typing, "override"):  # their algorithm package imports typing.override (Python 3.12)
        import typing_extensions

        typing.override = typing_extensions.override  # the backport: marks the method, changes nothing else
    if not torch.cuda.is_available():
        # their worker saves torch.cuda.initial_seed() each round, which raises without a GPU; after their
        # seed_everything (torch.manual_seed seeds CUDA too) it equals the CPU generator's initial seed
        torch.cuda.initial_seed = torch.initial_seed
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        support.write_stand_ins(Path(scratch))
        sys.path[:0] = [scratch, str(src)]
        import model as their_model_slot

        from fdlit.configuration.schema import parse_fit
        from fdlit.runs.experiment import Experiment

        out, result = [], {}
        for method in args.methods:
            parser_, cfg = parse_fit(fit_argv(args, method, scratch))
            planned = Experiment(cfg, parser_).loop
            data = copy.deepcopy(planned.data).setup(planned.seed)
            draw = planned.settings.participation
            public_rows = [draw.public_rows(planned.seed, r, len(data.public)).tolist()
                           for r in range(1, args.rounds + 1)]
            their_model_slot.NETWORK = support.FdlitNetwork(planned.model_spec, data, args.seed)
            theirs, detail = run_authors(args, method, support.FdlitSplit(data), public_rows, Path(scratch))
            ours = run_fdlit(args, method)
            out += show(method, ours, theirs)
            argv_ = fit_argv(args, method, "RUN_DIR")
            result[method] = {"fdlit_argv": argv_, "fdlit": [ours[r] for r in sorted(ours)], "theirs": [theirs[r] for r in sorted(theirs)],
                              "recorded_rounds": {str(r): d for r, d in sorted(detail.items())}}
        print("\n".join(out))
    if args.fixture is not None:
        import subprocess

        commit = args.commit or subprocess.run(["git", "-C", str(args.authors), "rev-parse", "HEAD"], text=True,
                                               capture_output=True, check=False).stdout.strip() or "unknown"
        write_fixture(args, result, " ".join(sys.argv[1:] if argv is None else argv), commit)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
