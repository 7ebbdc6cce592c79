"""Training throughput of the vectorized executor as a share of the single-thread matmul peak.

    python benchmarks/matmul_peak.py [--config configs/digits.yaml] [--rounds 3] [--repeats 3]

Peak: the batched matmuls of one training step alone (forward and both backward products of every
linear layer, stacked over the M clients as the vectorized step stacks them: ``torch.bmm`` on
M x batch x in by M x in x out), timed in a loop. Achieved: the same matmul FLOPs, counted per real
training sample (6 x in x out per linear layer and sample), divided by the CPU seconds of the
executor's ``train`` calls in rounds 2 to ``--rounds`` of the config (W&B disabled; glibc's allocator
set as ``fdlit fit`` sets it). One thread. The
model must be an MLP (linear layers only; the FLOP count ignores activations, the loss and the
optimizer, which the share therefore includes as overhead).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def linear_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)]


def peak_flops(shapes: list[tuple[int, int]], clients: int, batch: int, repeats: int = 200) -> float:
    """FLOP/s of the step's batched matmuls alone."""
    g = torch.Generator().manual_seed(0)
    ops = [(torch.randn(clients, batch, i, generator=g), torch.randn(clients, i, o, generator=g),
            torch.randn(clients, batch, o, generator=g)) for i, o in shapes]
    flops = sum(6 * clients * batch * i * o for i, o in shapes)

    def step():
        for x, w, gy in ops:
            torch.bmm(x, w)  # forward
            torch.bmm(gy, w.transpose(1, 2))  # input gradient
            torch.bmm(x.transpose(1, 2), gy)  # weight gradient

    for _ in range(10):
        step()
    start = time.process_time()
    for _ in range(repeats):
        step()
    return flops * repeats / (time.process_time() - start)


def achieved_flops(config: str, rounds: int) -> tuple[float, list[tuple[int, int]], int, int]:
    from fdlit.configuration.schema import parse_fit
    from fdlit.runs.experiment import Experiment

    parser, cfg = parse_fit(["--config", config, "--federation.rounds", str(rounds), "--logger.mode", "disabled",
                             "--logger.progress", "false", "--logger.run_dir", tempfile.mkdtemp()])
    experiment = Experiment(cfg, parser)
    experiment.setup()
    loop = experiment.loop
    shapes = linear_shapes(loop.view.clients[0].model)
    per_sample = sum(6 * i * o for i, o in shapes)
    executor, train = loop.settings.executor, loop.settings.executor.train
    spent, samples = [0.0], [0]

    def timed(clients, phase, datasets, epochs, batch_size):
        start = time.process_time()
        out = train(clients, phase, datasets, epochs, batch_size)
        if loop.round >= 1:  # rounds 2..: steady state (round 1 pays one-time imports and caches)
            spent[0] += time.process_time() - start
            samples[0] += epochs * sum(len(x) for x, _ in datasets)
        return out

    executor.train = timed
    experiment.fit()
    return samples[0] * per_sample / spent[0], shapes, len(loop.view.clients), loop.optimization.batch_size


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/digits.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 1 is not counted)")
    torch.set_num_threads(1)
    from fdlit.execution.allocator import keep_large_blocks

    keep_large_blocks()  # as `fdlit fit` does
    shares = []
    for _ in range(args.repeats):  # interleaved: load on a shared machine hits both alike
        achieved, shapes, clients, batch = achieved_flops(args.config, args.rounds)
        peak = peak_flops(shapes, clients, batch)
        shares.append(achieved / peak)
        print(f"training {achieved / 1e9:.2f} GFLOP/s, peak {peak / 1e9:.2f} GFLOP/s: {achieved / peak:.0%}")
    share = statistics.median(shares)
    print(f"median share of the matmul peak: {share:.0%} ({args.config}, {args.rounds} rounds, one thread)")
    return share


if __name__ == "__main__":
    main()
