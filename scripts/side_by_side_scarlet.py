"""fdlit's SCARLET next to the SCARLET authors' code (kitsuyaazuma/SCARLET, ``main`` branch), on one shared
digits setting, round by round.

    OMP_NUM_THREADS=1 python scripts/side_by_side_scarlet.py --authors PATH/SCARLET \
        [--durations 0 3] [--dsfl] [--clients 10] [--rounds 8] [--epochs 2] [--seed 0] [--fixture PATH]

``--authors``: a checkout of the authors' repository (its ``src/scarlet`` package is imported from there
at run time; none of it is part of fdlit). Their dataset modules import ``torchvision`` at module level;
the script writes a stand-in ``torchvision`` (the names those imports touch, each failing if used) into
a temporary folder first, so no torchvision is needed. Their algorithm code (server handler, client
trainer, cache, Enhanced ERA, training loops) runs unmodified; an adapter hands it fdlit's split:

* data: fdlit's digits split (each client's training rows, the public set, the test set) behind their
  ``DatasetProvider`` interface, in place of their CIFAR ``PartitionedDataset``;
* the public rows of each round: fdlit's draw (``participation.public_rows``), in place of their
  ``randperm`` (the one method the adapter overrides, below their SCARLET's ``get_next_indices``);
* the network: fdlit's client network (the MLP of ``configs/datasets/digits.yaml``), in place of ResNet-20.

Both sides then use their own training: theirs plain SGD (``--lr``) with one optimizer per phase kept
across rounds, fdlit the same (``client.optimizer: sgd``, ``optimizer_scope: per_phase``). What must agree
by construction is the cache (``--dsfl`` adds DS-FL, with no cache: the rows up and down and the bytes): per round, which public rows are served from the cache, uploaded, newly
cached, expired and sent down, and the bytes up. The accuracies are printed side by side, not compared.
``--fixture`` writes their row sets, with their commit and this command, for tests/test_scarlet_authors.py.
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torch.utils.data import TensorDataset as TorchTensorDataset

TORCHVISION_STAND_IN = {
    "torchvision/__init__.py": "from . import datasets, transforms  # noqa: F401\n",
    "torchvision/datasets.py": (
        "def _absent(*args, **kwargs):\n"
        "    raise RuntimeError('stand-in torchvision: datasets are not available')\n"
        "CIFAR10 = CIFAR100 = _absent\n"
    ),
    "torchvision/transforms/__init__.py": (
        "from . import functional  # noqa: F401\n"
        "class _Absent:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise RuntimeError('stand-in torchvision: transforms are not available')\n"
        "class Compose(_Absent): ...\n"
        "class ToTensor(_Absent): ...\n"
        "class Normalize(_Absent): ...\n"
        "class RandomCrop(_Absent): ...\n"
        "class RandomHorizontalFlip(_Absent): ...\n"
    ),
    "torchvision/transforms/functional.py": (
        "def _absent(*args, **kwargs):\n"
        "    raise RuntimeError('stand-in torchvision: transforms are not available')\n"
        "pad = crop = hflip = get_image_size = _absent\n"
    ),
}


def write_stand_in(folder: Path) -> None:
    """A ``torchvision`` with only the names the authors' modules import; each fails if called."""
    for name, text in TORCHVISION_STAND_IN.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def fit_argv(args, duration: int | None, run_dir: str) -> list[str]:
    """fdlit's run of SCARLET (``duration``: its cache_duration) or, with None, DS-FL, on the shared setting."""
    method = (["--config", "digits_dsfl.yaml", "--aggregator.init_args.temperature", str(args.era_temperature),
               "--server.optimizer", "sgd", "--server.lr", str(args.lr), "--server.batch_size", str(args.batch_size),
               "--server.epochs_first", str(args.epochs), "--server.epochs", str(args.epochs)]
              if duration is None else
              ["--config", "digits_scarlet.yaml", "--aggregator.init_args.cache_duration", str(duration),
               "--aggregator.init_args.era_exponent", str(args.era_exponent), "--aggregator.init_args.cache_ratio", "1.0"])
    return [*method, "--seed", str(args.seed), "--logger.mode", "disabled",
            "--logger.progress", "false", "--logger.run_dir", run_dir, "--federation.rounds", str(args.rounds),
            "--data.num_clients", str(args.clients),
            "--federation.private_epochs_first", str(args.epochs), "--federation.private_epochs", str(args.epochs),
            "--federation.public_epochs_first", str(args.epochs), "--federation.public_epochs", str(args.epochs),
            "--federation.executor", "fdlit.execution.SequentialExecutor",
            "--client.optimizer", "sgd", "--client.lr", str(args.lr), "--client.optimizer_scope", "per_phase",
            "--client.batch_size", str(args.batch_size)]


