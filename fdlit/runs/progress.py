"""Progress bars: one over rounds showing the current accuracy, one over the clients of the phase
running now (it advances as clients finish: per client, per chunk and epoch on the vectorized
executor, per Ray actor)."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

from fdlit.callbacks import FederationCallback


class ProgressBar(FederationCallback):
    def __init__(self):
        self.rounds = None
        self.clients = None
        self.phase = None

    def on_fit_start(self, loop):
        self.rounds = tqdm(total=loop.rounds, initial=loop.round, desc="rounds", unit="round",
                           file=sys.stderr, dynamic_ncols=True)
        self.clients = tqdm(total=len(loop.clients), desc="clients", unit="client", position=1, leave=False,
                            file=sys.stderr, dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.0f}/{total}")

    def on_round_start(self, loop, round):
        self.phase = None

    def on_clients_progress(self, loop, phase, done, total):
        if self.clients is None:
            return
        if phase != self.phase:  # a new phase: the bar starts over
            self.phase = phase
            self.clients.reset(total=total)
            self.clients.set_description(f"round {loop.round + 1} {phase}")
        self.clients.n = done
        self.clients.refresh()

    def on_round_end(self, loop, round, metrics):
        if metrics.get("eval/test_samples", 1):  # rounds without evaluation keep the last figures
            self.rounds.set_postfix(
                acc=f"{metrics['after_public/global_acc_mean']:.3f}",
                local=f"{metrics['after_private/local_acc_mean']:.3f}",
                teacher=f"{metrics['teacher/acc']:.3f}",
            )
        self.rounds.update(1)

    def on_fit_end(self, loop, summary):
        for bar in (self.clients, self.rounds):
            if bar is not None:
                bar.close()
        self.clients = self.rounds = None
