"""A plain PyTorch federated-distillation loop: the yardstick of benchmarks/whole_run.py.

    python benchmarks/plain_fd.py [--rounds 20] [--clients 20]
    python benchmarks/plain_fd.py --setting fashion_mlp [--rounds 3]

``--setting digits`` (the default) is the work of fdlit's digits default (configs/digits.yaml), written as a researcher would write it
without a framework: scikit-learn's digits (read from its bundled file), a 20 % stratified test set,
500 public samples, 20 clients holding 2 classes each, a 64-128-128-10 MLP per client with its own
Adam (lr 1e-3, batch 32); round 1 trains 20 private and 5 public epochs, later rounds 5 and 5. The
server averages the clients' softmax outputs on the public set (the teacher), clients distil on it
with cross-entropy against those probabilities, and every client is evaluated on the test set each
round. ``--setting fashion_mlp`` is Fashion-MNIST (Debian's IDX files) with 20 clients of 500 images
(2 classes each, 20 % held out for calibration), a 784-200-10 MLP, Adam (lr 1e-3), private batches of 32
and public batches of 64 on a 2,000-image public set; round 1 trains 10 private and 5 public epochs,
later rounds 2 and 2; each round is evaluated on a fixed 2,000-image test subset, the last on all 10,000
(as fdlit's ``federation.eval_subsample`` does). It imports torch and NumPy only, and does not import fdlit.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return torch.tensor(data[:, :-1] / 16.0, dtype=torch.float32), torch.tensor(data[:, -1], dtype=torch.long)


FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
# (inputs, hidden widths, samples per client, public size, private epochs (first, later), public epochs,
#  private batch, public batch, test images evaluated before the last round)
SETTINGS = {
    "digits": dict(hidden=[128, 128], per_client=None, public=500, private=(20, 5), public_epochs=(5, 5),
                   batch=32, public_batch=32, eval_subset=None),
    "fashion_mlp": dict(hidden=[200], per_client=500, public=2000, private=(10, 2), public_epochs=(5, 2),
                        batch=32, public_batch=64, eval_subset=2000),
}


def idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion_mnist() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train x, train y, test x, test y), images flattened and scaled to [0, 1]."""
    def split(prefix: str):
        x = idx(FASHION_MNIST / f"{prefix}-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255.0
        return torch.from_numpy(x), torch.from_numpy(idx(FASHION_MNIST / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64))
    return (*split("train"), *split("t10k"))


def mlp(inputs: int = 64, hidden: list[int] = (128, 128)) -> nn.Module:
    layers, width = [], inputs
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, 10))


def train(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, epochs: int,
          batch_size: int) -> None:
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="digits")
    args = parser.parse_args(argv)
    cfg = SETTINGS[args.setting]
    start = time.process_time()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    if args.setting == "digits":
        x, y = digits()
        perm = rng.permutation(len(y))
        n_test = int(0.2 * len(y))
        test, rest = perm[:n_test], perm[n_test:]
        x_test, y_test = x[test], y[test]
    else:
        x, y, x_test, y_test = fashion_mnist()
        rest = rng.permutation(len(y))
    public, pool = rest[:cfg["public"]], rest[cfg["public"]:]
    x_pub = x[public]
    pool_y = y[pool].numpy()
    subset = torch.from_numpy(rng.permutation(len(y_test))[:cfg["eval_subset"]]) if cfg["eval_subset"] else None
    clients = []
    for i in range(args.clients):
        classes = [(2 * i) % 10, (2 * i + 1 + i // 5) % 10]
        own = pool[np.isin(pool_y, classes)]
        if cfg["per_client"]:
            own = rng.choice(own, cfg["per_client"], replace=False)
        n_cal = int(0.2 * len(own))  # a calibration share, held out as fdlit's configs do
        train_rows = own[n_cal:]
        model = mlp(x.shape[1], cfg["hidden"])
        clients.append((model, torch.optim.Adam(model.parameters(), lr=1e-3), x[train_rows], y[train_rows]))
    accuracy = 0.0
    for r in range(1, args.rounds + 1):
        for model, opt, xi, yi in clients:
            train(model, opt, xi, yi, cfg["private"][r > 1], cfg["batch"])
        with torch.no_grad():
            for model, *_ in clients:
                model.eval()
            teacher = torch.stack([F.softmax(model(x_pub), -1) for model, *_ in clients]).mean(0)
        for model, opt, *_ in clients:
            train(model, opt, x_pub, teacher, cfg["public_epochs"][r > 1], cfg["public_batch"])
        xe, ye = (x_test, y_test) if subset is None or r == args.rounds else (x_test[subset], y_test[subset])
        with torch.no_grad():
            accuracy = float(np.mean([(model(xe).argmax(-1) == ye).float().mean().item()
                                      for model, *_ in clients]))
    cpu = time.process_time() - start
    print(f"plain FD loop ({args.setting}): {args.rounds} rounds, {args.clients} clients, mean client accuracy {accuracy:.4f}, "
          f"{cpu:.2f} CPU s after imports")
    return {"accuracy": accuracy, "cpu_s": cpu}


if __name__ == "__main__":
    main()