# ------------------------------------------------------------------------------------------- fdlit
def run_fdlit(args, duration: int):
    """fdlit's run; per round: the rows, which were served, newly cached, expired, sent down, bytes up."""
    from fdlit.configuration.schema import parse_fit
    from fdlit.methods.scarlet import NEVER, cache_valid
    from fdlit.runs.experiment import Experiment

    with tempfile.TemporaryDirectory() as run_dir:
        parser, cfg = parse_fit(fit_argv(args, duration, run_dir))
        loop = Experiment(cfg, parser).loop
        method = loop.server_side.method
        rounds: dict[int, dict] = {r: {} for r in range(1, args.rounds + 1)}
        aggregate, configure = method.aggregate, method.configure

        def recording_aggregate(uploads, ctx):
            rows = ctx.info.public_ids().cpu()
            r = ctx.info.round
            stored = (method.cache_stored[rows].clone() if method.cache_stored is not None
                      else torch.full((len(rows),), NEVER, dtype=torch.long))
            served = cache_valid(stored, r, method.cache_duration)
            result = aggregate(uploads, ctx)
            after = method.cache_stored[rows]
            rounds[r] = {"rows": set(rows.tolist()), "served": set(rows[served].tolist()),
                         "uploaded": [int(u["requested"].sum()) for u in uploads],
                         "newly": set(rows[(after == r)].tolist()),
                         "expired": set(rows[~served & (stored != NEVER)].tolist())}
            return result

        def recording_configure(message, client_ids, ctx):
            out = configure(message, client_ids, ctx)
            rows = ctx.info.public_ids().cpu()
            rounds[ctx.info.round]["down"] = {i: set(rows[m["teacher_rows"].cpu()].tolist()) for i, m in out.items()}
            return out

        if duration is not None:
            method.aggregate, method.configure = recording_aggregate, recording_configure
        loop.fit()
        for r, rec in rounds.items():
            rec["uploaded_each"] = [m.shape[0] for m in loop.server_side.ledger.messages
                                    if m.round == r and m.direction == "up" and m.kind == "logits"]
            rec["down_each"] = [m.shape[0] for m in loop.server_side.ledger.messages
                                if m.round == r and m.direction == "down" and m.kind == "teacher"]
            rec["bytes_down"] = loop.server_side.ledger.total("down", round=r)
            rec["bytes_up"] = loop.server_side.ledger.total("up", round=r)
            hist = loop.history[r - 1]
            rec["acc_private"] = hist["after_private/global_acc_mean"]
            rec["acc_public"] = hist["after_public/global_acc_mean"]
        return loop, rounds


# ------------------------------------------------------------------ the adapter (module level: their
# client trainer pickles its dataset and model selector into its worker processes)
class PublicInputs(torch.utils.data.Dataset):
    """The public set's inputs only (their public dataset yields no labels)."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


class FdlitSplit:
    """Their ``DatasetProvider`` over fdlit's split (their partition types are the strings compared here)."""

    def __init__(self, data):
        self.num_classes = data.num_classes
        self.public_train_size = len(data.public)
        self.public = PublicInputs(data.public.x)
        self.private = [TorchTensorDataset(cd.train.x, cd.train.y) for cd in data.clients]
        self.test = TorchTensorDataset(data.test.x, data.test.y)

    def get_dataset(self, type_, cid):
        if type_ == "TRAIN_PUBLIC":
            return self.public
        return self.private[cid] if type_ == "TRAIN_PRIVATE" else self.test

    def get_dataloader(self, type_, cid, batch_size=None, generator=None):
        if type_ == "TRAIN_PRIVATE":
            return DataLoader(self.private[cid], batch_size=batch_size, shuffle=True, generator=generator)
        return DataLoader(self.test, batch_size=batch_size)


