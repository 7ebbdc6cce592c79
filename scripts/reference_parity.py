"""fdlit's federated-distillation round against an independent plain-PyTorch implementation.

    OMP_NUM_THREADS=1 python scripts/reference_parity.py --reference PATH/ref_fd.py --seeds 0 \
        [--clients 20] [--k 2] [--rounds 20] [--compare] [--setting NAME=VALUE ...]

The reference (a separate single-file FD loop with AVG and sUWA; it is not part of fdlit and is
imported from ``--reference`` at run time) and fdlit are made to do identical work:

* the same data: the split (test, public, each client's training and calibration samples, in the
  same order) comes from fdlit (``--setting split=fdlit``) or from the reference's own draw
  (``split=reference``), and is handed to the other side;
* the same initial weights: the reference's networks are loaded with fdlit's client networks'
  initial parameters (a one-hidden-layer MLP, the reference's architecture);
* the same batch order: the reference's global torch generator is swapped, around each client's
  training call, for that client's own fdlit generator (both draw ``torch.randperm`` per epoch);
* the same optimizer handling (one Adam per client kept across phases and rounds, in both), the
  same epochs (the reference trains both phases for the same number of epochs: 20 in round 1),
  the same density (diagonal Gaussians on the calibration logits, std floor 1e-3 = variance floor
  1e-6, no repair of degenerate fits) and fdlit's sequential executor.

``--compare`` runs both and prints the round-by-round table (mean global test accuracy of the
clients after the public phase, teacher accuracy on the public labels, weight concentration chi).
Without it only fdlit runs, with the ``--setting`` overrides (each moves one thing toward fdlit's
defaults), and the script prints the best-round accuracy of AVG and sUWA per seed and the gap.

Settings (``NAME=VALUE``; the matched default first):
  split=fdlit|reference           whose draw of the data (reference: its class blocks, too)
  assignment=blocks|random|cyclic  with split=fdlit: the k-class sets. ``blocks``: the reference's
                                   (consecutive k-blocks of a seeded class permutation, so at k = 2
                                   clients come in 5 disjoint class pairs); ``random``: fdlit's default
                                   balanced draw; ``cyclic``: fdlit's (i, ..., i+k-1 mod C)
  hidden=128|128,128               MLP hidden widths (fdlit's digits default: 128,128)
  public_epochs_first=first|5      public epochs in round 1: ``first`` = the private phase's (the
                                   reference's; 20 with --first_epochs 20); fdlit's digits default: 5
  density=reference|fdlit          reference: variance floor 1e-6, robust=False, direct float64;
                                   fdlit: the aggregator's defaults (floor 1e-4, robust repair)
  executor=sequential|vectorized   fdlit's executor (vectorized: fdlit's automatic choice here)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fdlit.clients import ClientOptimization
from fdlit.data import FederatedData
from fdlit.data.federated import ClientData
from fdlit.data.tensor_dataset import TensorDataset
from fdlit.execution import SequentialExecutor
from fdlit.federation import FederationLoop
from fdlit.methods import ProbabilityAveraging, SmoothedUncertaintyWeighted

REPO = Path(__file__).resolve().parents[1]


def default_reference() -> Path:
    """``$FDLIT_REFERENCE``, else ``shared/reference/ref_fd.py`` beside the checkout (or one level up,
    for a worktree in a sub-folder)."""
    if os.environ.get("FDLIT_REFERENCE"):
        return Path(os.environ["FDLIT_REFERENCE"])
    candidates = [REPO.parent / "shared" / "reference" / "ref_fd.py",
                  REPO.parent.parent / "shared" / "reference" / "ref_fd.py"]
    return next((c for c in candidates if c.is_file()), candidates[0])


MATCHED = {"split": "fdlit", "assignment": "blocks", "hidden": "128", "public_epochs_first": "first",
           "density": "reference", "executor": "sequential"}
FDLIT_DEFAULTS = {"split": "fdlit", "assignment": "random", "hidden": "128,128", "public_epochs_first": "5",
                  "density": "fdlit", "executor": "vectorized"}
ALLOWED = {"split": ("fdlit", "reference"), "assignment": ("blocks", "random", "cyclic"),
           "hidden": None, "public_epochs_first": None, "density": ("reference", "fdlit"),
           "executor": ("sequential", "vectorized")}
REFERENCE_STD_FLOOR = 1e-3  # the reference floors each std at 1e-3: a variance floor of 1e-6


def load_reference(path: Path):
    """The reference implementation as a module (it stays where it is; nothing is copied)."""
    spec = importlib.util.spec_from_file_location("ref_fd_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_settings(items: list[str]) -> dict[str, str]:
    settings = dict(MATCHED)
    for item in items:
        name, _, value = item.partition("=")
        if name not in ALLOWED:
            raise SystemExit(f"--setting {item!r}: unknown name; allowed: {', '.join(ALLOWED)}")
        if ALLOWED[name] is not None and value not in ALLOWED[name]:
            raise SystemExit(f"--setting {item!r}: allowed values for {name}: {', '.join(ALLOWED[name])}")
        settings[name] = value
    return settings


@contextlib.contextmanager
def class_sets(sets: list[list[int]] | None):
    """fdlit's k-class draw replaced by ``sets`` (None: unchanged) while the data is set up."""
    import fdlit.data.federated as federated

    original = federated.assign_k_classes
    if sets is not None:
        federated.assign_k_classes = lambda num_clients, num_classes, k, rng: [list(s) for s in sets]
    try:
        yield
    finally:
        federated.assign_k_classes = original


