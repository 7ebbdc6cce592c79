"""What one secure aggregation costs as the federation grows (docs/privacy.md, "Secure aggregation").

    python benchmarks/secure_aggregation.py [--clients 10 20 50] [--entries 5000] [--dropout 0.1] [--repeats 3]

For n clients, each with a vector of ``entries`` numbers (digits: N = 500 public samples x C = 10
classes), a fraction ``dropout`` dropping after the key exchange: the protocol's seconds in one
process (all clients and the server; the median of ``repeats``, CPU-noisy), and the bytes one client
sends and receives, against the plain float32 upload. Every client agrees a key with every other
and expands a mask for each, so the compute grows as n^2 (n per client).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import numpy as np

from fdlit.privacy.secure_sum import encode, scale_bits, secure_sum


def one(n: int, entries: int, dropout: float, seed: int) -> tuple[float, dict[str, int]]:
    rng = np.random.default_rng(seed)
    bits = scale_bits(1.0, n)
    dropped = set(rng.choice(n, int(dropout * n), replace=False).tolist())
    vectors = {u: encode(rng.uniform(0, 1, entries), 1.0, bits) for u in range(n) if u not in dropped}
    sent: dict[str, int] = defaultdict(int)

    def count(client, direction, kind, array):
        if client == min(vectors):  # one surviving client's traffic
            sent[direction] += array.nbytes

    start = time.perf_counter()
    total, _ = secure_sum(list(range(n)), vectors, count)
    assert total is not None
    return time.perf_counter() - start, dict(sent)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, nargs="+", default=[10, 20, 50])
    p.add_argument("--entries", type=int, default=5000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print("| clients | seconds per aggregation | KiB up per client | KiB down per client | plain float32 upload KiB |")
    print("|---|---|---|---|---|")
    for n in a.clients:
        runs = [one(n, a.entries, a.dropout, seed) for seed in range(a.repeats)]
        seconds = statistics.median(s for s, _ in runs)
        up, down = runs[0][1]["up"] / 1024, runs[0][1]["down"] / 1024
        print(f"| {n} | {seconds:.2f} | {up:.1f} | {down:.1f} | {4 * a.entries / 1024:.1f} |", flush=True)


if __name__ == "__main__":
    main()