class FdlitNetwork:
    """Their ``ModelSelector``: fdlit's client network (their worker names no client: one initialisation
    for every client)."""

    def __init__(self, model_spec, data, seed: int):
        self.model_spec, self.data, self.seed = model_spec, data, seed

    def select_model(self, model_name):
        from fdlit.federation.construction import client_network

        torch.manual_seed(self.seed)
        return client_network(self.model_spec, self.data, 0, self.seed)


# ----------------------------------------------------------------------------------------- authors
def run_authors(args, duration: int, data, model_spec, public_rows, state_dir: Path, manager):
    """The authors' SCARLET server handler and client trainer on fdlit's split; the same records."""
    from scarlet.algorithm.common import CommonServerHandler
    from scarlet.algorithm.dsfl import DSFLClientTrainer, DSFLServerHandler
    from scarlet.algorithm.scarlet import CacheSignal, SCARLETClientTrainer, SCARLETServerHandler

    class FdlitRows(CommonServerHandler):
        """Below their SCARLET in the method order: the round's public rows are fdlit's draw."""

        def get_next_indices(self):
            return torch.tensor(public_rows[self.round])

    rounds: dict[int, dict] = {}

    Handler, Trainer = (DSFLServerHandler, DSFLClientTrainer) if duration is None else \
        (SCARLETServerHandler, SCARLETClientTrainer)
    knobs = ({"era_temperature": args.era_temperature} if duration is None
             else {"enhanced_era_exponent": args.era_exponent, "cache_duration": duration})

    class Server(Handler, FdlitRows):
        def load(self, payload):
            rec = rounds.setdefault(self.round + 1, {"uploaded": [], "bytes_up": 0})
            rec["uploaded"].append(len(payload.indices))
            rec["bytes_up"] += payload.soft_labels.numel() * payload.soft_labels.element_size() \
                + payload.indices.numel() * payload.indices.element_size()
            return super().load(payload)

    split, network = FdlitSplit(data), FdlitNetwork(model_spec, data, args.seed)
    server = Server(model=network.select_model(None), dataset=split, global_round=args.rounds,
                    num_clients=args.clients, sample_ratio=1.0, device="cpu", kd_epochs=args.epochs,
                    kd_batch_size=args.batch_size, kd_lr=args.lr, public_size_per_round=len(public_rows[0]),
                    seed=args.seed, **knobs)
    trainer = Trainer(model_selector=network, model_name=None, dataset=split, device="cpu",
                                   num_clients=args.clients, epochs=args.epochs, batch_size=args.batch_size,
                                   lr=args.lr, kd_epochs=args.epochs, kd_batch_size=args.batch_size, kd_lr=args.lr,
                                   seed=args.seed, num_parallels=1, public_size_per_round=len(public_rows[0]),
                                   state_dir=state_dir, manager=manager)
    while not server.if_stop():  # their CommonPipeline.main, with the records taken between its steps
        t = server.get_round()
        clients = server.sample_clients()
        broadcast = server.downlink_package()
        cached = set(getattr(server, "cached_indices", []))
        trainer.local_process(broadcast, clients)
        for package in trainer.uplink_package():
            server.load(package)
        indices = server.global_indices.tolist()
        # DS-FL sends every label down (as SCARLET's "not cached"); -1 matches no cache signal
        signals = server.cache_signals.tolist() if duration is not None else [-1] * len(indices)
        summary = server.get_summary()
        rec = rounds[t + 1]
        rec.update(rows=set(public_rows[t]), served=cached,
                   newly={i for i, s in zip(indices, signals, strict=True) if s == CacheSignal.NEWLY_CACHED},
                   expired={i for i, s in zip(indices, signals, strict=True) if s == CacheSignal.EXPIRED},
                   kept={i for i, s in zip(indices, signals, strict=True)
                         if s == CacheSignal.CACHED and i not in cached},
                   down={i for i, s in zip(indices, signals, strict=True) if s != CacheSignal.CACHED},
                   acc_private=summary["client_test_acc"], acc_server=summary["server_test_acc"])
    return rounds


