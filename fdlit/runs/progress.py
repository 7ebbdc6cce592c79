"""A progress bar over rounds showing the current accuracy."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

from fdlit.callbacks import FederationCallback


class ProgressBar(FederationCallback):
    def __init__(self):
        self.rounds = None

    def on_fit_start(self, loop):
        self.rounds = tqdm(total=loop.rounds, initial=loop.round, desc="rounds", unit="round",
                           file=sys.stderr, dynamic_ncols=True)

    def on_round_end(self, loop, round, metrics):
        if metrics.get("eval/test_samples", 1):  # rounds without evaluation keep the last figures
            self.rounds.set_postfix(
                acc=f"{metrics['after_public/global_acc_mean']:.3f}",
                local=f"{metrics['after_private/local_acc_mean']:.3f}",
                teacher=f"{metrics['teacher/acc']:.3f}",
            )
        self.rounds.update(1)

    def on_fit_end(self, loop, summary):
        if self.rounds is not None:
            self.rounds.close()
