"""A progress bar over rounds (and over clients within a round) showing current accuracy."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

from fdlit.callbacks import FederationCallback


class ProgressBar(FederationCallback):
    def __init__(self):
        self.rounds = self.clients = None

    def on_fit_start(self, loop):
        self.rounds = tqdm(total=loop.rounds, initial=loop.round, desc="rounds", unit="round",
                           file=sys.stderr, dynamic_ncols=True)

    def on_round_start(self, loop, round):
        self.clients = tqdm(total=len(loop.clients), desc=f"round {round} clients", unit="client",
                            leave=False, file=sys.stderr, dynamic_ncols=True)

    def on_client_private_end(self, loop, client, data, public_logits):
        if self.clients is not None:
            self.clients.update(1)
        return None

    def on_round_end(self, loop, round, metrics):
        if self.clients is not None:
            self.clients.close()
        self.rounds.set_postfix(
            acc=f"{metrics['after_public/global_acc_mean']:.3f}",
            local=f"{metrics['after_private/local_acc_mean']:.3f}",
            teacher=f"{metrics['teacher/acc']:.3f}",
        )
        self.rounds.update(1)

    def on_fit_end(self, loop, summary):
        if self.rounds is not None:
            self.rounds.close()