# ------------------------------------------------------------------------------------------- table
def show(duration: int, ours: dict, theirs: dict) -> list[str]:
    lines = [f"\ncache_duration D = {duration}   (f: fdlit, a: the authors' code; rows of the public set)",
             "round | drawn | served f/a | uploaded/client f/a | newly f/a | expired f/a | kept-stale a | "
             "down/client f (min-max) / a | bytes up f / a | acc f after-private, after-public | "
             "acc a clients (after private), server"]
    differences, explained = [], 0
    for r in sorted(ours):
        f, a = ours[r], theirs[r]
        down = sorted(len(v) for v in f["down"].values())
        lines.append(
            f"{r:5d} | {len(f['rows']):5d} | {len(f['served']):3d} / {len(a['served']):3d} | "
            f"{max(f['uploaded']):3d} / {max(a['uploaded']):3d} | {len(f['newly']):3d} / {len(a['newly']):3d} | "
            f"{len(f['expired']):3d} / {len(a['expired']):3d} | {len(a['kept']):3d} | "
            f"{down[0]}-{down[-1]} / {len(a['down'])} | {f['bytes_up']:6d} / {a['bytes_up']:6d} | "
            f"{f['acc_private']:.3f}, {f['acc_public']:.3f} | {a['acc_private']:.3f}, {a['acc_server']:.3f}")
        if f["rows"] != a["rows"]:
            differences.append(f"round {r}: the drawn rows differ")
        if f["served"] != a["served"] and f["served"] == a["served"] | a["kept"]:
            explained += 1  # fdlit serves the row; theirs asks for it again, then keeps the stored label
        elif f["served"] != a["served"]:
            differences.append(f"round {r}: served: fdlit only {sorted(f['served'] - a['served'])}, "
                               f"theirs only {sorted(a['served'] - f['served'])}")
        if {i for d in f["down"].values() for i in d} != a["down"]:
            differences.append(f"round {r}: the labels sent down differ")
        for key in ("newly", "expired"):
            if f[key] != a[key]:
                differences.append(f"round {r}: {key}: fdlit only {sorted(f[key] - a[key])}, "
                                   f"theirs only {sorted(a[key] - f[key])}")
    lines.append(f"rounds where fdlit serves a row theirs requests again (their entry's last round, s + D: "
                 f"uploaded, yet the stored label kept and used, column kept-stale): {explained}")
    lines += ["other differences in the row sets:"] + (differences or ["none"])
    return lines


def show_dsfl(ours: dict, theirs: dict) -> list[str]:
    lines = ["\nDS-FL   (f: fdlit, a: the authors' code)",
             "round | drawn | uploaded/client f/a | down f/a | bytes up f / a | acc f after-private, after-public | "
             "acc a clients (after private), server"]
    for r in sorted(ours):
        f, a = ours[r], theirs[r]
        lines.append(
            f"{r:5d} | {len(a['rows']):5d} | {max(f['uploaded_each']):3d} / {max(a['uploaded']):3d} | "
            f"{max(f['down_each'], default=0):3d} / {len(a['down']):3d} | {f['bytes_up']:6d} / {a['bytes_up']:6d} | "
            f"{f['acc_private']:.3f}, {f['acc_public']:.3f} | {a['acc_private']:.3f}, {a['acc_server']:.3f}")
    return lines


FIXTURE_SETS = ("rows", "served", "kept", "newly", "expired", "down")


