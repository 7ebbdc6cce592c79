"""Progress on stderr. On a terminal: a bar over rounds showing the current accuracy and one over the
clients of the phase running now (it advances as clients finish: per client, per chunk and epoch on
the vectorized executor, per Ray actor). Anywhere else (a file, a pipe, a batch job's log): one plain
line per round, with no escape codes or carriage returns."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Optional, TextIO

from tqdm.auto import tqdm

from fdlit.callbacks import FederationCallback, RoundView

SHOWN = (("acc", "after_public/global_acc_mean"), ("local", "after_private/local_acc_mean"), ("teacher", "teacher/acc"))


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stream-like object
        return False


def round_line(round: int, rounds: int, metrics: dict[str, Any], seconds: float) -> str:
    """``round 3/10: acc 0.512, local 0.901, teacher 0.834 (12.3 s)``; a round without evaluation says so."""
    shown = [f"{name} {metrics[key]:.3f}" for name, key in SHOWN
             if isinstance(metrics.get(key), (int, float)) and math.isfinite(metrics[key])]
    if not metrics.get("eval/test_samples", 1):
        shown = ["not evaluated this round"]
    return f"round {round}/{rounds}: {', '.join(shown) or 'no accuracy'} ({seconds:.1f} s)"


class ProgressBar(FederationCallback):
    def __init__(self, stream: Optional[TextIO] = None):
        self.stream = stream  # None: sys.stderr when the run starts
        self.rounds = None
        self.clients = None
        self.phase = None
        self.plain = False
        self.round_started = 0.0

    def on_fit_start(self, view: RoundView):
        stream = self.stream or sys.stderr
        self.plain = not is_terminal(stream)
        if self.plain:
            return
        self.rounds = tqdm(total=view.rounds, initial=view.round, desc="rounds", unit="round",
                           file=stream, dynamic_ncols=True)
        self.clients = tqdm(total=len(view.clients), desc="clients", unit="client", position=1, leave=False,
                            file=stream, dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.0f}/{total}")

    def on_round_start(self, view: RoundView, round):
        self.phase = None
        self.round_started = time.monotonic()

    def on_clients_progress(self, view: RoundView, phase, done, total):
        if self.clients is None:
            return
        if phase != self.phase:  # a new phase: the bar starts over
            self.phase = phase
            self.clients.reset(total=total)
            self.clients.set_description(f"round {view.round + 1} {phase}")
        self.clients.n = done
        self.clients.refresh()

    def on_round_end(self, view: RoundView, round, metrics):
        if self.plain:
            print(round_line(round, view.rounds, metrics, time.monotonic() - self.round_started),
                  file=self.stream or sys.stderr, flush=True)
            return
        if self.rounds is None:
            return
        if metrics.get("eval/test_samples", 1):  # rounds without evaluation keep the last figures
            self.rounds.set_postfix(
                acc=f"{metrics['after_public/global_acc_mean']:.3f}",
                local=f"{metrics['after_private/local_acc_mean']:.3f}",
                teacher=f"{metrics['teacher/acc']:.3f}",
            )
        self.rounds.update(1)

    def on_fit_end(self, view: RoundView, summary):
        for bar in (self.clients, self.rounds):
            if bar is not None:
                bar.close()
        self.clients = self.rounds = None