def reference_split(ref, seed: int, clients: int, k: int, n_pub: int):
    """The reference's own draw: (flat inputs, labels, test, public, per-client dicts)."""
    n_priv = 188  # the command; about every pool sample of two classes, as fdlit's samples_per_client=null
    return ref.make_data(seed, clients, k, n_priv, n_pub)


def adopt_reference_split(data: FederatedData, X: torch.Tensor, y: torch.Tensor, test, public, clients) -> None:
    """Make a set-up FederatedData hold the reference's split (digits: X is N x 64 in [0, 1])."""
    images = X.reshape(len(X), 1, 8, 8)

    def part(index, name):
        index = torch.as_tensor(np.asarray(index), dtype=torch.long)
        return TensorDataset(images[index], y[index], 10, name)

    data.test, data.public = part(test, "digits/test"), part(public, "digits/public")
    data.validation = None
    data.clients = [ClientData(i, [int(c) for c in cd["cls"]], part(cd["train"], f"client{i}/train"),
                               part(cd["cal"], f"client{i}/calibration"),
                               np.concatenate([cd["train"], cd["cal"]]))
                    for i, cd in enumerate(clients)]


def build_loop(settings: dict[str, str], aggregator: str, seed: int, clients: int, k: int, rounds: int,
               first_epochs: int, epochs: int, public_size: int, ref=None) -> FederationLoop:
    """fdlit's loop for one run of the comparison (not yet set up)."""
    data = FederatedData(dataset="digits", num_clients=clients, partition="classes", classes_per_client=k,
                         public_size=public_size, calibration_fraction=0.2,
                         class_assignment="cyclic" if settings["assignment"] == "cyclic" else "random")
    sets = None
    if settings["split"] == "reference" or settings["assignment"] == "blocks":
        _, _, _, _, ref_clients = reference_split(ref, seed, clients, k, public_size)
        sets = [cd["cls"] for cd in ref_clients]
    with class_sets(sets if settings["assignment"] == "blocks" else None):
        data.setup(seed)
    if settings["split"] == "reference":
        adopt_reference_split(data, *reference_split(ref, seed, clients, k, public_size))
    if aggregator == "avg":
        agg = ProbabilityAveraging()
    elif settings["density"] == "reference":
        agg = SmoothedUncertaintyWeighted(tau=0.25, variance_floor=REFERENCE_STD_FLOOR**2, robust=False,
                                                    density_method="direct")
    else:
        agg = SmoothedUncertaintyWeighted(tau=0.25)
    hidden = [int(h) for h in settings["hidden"].split(",")]
    return FederationLoop(
        rounds=rounds, private_epochs_first=first_epochs, private_epochs=epochs,
        public_epochs_first=first_epochs if settings["public_epochs_first"] == "first"
        else int(settings["public_epochs_first"]), public_epochs=epochs,
        executor=SequentialExecutor() if settings["executor"] == "sequential" else None,
        accelerator="cpu", data=data, model={"class_path": "fdlit.models.MLP", "init_args": {"hidden": hidden}},
        client=ClientOptimization(optimizer="adam", lr=1e-3, batch_size=32), aggregator=agg, seed=seed,
    )