def write_fixture(args, recorded: dict, command: str) -> None:
    """Their per-round row sets, with where they come from (tests/test_scarlet_authors.py reads them)."""
    import json
    import subprocess

    commit = subprocess.run(["git", "-C", str(args.authors), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    meaning = {"rows": "the round's public rows (fdlit's draw)", "served": "rows served from the cache, not uploaded",
               "kept": "rows uploaded in their entry's last round whose stored label was kept (signal CACHED)",
               "newly": "rows cached this round", "expired": "rows whose entry was cleared this round",
               "down": "rows whose label was sent down (signal not CACHED)"}
    fixture = {"source": f"github.com/kitsuyaazuma/SCARLET, branch main, commit {commit}: SCARLETServerHandler "
                         "run unmodified on fdlit's digits split by scripts/side_by_side_scarlet.py",
               "command": "scripts/side_by_side_scarlet.py " + command.replace(str(args.authors), "PATH/TO/SCARLET"),
               "setting": {"clients": args.clients, "rounds": args.rounds, "seed": args.seed, "public_size": 500,
                           "public_fraction": 0.1, "cache_ratio": 1.0},
               "sets": meaning, "cache_duration": recorded}
    rounds = {d: "[\n  " + ",\n  ".join(json.dumps(r) for r in per_round) + "\n ]" for d, per_round in recorded.items()}
    fixture["cache_duration"] = "@"  # one round a line: readable, and a diff shows the round that changed
    text = json.dumps(fixture, indent=1).replace('"@"', "{\n " + ",\n ".join(f'"{d}": {v}' for d, v in rounds.items())
                                                 + "\n}")
    json.loads(text)
    args.fixture.write_text(text + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", required=True, type=Path, help="checkout of kitsuyaazuma/SCARLET (main)")
    parser.add_argument("--durations", type=int, nargs="+", default=[0, 3])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--era_exponent", type=float, default=2.0)
    parser.add_argument("--era_temperature", type=float, default=0.1, help="DS-FL's ERA temperature")
    parser.add_argument("--dsfl", action="store_true", help="also DS-FL (both sides' ERA, no cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixture", type=Path, help="write their per-round row sets here (JSON, with provenance)")
    args = parser.parse_args(argv)
    src = args.authors / "src"
    if not (src / "scarlet" / "algorithm" / "scarlet.py").is_file():
        parser.error(f"--authors: a checkout of kitsuyaazuma/SCARLET's main branch; no src/scarlet in {args.authors}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch, multiprocessing.Manager() as manager:  # as their main.py
        write_stand_in(Path(scratch))
        sys.path[:0] = [scratch, str(src)]
        from fdlit.configuration.schema import parse_fit
        from fdlit.runs.experiment import Experiment

        out, recorded = [], {}
        for duration in [*args.durations, *([None] if args.dsfl else [])]:
            # fdlit's split and rows, made as its run makes them, handed to their code first
            parser_, cfg = parse_fit(fit_argv(args, duration, scratch))
            planned = Experiment(cfg, parser_).loop
            data = copy.deepcopy(planned.data).setup(planned.seed)
            draw = planned.settings.participation
            public_rows = [draw.public_rows(planned.seed, r, len(data.public)).tolist() for r in range(1, args.rounds + 1)]
            state_dir = Path(scratch) / f"authors-states-{duration}"
            state_dir.mkdir()
            theirs = run_authors(args, duration, data, planned.model_spec, public_rows, state_dir, manager)
            loop, ours = run_fdlit(args, duration)
            for cd, mine in zip(loop.data.clients, data.clients, strict=True):
                assert torch.equal(cd.train.x, mine.train.x), "the split handed to their code is not fdlit's"
            out += show(duration, ours, theirs) if duration is not None else show_dsfl(ours, theirs)
            if duration is not None:
                recorded[str(duration)] = [{key: sorted(theirs[r][key]) for key in FIXTURE_SETS}
                                           for r in sorted(theirs)]
        print("\n".join(out))
    if args.fixture is not None:
        write_fixture(args, recorded, " ".join(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
