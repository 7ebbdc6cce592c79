"""Time per round: fdlit's FederationLoop vs a plain PyTorch loop doing the same work.

    python benchmarks/round_time.py [--model mlp|cnn] [--rounds 6] [--repeats 3] [--clients 10] [--k 2]

Same data split, same client networks (MLP or SmallCNN), same optimizer steps (same batch sizes and epochs per
phase), the same evaluations (test-set inference after each phase, public inference) and the same
AVG aggregation. Round 1 (longer first-round epochs) is excluded; the ratio is on steady-state
rounds. A third variant runs each client's phases through a fresh ``lightning.Trainer`` (what a
Trainer-per-phase design would cost). Prints one table of seconds per round and ratios to plain.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import lightning as L
import torch
import torch.nn.functional as F

from fdlit.callbacks import FederationCallback
from fdlit.clients import ClientModule, ClientOptimization
from fdlit.data import FederatedData
from fdlit.execution import SequentialExecutor
from fdlit.federation import FederationLoop
from fdlit.methods import ProbabilityAveraging
from fdlit.models import MLP, SmallCNN

warnings.filterwarnings("ignore")
MODELS = {"mlp": MLP, "cnn": SmallCNN}
EPOCHS = dict(private_epochs_first=5, private_epochs=5, public_epochs_first=2, public_epochs=2)
BATCH = 32


def make_data(args) -> FederatedData:
    return FederatedData(num_clients=args.clients, classes_per_client=args.k).setup(args.seed)


def plain_round_times(args, trainer: bool = False) -> list[float]:
    data = make_data(args)
    torch.manual_seed(args.seed)
    models = [MODELS[args.model](data.input_shape, data.num_classes) for _ in data.clients]
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in models]
    gens = [torch.Generator().manual_seed(i) for i in range(len(models))]
    test_x, pub_x, test_y = data.test.x, data.public.x, data.test.y
    local = torch.stack([torch.isin(test_y, torch.tensor(c.classes)) for c in data.clients]).float()

    def accuracies():  # what fdlit logs: global and local micro accuracy of every client
        correct = (predict(test_x).argmax(-1) == test_y).float()
        return correct.mean(1), (correct * local).sum(1) / local.sum(1)

    def train(i, x, t, epochs):
        m, opt = models[i], opts[i]
        m.train()
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=gens[i])
            for s in range(0, len(x), BATCH):
                idx = order[s : s + BATCH]
                if len(idx) < 2:
                    continue
                loss = F.cross_entropy(m(x[idx]), t[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

    def train_with_trainer(i, x, t, epochs):
        client = ClientModule(models[i], i, [], ClientOptimization(batch_size=BATCH))
        client._optimizer = opts[i]
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, t), batch_size=BATCH, shuffle=True)
        L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False).fit(client, loader)

    @torch.inference_mode()
    def predict(x):
        out = []
        for m in models:
            m.eval()
            out.append(m(x))
        return torch.stack(out)

    step = train_with_trainer if trainer else train
    times = []
    for r in range(1, args.rounds + 1):
        t0 = time.perf_counter()
        first = r == 1
        for i, c in enumerate(data.clients):
            step(i, c.train.x, c.train.y, EPOCHS["private_epochs_first" if first else "private_epochs"])
        z = predict(pub_x)
        accuracies()
        teacher = z.softmax(-1).mean(0)
        for i in range(len(models)):
            step(i, pub_x, teacher, EPOCHS["public_epochs_first" if first else "public_epochs"])
        accuracies()
        times.append(time.perf_counter() - t0)
    return times[1:]


def fdlit_round_times(args) -> list[float]:
    stamps: list[float] = []

    class RoundClock(FederationCallback):
        # user callbacks run after fdlit's own (aggregator, run directory, W&B, progress), so the gap
        # between two round ends covers a whole round, every hook included
        def on_round_end(self, loop, round, metrics):
            stamps.append(time.perf_counter())

    # one client at a time, like the plain loop: this measures the loop's own overhead (the
    # default executor would vectorize; benchmarks/executors.py compares executors)
    loop = FederationLoop(
        rounds=args.rounds, **EPOCHS, callbacks=[RoundClock()], data=make_data(args),
        executor=SequentialExecutor(),
        model={"class_path": f"fdlit.models.{MODELS[args.model].__name__}"},
        aggregator=ProbabilityAveraging(), client=ClientOptimization(batch_size=BATCH), seed=args.seed,
    )
    loop.fit()
    return [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run_dir", default="/tmp/fdlit-bench-runs")
    p.add_argument("--no_trainer", action="store_true", help="skip the Trainer-per-phase variant")
    args = p.parse_args()
    results: dict[str, list[float]] = {"plain PyTorch": [], "fdlit": [], "Trainer per phase": []}
    for _ in range(args.repeats):  # interleaved so drift hits every variant alike
        results["plain PyTorch"] += plain_round_times(args)
        results["fdlit"] += fdlit_round_times(args)
        if not args.no_trainer:
            results["Trainer per phase"] += plain_round_times(args, trainer=True)
    base = statistics.median(results["plain PyTorch"])
    print(f"digits, {args.model}, {args.clients} clients, k={args.k}, torch threads={torch.get_num_threads()}, "
          f"median of {args.repeats}x{args.rounds - 1} steady-state rounds")
    print("| variant | s / round | ratio to plain |")
    print("|---|---|---|")
    for name, ts in results.items():
        if ts:
            med = statistics.median(ts)
            print(f"| {name} | {med:.3f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