def fdlit_history(loop: FederationLoop) -> list[dict[str, float]]:
    loop.fit()
    return [{"round": m["round"], "acc": m["after_public/global_acc_mean"], "teacher": m["teacher/acc"],
             "chi": m.get("weights/chi", math.nan)} for m in loop.history]


def run_reference(ref, loop: FederationLoop, aggregator: str, rounds: int, first_epochs: int,
                  epochs: int) -> list[dict[str, float]]:
    """The reference's ``run`` on fdlit's data, initial weights and batch order (``loop`` set up,
    not trained)."""
    data = loop.data
    parts = [data.test, data.public] + [p for cd in data.clients for p in (cd.train, cd.calibration)]
    X = torch.cat([p.x.reshape(len(p), -1) for p in parts])
    y = torch.cat([p.y for p in parts])
    starts = np.cumsum([0] + [len(p) for p in parts])
    span = [np.arange(starts[j], starts[j + 1]) for j in range(len(parts))]
    ref_clients = [{"cls": list(cd.classes), "train": span[2 + 2 * i], "cal": span[3 + 2 * i]}
                   for i, cd in enumerate(data.clients)]
    initial = [{k: v.detach().clone() for k, v in c.model.state_dict().items()} for c in loop.view.clients]
    generators = [torch.Generator().set_state(c.generator.get_state()) for c in loop.view.clients]
    built: dict[int, int] = {}  # id(reference network) -> client

    def network():
        i = len(built)
        net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], initial[i]["net.1.weight"].shape[0]), torch.nn.ReLU(),
                                  torch.nn.Linear(initial[i]["net.1.weight"].shape[0], 10))
        with torch.no_grad():
            net[0].weight.copy_(initial[i]["net.1.weight"])
            net[0].bias.copy_(initial[i]["net.1.bias"])
            net[2].weight.copy_(initial[i]["net.4.weight"])
            net[2].bias.copy_(initial[i]["net.4.bias"])
        built[id(net)] = i
        return net

    train = ref.train

    def train_in_client_order(model, opt, inputs, target, n_epochs, bs, soft):
        """The reference's training call with the client's fdlit generator as the global one."""
        g = generators[built[id(model)]]
        saved = torch.random.get_rng_state()
        torch.random.set_rng_state(g.get_state())
        try:
            train(model, opt, inputs, target, n_epochs, bs, soft)
        finally:
            g.set_state(torch.random.get_rng_state())
            torch.random.set_rng_state(saved)

    originals = {name: getattr(ref, name) for name in ("make_data", "mlp", "train")}
    ref.make_data = lambda *a, **kw: (X, y, span[0], span[1], ref_clients)
    ref.mlp, ref.train = network, train_in_client_order
    try:
        hist = ref.run("avg" if aggregator == "avg" else "uwa", 0.25, loop.seed, len(data.clients), None, rounds,
                       None, None, first_epochs, epochs)
    finally:
        for name, fn in originals.items():
            setattr(ref, name, fn)
    return [{"round": h["round"] + 1, "acc": h["acc"], "teacher": h["teacher"], "chi": h["chi"]} for h in hist]


