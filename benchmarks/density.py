"""UWA / sUWA density on the server: the ``matmul`` form against the ``direct`` float64 form.

    python benchmarks/density.py [--clients 20] [--public 5000] [--components 90] [--classes 100] [--repeats 3]

Defaults are the CIFAR-100 shape at k = 90 (M = 20 clients, N = 5,000 public samples, K = 90
components of dimension C = 100). Inputs are synthetic logits shaped like a trained network's: each
client's components have means ~ 10 x one-hot(class) + N(0, 2) and per-dimension variances
log-uniform in [1e-4, 10] (so some sit at the variance floor), and public logits are drawn around
the components of random classes, a tenth of them far out (|z| ~ 100). Both forms run on the same
inputs in this one process; the table gives the median time of each, the speed-up, and the largest
|l_matmul - l_direct| / (1 + |l_direct|) (the tolerance ``mixture_log_likelihood`` documents).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fdlit.methods.density import mixture_log_likelihood


def synthetic(m: int, n: int, k: int, c: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    classes = torch.stack([torch.randperm(c, generator=g)[:k] for _ in range(m)])  # M x K
    means = 10 * torch.nn.functional.one_hot(classes, c).double() + 2 * torch.randn(m, k, c, generator=g,
                                                                                     dtype=torch.float64)
    variances = torch.exp(torch.empty(m, k, c, dtype=torch.float64).uniform_(
        torch.log(torch.tensor(1e-4)).item(), torch.log(torch.tensor(10.0)).item(), generator=g))
    pick_client = torch.randint(m, (n,), generator=g)
    pick_comp = torch.randint(k, (n,), generator=g)
    centre = means[pick_client, pick_comp]  # N x C
    z = centre + 1.5 * torch.randn(m, n, c, generator=g, dtype=torch.float64)
    far = torch.rand(n, generator=g) < 0.1
    z[:, far] *= 10
    valid = torch.ones(m, k, dtype=torch.bool)
    return z.float(), means, variances, valid


def timed(fn, repeats: int) -> tuple[float, torch.Tensor]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--public", type=int, default=5000)
    p.add_argument("--components", type=int, default=90)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--direct_repeats", type=int, default=1, help="the direct form is slow: one run by default")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    z, means, variances, valid = synthetic(args.clients, args.public, args.components, args.classes)
    t_matmul, fast = timed(lambda: mixture_log_likelihood(z, means, variances, valid, "matmul"), args.repeats)
    t_direct, ref = timed(lambda: mixture_log_likelihood(z, means, variances, valid, "direct"), args.direct_repeats)
    again = mixture_log_likelihood(z, means, variances, valid, "matmul")
    err = float(((fast - ref).abs() / (1 + ref.abs())).max())
    print(f"M={args.clients}, N={args.public}, K={args.components}, C={args.classes}, torch threads="
          f"{torch.get_num_threads()}, median of {args.repeats} (matmul) / {args.direct_repeats} (direct) runs")
    print("| form | s | speed-up | max abs(l - l_direct) / (1 + abs(l_direct)) | same result run to run |")
    print("|---|---|---|---|---|")
    print(f"| direct | {t_direct:.3f} | 1.0x | 0 | - |")
    print(f"| matmul | {t_matmul:.3f} | {t_direct / t_matmul:.1f}x | {err:.1e} | {bool(torch.equal(fast, again))} |")


if __name__ == "__main__":
    main()
