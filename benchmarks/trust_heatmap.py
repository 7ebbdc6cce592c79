"""The who-to-trust heatmap's share of a round's time with W&B on, at many clients.

    PYTHONPATH=. python benchmarks/trust_heatmap.py [--clients 470] [--rounds 2] [--every 5] [FIT FLAGS ...]
    (at 470 clients digits leaves room for --data.public_size 20 at most)

Runs the shipped digits config (the same path as ``fdlit fit``; W&B disabled, so the run's own
rounds are not slowed) with a callback that keeps each round's metrics and time. Then builds the W&B
payload of every round (``wandb_round_payload`` with a real ``wandb.Image``, nothing uploaded) two
ways: every round with one row per client (what W&B logging did before ``logger.trust_every_n_rounds``
and ``logger.trust_max_rows``), and as the logger does now (round 1, every ``--every``-th, the last;
one row per class above ``logger.trust_max_rows`` clients). The share is the payload's mean cost per
round over the mean time of the rounds after round 1 (round 1 has the longer first-round epochs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

from fdlit.callbacks import FederationCallback
from fdlit.configuration.schema import parse_fit
from fdlit.runs.dashboards import TRUST_MAX_ROWS, png_to_array, trust_heatmap_png, wandb_round_payload
from fdlit.runs.experiment import Experiment

warnings.filterwarnings("ignore")


class Keep(FederationCallback):
    def __init__(self):
        self.metrics, self.seconds, self.start = [], [], 0.0

    def on_round_start(self, loop, round):
        self.start = time.perf_counter()

    def on_round_end(self, loop, round, metrics):
        self.seconds.append(time.perf_counter() - self.start)
        self.metrics.append(dict(metrics))


def logged_rounds(rounds: int, every: int) -> list[int]:
    """The rounds the W&B logger renders the heatmap in (round 1, every n-th, the last)."""
    return [r for r in range(1, rounds + 1) if every > 0 and (r == 1 or r % every == 0 or r == rounds)]


def seconds(wandb, metrics, classes, trust: bool, max_rows: int, repeats: int = 2) -> float:
    """The best of ``repeats`` timings of one round's payload (the machine is shared)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        wandb_round_payload(wandb, metrics, classes, trust, max_rows)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=470)  # digits allows at most 479
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--every", type=int, default=5, help="logger.trust_every_n_rounds")
    parser.add_argument("--steady_rounds", type=int, default=20,
                        help="rounds of a run the amortized cost is computed over (the shipped config's 20)")
    args, fit_flags = parser.parse_known_args()
    import wandb

    _, cfg = parse_fit(["--config", "digits.yaml", "--logger.mode", "disabled", "--logger.progress", "false",
                        "--logger.run_dir", "/tmp/fdlit-bench-runs", "--data.num_clients", str(args.clients),
                        "--federation.rounds", str(args.rounds), *fit_flags])
    experiment = Experiment(cfg)
    keep = Keep()
    experiment.loop.callbacks.append(keep)
    experiment.fit()
    classes = [cd.classes for cd in experiment.loop.view.client_data]
    round_s = statistics.mean(keep.seconds[1:] or keep.seconds)
    # over a whole run of --steady_rounds rounds: the heatmap rounds cost `with`, the others `plain`
    m = keep.metrics[-1]
    plain = seconds(wandb, m, classes, False, TRUST_MAX_ROWS)
    full = seconds(wandb, m, classes, True, 10**9, repeats=1)  # one row per client: slow at many clients
    capped = seconds(wandb, m, classes, True, TRUST_MAX_ROWS)
    n, k = args.steady_rounds, len(logged_rounds(args.steady_rounds, args.every))
    old_px = png_to_array(trust_heatmap_png(m["clients/trust_matrix"], "", classes, max_rows=10**9)).shape
    new_px = png_to_array(trust_heatmap_png(m["clients/trust_matrix"], "", classes)).shape
    print(f"M = {args.clients}: round {round_s:.2f} s (mean of rounds 2..{args.rounds}); W&B payload without "
          f"heatmap {plain:.3f} s; {k} of {n} rounds render it", file=sys.stderr)
    print("| heatmap | per rendered round s | mean per round s | share of a round | image px |")
    print("|---|---|---|---|---|")
    for label, per, mean, px in (
            ("every round, one row per client", full, full, old_px),
            (f"every {args.every} rounds, one row per class above {TRUST_MAX_ROWS} clients", capped,
             (k * capped + (n - k) * plain) / n, new_px)):
        print(f"| {label} | {per:.3f} | {mean:.3f} | {100 * mean / round_s:.1f} % | {px[1]} x {px[0]} |")

if __name__ == "__main__":
    main()