def compare(ref, settings, seed, clients, k, rounds, first_epochs, epochs, public_size) -> dict[str, Any]:
    """Both implementations, AVG and sUWA, round by round."""
    out = {}
    for agg in ("avg", "suwa"):
        loop = build_loop(settings, agg, seed, clients, k, rounds, first_epochs, epochs, public_size, ref)
        loop.setup()
        reference = run_reference(ref, loop, agg, rounds, first_epochs, epochs)
        out[agg] = {"fdlit": fdlit_history(loop), "reference": reference}
    return out


def print_table(result: dict[str, Any]) -> None:
    print("| round | AVG fdlit | AVG reference | sUWA fdlit | sUWA reference | sUWA chi fdlit | sUWA chi reference |")
    print("|---|---|---|---|---|---|---|")
    a, s = result["avg"], result["suwa"]
    for r in range(len(a["fdlit"])):
        print(f"| {r + 1} | {100 * a['fdlit'][r]['acc']:.2f} | {100 * a['reference'][r]['acc']:.2f} | "
              f"{100 * s['fdlit'][r]['acc']:.2f} | {100 * s['reference'][r]['acc']:.2f} | "
              f"{s['fdlit'][r]['chi']:.4f} | {s['reference'][r]['chi']:.4f} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, default=default_reference())
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--first_epochs", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--public_size", type=int, default=500)
    ap.add_argument("--compare", action="store_true", help="run the reference too and print the round table")
    ap.add_argument("--aggregators", nargs="+", default=["avg", "suwa"], choices=["avg", "suwa"])
    ap.add_argument("--setting", nargs="*", default=[], help="NAME=VALUE overrides (see above)")
    ap.add_argument("--json", type=Path, help="append one JSON line per run here")
    a = ap.parse_args(argv)
    if not a.reference.is_file():
        raise SystemExit(f"--reference: no file at {a.reference}")
    torch.set_num_threads(1)
    ref = load_reference(a.reference)
    settings = parse_settings(a.setting)
    print(f"settings: {settings}", flush=True)
    if a.compare:
        for seed in a.seeds:
            result = compare(ref, settings, seed, a.clients, a.k, a.rounds, a.first_epochs, a.epochs,
                             a.public_size)
            print(f"seed {seed}")
            print_table(result)
            if a.json:
                with a.json.open("a") as f:
                    f.write(json.dumps({"seed": seed, "settings": settings, "compare": result}) + "\n")
        return
    best: dict[str, list[float]] = {agg: [] for agg in a.aggregators}
    for seed in a.seeds:
        for agg in a.aggregators:
            loop = build_loop(settings, agg, seed, a.clients, a.k, a.rounds, a.first_epochs, a.epochs,
                              a.public_size, ref)
            hist = fdlit_history(loop)
            best[agg].append(max(h["acc"] for h in hist))
            print(json.dumps({"seed": seed, "aggregator": agg, "best": round(100 * best[agg][-1], 2),
                              "final": round(100 * hist[-1]["acc"], 2)}), flush=True)
            if a.json:
                with a.json.open("a") as f:
                    f.write(json.dumps({"seed": seed, "aggregator": agg, "settings": settings, "history": hist}) + "\n")
    for agg, values in best.items():
        sd = statistics.pstdev(values) if len(values) > 1 else 0.0
        print(f"{agg}: best {100 * statistics.mean(values):.2f} ± {100 * sd:.2f} over seeds {a.seeds}")
    if len(best) == 2:
        gaps = [s - v for s, v in zip(best["suwa"], best["avg"], strict=True)]
        print(f"gap sUWA - AVG: {100 * statistics.mean(gaps):+.2f} (per seed: "
              f"{', '.join(f'{100 * g:+.2f}' for g in gaps)})")


if __name__ == "__main__":
    sys.exit(main())
