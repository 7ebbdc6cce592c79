"""A plain PyTorch federated-distillation loop: the yardstick of benchmarks/whole_run.py.

    python benchmarks/plain_fd.py [--rounds 20] [--clients 20]

The work of fdlit's digits default (configs/digits.yaml), written as a researcher would write it
without a framework: scikit-learn's digits (read from its bundled file), a 20 % stratified test set,
500 public samples, 20 clients holding 2 classes each, a 64-128-128-10 MLP per client with its own
Adam (lr 1e-3, batch 32); round 1 trains 20 private and 5 public epochs, later rounds 5 and 5. The
server averages the clients' softmax outputs on the public set (the teacher), clients distil on it
with cross-entropy against those probabilities, and every client is evaluated on the test set each
round. It imports torch and NumPy only, and does not import fdlit.
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


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


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
    args = parser.parse_args(argv)
    start = time.process_time()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x, y = digits()
    perm = rng.permutation(len(y))
    n_test = int(0.2 * len(y))
    test, rest = perm[:n_test], perm[n_test:]
    public, pool = rest[:500], rest[500:]
    x_test, y_test, x_pub = x[test], y[test], x[public]
    pool_y = y[pool].numpy()
    clients = []
    for i in range(args.clients):
        classes = [(2 * i) % 10, (2 * i + 1 + i // 5) % 10]
        own = pool[np.isin(pool_y, classes)]
        n_cal = int(0.2 * len(own))  # a calibration share, held out as fdlit's digits default does
        train_rows = own[n_cal:]
        model = mlp()
        clients.append((model, torch.optim.Adam(model.parameters(), lr=1e-3), x[train_rows], y[train_rows]))
    accuracy = 0.0
    for r in range(1, args.rounds + 1):
        for model, opt, xi, yi in clients:
            train(model, opt, xi, yi, 20 if r == 1 else 5, 32)
        with torch.no_grad():
            for model, *_ in clients:
                model.eval()
            teacher = torch.stack([F.softmax(model(x_pub), -1) for model, *_ in clients]).mean(0)
        for model, opt, *_ in clients:
            train(model, opt, x_pub, teacher, 5, 32)
        with torch.no_grad():
            accuracy = float(np.mean([(model(x_test).argmax(-1) == y_test).float().mean().item()
                                      for model, *_ in clients]))
    cpu = time.process_time() - start
    print(f"plain FD loop: {args.rounds} rounds, {args.clients} clients, mean client accuracy {accuracy:.4f}, "
          f"{cpu:.2f} CPU s after imports")
    return {"accuracy": accuracy, "cpu_s": cpu}


if __name__ == "__main__":
    main()
