"""What the framework's check of a method's result costs against the aggregation it checks.

    python benchmarks/result_checks.py [--repeats 20]

For AVG and sUWA at three shapes (digits: M = 20 clients, N = 500 public samples, C = 10; Fashion-MNIST:
20 x 2,000 x 10; CIFAR-100: 20 x 5,000 x 100) on synthetic logits, the median time of the rule's
``aggregate`` and of ``fdlit.federation.result_checks.check_result`` on its result, in this one
process, and their ratio. The check runs after every aggregation of every run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fdlit.federation.result_checks import check_result
from fdlit.methods import ProbabilityAveraging, SmoothedUncertaintyWeighted
from fdlit.methods.base import FederationInfo, ServerContext

SHAPES = {"digits": (20, 500, 10), "fashion-mnist": (20, 2000, 10), "cifar-100": (20, 5000, 100)}


def median_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{'shape':<14} {'rule':<6} {'aggregate ms':>13} {'check ms':>9} {'check/aggregate':>16}")
    for name, (m, n, c) in SHAPES.items():
        z = 3 * torch.randn(m, n, c)
        info = FederationInfo(round=1, seed=0, num_clients=m, num_classes=c, public_x=torch.zeros(n, 1))
        ctx = ServerContext(info=info)
        uploads = [{"logits": z[i]} for i in range(m)]
        for label, rule in (("AVG", ProbabilityAveraging()), ("sUWA", SmoothedUncertaintyWeighted())):
            if isinstance(rule, SmoothedUncertaintyWeighted):
                uploads = density_uploads(z)
            result = rule.aggregate(uploads, ctx)
            agg = median_s(lambda r=rule, u=uploads, x=ctx: r.aggregate(u, x), args.repeats)
            chk = median_s(lambda r=rule, res=result, s=(m, n, c): check_result(r, res, *s), args.repeats)
            print(f"{name:<14} {label:<6} {agg * 1e3:>13.3f} {chk * 1e3:>9.3f} {chk / agg:>16.3f}")


def density_uploads(z):
    """sUWA's uploads: the logits and each client's Gaussian components (one per class, unit std)."""
    c = z.shape[-1]
    return [{"logits": z[i], "gmm_means": 5 * torch.eye(c), "gmm_stds": torch.ones(c, c),
             "gmm_classes": torch.arange(c)} for i in range(len(z))]


if __name__ == "__main__":
    main()
